"""``kubecell replay``: the packing experiment's arrivals as real Pods on a cluster, beside the simulator."""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from kubecell.cli.output import check_out_dir, prepare_out_dir, stdout_console
from kubecell.core.errors import InvalidInputError
from kubecell.core.placement.registry import DEFAULT_POLICY, canonical_policy_name
from kubecell.kube.rest import ApiError, Kube
from kubecell.sim.packing.experiment import run_packing
from kubecell.sim.packing.metrics import ARRIVED_PCT, RunCurves, curves_of
from kubecell.sim.packing.runner import check_inflate
from kubecell.sim.traces.openb import load_nodes, load_pods
from kubecell.testbed.replay import KUBECELL, own_scheduler, plan, replay


def replay_command(
    kubeconfig: Annotated[Path, typer.Option(help="Kubeconfig of the cluster (e.g. the testbed's admin one).")],
    nodes: Annotated[Path, typer.Option(help="The node list CSV the cluster was made from (openb format).")],
    pods: Annotated[Path, typer.Option(help="Pod list CSV (openb format).")],
    out: Annotated[Path, typer.Option(help="Report directory.")] = Path("kubecell-replay"),
    scheduler: Annotated[str, typer.Option(help="schedulerName of the pods: 'kubecell' runs kubecell's scheduler "
                                           "in this process with the run's options; any other name replays "
                                           "against the scheduler already running there.")] = "kubecell",
    placement: Annotated[str, typer.Option(help="Placement policy (kubecell's scheduler and the simulator).")] = (
        DEFAULT_POLICY),
    seed: Annotated[int, typer.Option(help="Seed of the shuffle, the inflation and the tie-break order.", min=0)] = 42,
    inflate: Annotated[float, typer.Option(help="Inflate the workload to this share of GPU capacity.")] = 1.3,
    namespace: Annotated[str, typer.Option(help="Namespace the pods are created in (created if missing).")] = (
        "kubecell-replay"),
) -> None:
    """Replay a pod list on a real cluster, one pod at a time, and compare with `kubecell sim packing`."""
    placement = canonical_policy_name(placement, field="placement")
    inflate = check_inflate(inflate)
    check_out_dir(out)
    node_list, pod_list = load_nodes(nodes), load_pods(pods)
    prepare_out_dir(out)
    run = plan(node_list, pod_list, seed, inflate)
    kube = Kube.from_kubeconfig(kubeconfig)
    try:
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except ApiError as error:
        if not error.conflict:
            raise
    if kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        raise InvalidInputError(f"namespace {namespace} already has pods", field="namespace",
                                accepted="an empty namespace (a replay counts every pod it creates)")
    started = time.perf_counter()
    with own_scheduler(kube, run.scheduler_options(placement)) if scheduler == KUBECELL else contextlib.nullcontext():
        real = replay(kube, run, namespace=namespace, scheduler=scheduler, policy=f"{scheduler}:{placement}")
    wall = time.perf_counter() - started
    simulated = run_packing(node_list, pod_list, placement, seed, inflate=inflate)
    real_curve, sim_curve = curves_of(real), curves_of(simulated)
    summary = {
        "scheduler": scheduler, "placement": placement, "seed": seed, "inflate": inflate, "pods": len(run.sequence),
        "cluster": {"failed": real.failed, "unallocated_pct_100": _at(real_curve, 100),
                    "unallocated_pct_130": _at(real_curve, 130)},
        "simulator": {"failed": simulated.failed, "unallocated_pct_100": _at(sim_curve, 100),
                      "unallocated_pct_130": _at(sim_curve, 130)},
        "pods_per_second": round(len(run.sequence) / wall, 1), "wall_seconds": round(wall, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console = stdout_console()
    console.print(json.dumps(summary, indent=2), highlight=False)
    console.print(f"results in {out}/summary.json", soft_wrap=True)


def _at(curve: RunCurves, pct: int) -> float | None:
    """Unallocated GPU % once arrivals reach ``pct`` % of capacity (None where the run never got there)."""
    value = float(curve.unallocated_pct[int(np.searchsorted(ARRIVED_PCT, pct))])
    return None if math.isnan(value) else round(value, 2)
