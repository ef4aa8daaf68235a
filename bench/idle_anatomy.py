"""Where the idle GPU capacity sits at the end of a packing run, per policy: the analysis behind
docs/placement.md.

Replays one openb pod list with one seed (the packing protocol: seeded shuffle, inflation to 130 %,
online placement, no retries) for each policy and classifies every GPU's free share at the end:

    dead   no typical request (the trace's commonest shapes covering 95 %) is that small
    host   some typical request is small enough, but none also fits the node's free CPU, memory and
           GPU model
    live   some typical request would still fit; it just did not arrive in time

and lists the GPU contents (the shares of the pods on a GPU) that hold the most idle capacity.

    python bench/idle_anatomy.py [--trace default] [--seed 42] [--placement fgd,kubecell]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.registry import PolicyContext, make_policy, parse_policy_list
from kubecell.sim.packing.runner import load_inputs
from kubecell.sim.packing.workload import arrival_sequence

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".." / "shared" / "data" / "alibaba-gpu-v2023-openb" / "csv"


def replay(trace: str, policy: str, seed: int) -> tuple[AllocationBook, dict[tuple[int, int], list[int]], int]:
    """The end state of one run, the shares on every GPU, and the number of failed pods."""
    inputs = load_inputs(str(DATA / "openb_node_list_gpu_node.csv"), str(DATA / f"openb_pod_list_{trace}.csv"), True)
    rng = np.random.default_rng(seed)
    book = AllocationBook(inputs.nodes)
    sequence = arrival_sequence(inputs.pods, book.total_gpu_milli, 1.3, rng)
    tie_rank = rng.permutation(book.size).astype(np.int64)
    placer = Placer(book, make_policy(policy, PolicyContext(inputs.typical)), rng=rng, tie_rank=tie_rank)
    contents: dict[tuple[int, int], list[int]] = defaultdict(list)
    failed = 0
    for pod in sequence:
        request = pod.request()
        placement = placer.place_and_commit(request)
        if placement is None:
            failed += 1
        elif request.is_share:
            contents[placement.node, placement.gpus[0]].append(request.gpu_milli)
    return book, contents, failed


def classify(book: AllocationBook, contents: dict[tuple[int, int], list[int]], trace: str
             ) -> tuple[Counter[str], Counter[tuple[int, ...]]]:
    inputs = load_inputs(str(DATA / "openb_node_list_gpu_node.csv"), str(DATA / f"openb_pod_list_{trace}.csv"), True)
    typical = [t.shape for t in inputs.typical if t.shape.gpu_count]
    milli = np.array([s.gpu_milli for s in typical])
    cpu = np.array([s.cpu_milli for s in typical])
    memory = np.array([int(np.mean([p.memory_mib for p in inputs.pods if p.shape == s])) for s in typical])
    classes: Counter[str] = Counter()
    by_content: Counter[tuple[int, ...]] = Counter()
    for node in range(book.size):
        model = book.nodes[node].gpu_model
        allowed = np.array([s.gpu_models is None or model in s.gpu_models for s in typical])
        host = (cpu <= book.cpu_free[node]) & (memory <= book.mem_free[node]) & allowed
        for gpu in range(int(book.gpu_count[node])):
            free = int(book.gpu_avail[node, gpu])
            if free == 0:
                continue
            small_enough = milli <= free
            kind = "dead" if not small_enough.any() else "live" if (small_enough & host).any() else "host"
            classes[kind] += free
            by_content[tuple(sorted(contents.get((node, gpu), [])))] += free
    return classes, by_content


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--placement", default="fgd,kubecell", help="comma-separated placement policies")
    args = parser.parse_args()
    pods = DATA / f"openb_pod_list_{args.trace}.csv"
    if not pods.is_file():
        print(f"skipped: {pods} is absent (the openb trace lives in ../shared/data)")
        return 0
    print(f"{args.trace}, seed {args.seed}: idle GPUs at the end of the run (130 % arrived)")
    for policy in parse_policy_list(args.placement):
        book, contents, failed = replay(args.trace, policy, args.seed)
        classes, by_content = classify(book, contents, args.trace)
        total = sum(classes.values()) / 1000
        parts = ", ".join(f"{k} {classes[k] / 1000:.1f}" for k in ("dead", "host", "live"))
        print(f"\n{policy}: {total:.1f} idle GPUs ({parts}); {failed} pods failed; "
              f"{by_content[()] / 1000:.1f} of them whole free GPUs")
        for content, idle in by_content.most_common(8):
            label = "+".join(map(str, content)) if content else "nothing (whole GPU free)"
            print(f"  {idle / 1000:7.1f}  on GPUs holding {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
