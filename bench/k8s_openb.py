"""The full openb mix on a real control plane: how many pods kubecell and the stock kube-scheduler place.

Starts a testbed of the openb cluster (1,523 nodes from ``../shared/data/alibaba-gpu-v2023-openb``, see
its SOURCE.md) with the stock kube-scheduler, then replays the packing protocol's seeded arrivals of the
openb pod list (inflated to 130 % of GPU capacity, one pod at a time, a pod that does not fit deleted)
twice on the same nodes: with ``schedulerName: default-scheduler`` (Kubernetes can only give a share a
whole ``nvidia.com/gpu``; GPU models become required node affinity on the GFD product label) and with
kubecell (shares as ``kubecell.io/gpu-milli``, its default placement policy, the simulator's typical
pods and tie-break order). Prints pods placed, pods refused, unallocated GPU % at 100 % arrived, and
``kubecell sim packing`` for the same seed beside the kubecell run (the simulator-parity check at scale).

    python bench/k8s_openb.py [--pods ../shared/data/alibaba-gpu-v2023-openb/csv/openb_pod_list_default.csv]
                              [--seed 42] [--limit N]

Needs Go for the first testbed build (cached afterwards) and the openb data (skips without it).
Loopback only; everything is stopped at the end. Takes about half an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kubecell.core.placement.registry import DEFAULT_POLICY
from kubecell.kube.rest import Kube
from kubecell.sim.packing.experiment import RunRecord, run_packing
from kubecell.sim.packing.metrics import ARRIVED_PCT, curves_of
from kubecell.sim.traces.openb import load_nodes, load_pods
from kubecell.testbed import testbed
from kubecell.testbed.replay import KUBECELL, ReplayPlan, own_scheduler, plan, replay

DATA = Path("../shared/data/alibaba-gpu-v2023-openb/csv")


def unallocated_at(record: RunRecord, pct: int) -> float:
    curve = curves_of(record)
    return float(curve.unallocated_pct[int(np.searchsorted(ARRIVED_PCT, pct))])


def run(kube: Kube, run_plan: ReplayPlan, scheduler: str, namespace: str) -> tuple[RunRecord, float]:
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if done % 1000 == 0:
            print(f"  {scheduler}: {done}/{total} pods, {time.perf_counter() - started:.0f} s", file=sys.stderr)

    own = own_scheduler(kube, run_plan.scheduler_options(DEFAULT_POLICY)) if scheduler == KUBECELL else None
    with own if own is not None else contextlib.nullcontext():
        started = time.perf_counter()
        record = replay(kube, run_plan, namespace=namespace, scheduler=scheduler, policy=scheduler,
                        progress=progress)
    return record, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--limit", type=int, default=None, help="Replay only the first N arrivals (a quick look).")
    args = parser.parse_args()
    node_csv = DATA / "openb_node_list_gpu_node.csv"
    if not node_csv.is_file() or not args.pods.is_file():
        print(f"skipped: the openb trace is not at {DATA} (see the repository README for ../shared/data)")
        return
    nodes, pods = load_nodes(node_csv), load_pods(args.pods)
    run_plan = plan(nodes, pods, args.seed)
    if args.limit is not None:
        run_plan = ReplayPlan(run_plan.nodes, run_plan.sequence[:args.limit], run_plan.tie_ranks, run_plan.typical,
                              run_plan.seed, run_plan.cluster_gpu_milli)
    results: dict[str, tuple[RunRecord, float]] = {}
    with tempfile.TemporaryDirectory(prefix="kubecell-bench-") as scratch:
        state = testbed.up("openb", directory=Path(scratch), kube_scheduler=True,
                           log=lambda line: print(line, file=sys.stderr)).state
        kube = Kube.from_kubeconfig(state.admin_kubeconfig)
        try:
            for scheduler in ("default-scheduler", "kubecell"):
                namespace = f"openb-{scheduler}"
                results[scheduler] = run(kube, run_plan, scheduler, namespace)
                testbed.clear_pods(kube, namespace, timeout=600)
        finally:
            kube.close()
            testbed.down(Path(scratch))
    simulated = run_packing(list(run_plan.nodes), pods, DEFAULT_POLICY, args.seed)
    print(f"openb: {len(nodes)} nodes, {run_plan.cluster_gpu_milli // 1000} GPUs; {len(run_plan.sequence)} arrivals "
          f"(seed {args.seed}, inflated to 130 % of GPU capacity), one at a time")
    print(f"{'run':32} {'placed':>7} {'refused':>8} {'unalloc% @100':>14} {'pods/s':>7}")
    for scheduler, (record, seconds) in results.items():
        value = unallocated_at(record, 100)
        shown = "n/a" if math.isnan(value) else f"{value:.2f}"
        print(f"{scheduler:32} {record.placed:7d} {record.failed:8d} {shown:>14} "
              f"{len(run_plan.sequence) / seconds:7.1f}")
    print(f"{'simulator (' + DEFAULT_POLICY + ')':32} {simulated.placed:7d} {simulated.failed:8d} "
          f"{unallocated_at(simulated, 100):14.2f}")
    base, mine = results["default-scheduler"][0], results["kubecell"][0]
    print(f"kubecell places {mine.placed - base.placed:+d} pods ({mine.placed / max(base.placed, 1):.2f}x) "
          f"against kube-scheduler on the same nodes and arrivals")


if __name__ == "__main__":
    main()
