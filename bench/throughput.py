"""Placement throughput on large synthetic clusters, and the wall time of full 10-seed FGD and kubecell runs.

For clusters of 1,000, 5,000 and 20,000 nodes x 8 GPUs (96 vCPU, 384 GiB each, like openb's commonest
machine), the cluster is first filled to ~50 % of its GPUs with random placements (untimed). Then each
timed step places one request drawn from the openb request mix with the policy under test and commits
it, and releases one earlier allocation, so the load stays level and caches see real churn. Printed:
decisions per second for FGD, kubecell's policy and BestFit (and kubecell's cost per decision as a
multiple of FGD's, measured in the same process), the ratio to kube-scheduler's own throughput floor for pods
with extended resources at 5,000 nodes (180 pods/s, scheduler_perf), and the ratio to a straightforward
per-node, per-GPU Python FGD measured in the same process.

    python bench/throughput.py [--sizes 1000,5000,20000] [--decisions 2000] [--skip-full-run]

The request mix is the openb default pod list when ../shared/data is present, else the bundled example.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.model import Node, Request, make_node
from kubecell.core.placement.frag import TypicalPod
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.registry import PolicyContext, make_policy
from kubecell.sim.packing.experiment import typical_pods_of
from kubecell.sim.packing.runner import run_grid
from kubecell.sim.traces.openb import TracePod, load_pods

ROOT = Path(__file__).resolve().parent.parent
OPENB = ROOT / ".." / "shared" / "data" / "alibaba-gpu-v2023-openb" / "csv"
KUBE_SCHEDULER_FLOOR = 180.0  # pods/s, scheduler_perf threshold for extended-resource pods at 5,000 nodes


def request_mix() -> tuple[list[TracePod], str]:
    default = OPENB / "openb_pod_list_default.csv"
    if default.is_file():
        return load_pods(default), "openb default pod list"
    example = ROOT / "src" / "kubecell" / "sim" / "examples" / "pods.csv"
    return load_pods(example), "bundled example (../shared/data absent)"


def synthetic_cluster(size: int) -> list[Node]:
    return [make_node(f"node-{i:05d}", cpu_milli=96_000, memory_mib=393_216, gpu_count=8, gpu_model="G2")
            for i in range(size)]


def prefill(book: AllocationBook, pods: list[TracePod], rng: np.random.Generator, target: float) -> list[str]:
    """Fill to ``target`` of GPU capacity with random placements; returns the allocation names."""
    placer = Placer(book, make_policy("random"), rng=rng)
    names: list[str] = []
    goal = target * book.total_gpu_milli
    allocated = 0
    misses = 0
    while allocated < goal and misses < 1000:
        pod = pods[int(rng.integers(len(pods)))]
        request = pod.request(f"fill-{len(names)}")
        if placer.place_and_commit(request) is None:
            misses += 1
            continue
        names.append(request.name)
        allocated += pod.total_gpu_milli
    return names


def naive_fgd_choice(book: AllocationBook, typical: list[TypicalPod], request: Request) -> int:
    """The FGD rule written the obvious way: Python loops over nodes, GPUs and typical pods."""

    def fragment(cpu: int, free: list[int], model: str) -> float:
        total = sum(free)
        value = 0.0
        for t in typical:
            shape = t.shape
            allowed = shape.gpu_models
            fits = [f for f in free if f >= shape.gpu_milli]
            if (shape.gpu_milli == 0 or (allowed is not None and model not in allowed) or cpu < shape.cpu_milli
                    or len(fits) < shape.gpu_count):
                value += t.share * total
            else:
                value += t.share * sum(f for f in free if f < shape.gpu_milli)
        return value

    best, best_node = -1, -1
    for node in range(book.size):
        cpu = int(book.cpu_free[node])
        if cpu < request.cpu_milli or book.mem_free[node] < request.memory_mib:
            continue
        free = [int(x) for x in book.gpu_avail[node][: int(book.gpu_count[node])]]
        model = book.model_names[int(book.model_id[node])]
        before = fragment(cpu, free, model)
        for g, f in enumerate(free):
            if f < request.gpu_milli:
                continue
            after_free = free.copy()
            after_free[g] -= request.gpu_milli
            delta = before - fragment(cpu - request.cpu_milli, after_free, model)
            score = int(100.0 / (1.0 + math.exp(-delta / 1000.0)))
            if score > best:
                best, best_node = score, node
    return best_node


def measure(size: int, policy: str, pods: list[TracePod], typical: list[TypicalPod], decisions: int) -> float:
    rng = np.random.default_rng(size)
    book = AllocationBook(synthetic_cluster(size))
    live = prefill(book, pods, rng, 0.5)
    placer = Placer(book, make_policy(policy, PolicyContext(typical)), rng=rng)
    # Online policies learn the demand from arrivals: let them see a steady stream first, so that the
    # timed steps measure steady-state decisions (their refresh cost shows in the full-run wall time).
    for step in range(4096):
        placer.policy.observe(pods[int(rng.integers(len(pods)))].request(f"warm-{step}"))
    # Warm the score caches of the commonest shapes (first sight of a shape scores every node once).
    for pod in pods[:200]:
        placer.scores(pod.request(), placer.feasible(pod.request()))
    started = time.perf_counter()
    for step in range(decisions):
        pod = pods[int(rng.integers(len(pods)))]
        request = pod.request(f"timed-{step}")
        if placer.place_and_commit(request) is not None:
            live.append(request.name)
        victim = int(rng.integers(len(live)))
        live[victim], live[-1] = live[-1], live[victim]
        book.release(live.pop())
    return decisions / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--skip-full-run", action="store_true")
    args = parser.parse_args()

    pods, source = request_mix()
    typical = typical_pods_of(pods)
    gpu_pods = [p for p in pods if p.gpu_count == 1 and p.gpu_milli < 1000]
    print(f"request mix: {source} ({len(pods)} pods, {len(typical)} typical shapes)")
    print(f"{'nodes':>6} {'policy':>8} {'decisions/s':>12} {'x kube-sched floor':>19}")
    for size in (int(s) for s in args.sizes.split(",")):
        rates: dict[str, float] = {}
        for policy in ("fgd", "kubecell", "bestfit"):
            rate = rates[policy] = measure(size, policy, pods, typical, args.decisions)
            extra = f"   cost per decision {rates['fgd'] / rate:.2f}x FGD's" if policy == "kubecell" else ""
            print(f"{size:>6} {policy:>8} {rate:>12.0f} {rate / KUBE_SCHEDULER_FLOOR:>18.1f}x{extra}", flush=True)
        if size <= 5000:
            rng = np.random.default_rng(1)
            book = AllocationBook(synthetic_cluster(size))
            prefill(book, pods, rng, 0.5)
            samples = [gpu_pods[int(rng.integers(len(gpu_pods)))].request(f"naive-{i}") for i in range(3)]
            started = time.perf_counter()
            for request in samples:
                naive_fgd_choice(book, typical, request)
            naive = len(samples) / (time.perf_counter() - started)
            print(f"{size:>6} {'naive':>8} {naive:>12.1f}   (straightforward Python FGD, same process)", flush=True)

    if not args.skip_full_run:
        nodes = OPENB / "openb_node_list_gpu_node.csv"
        default = OPENB / "openb_pod_list_default.csv"
        if nodes.is_file() and default.is_file():
            walls: dict[str, float] = {}
            for policy in ("fgd", "kubecell"):
                started = time.perf_counter()
                run_grid(nodes, default, [policy], list(range(42, 52)), jobs=2)
                walls[policy] = time.perf_counter() - started
                print(f"full {policy} run, default trace, seeds 42-51, --jobs 2: {walls[policy]:.1f} s", flush=True)
            print(f"kubecell / FGD wall time of the full run (online learning and its cache refreshes included): "
                  f"{walls['kubecell'] / walls['fgd']:.2f}x")
        else:
            print(f"full FGD run skipped: {OPENB} is absent")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
