"""kubecell's scheduler against the stock kube-scheduler on the same testbed: throughput and latency.

Starts a testbed of N synthetic 8-GPU nodes (with the stock kube-scheduler), then for each scheduler
creates P whole-GPU pods (``nvidia.com/gpu: 1``, as scheduler_perf's extended-resource case) from a
pool of client threads and watches them bound. Prints pods/s from the first create to the last bind
and the p50/p99 of create-to-bound latency (client clocks), and kubecell / kube-scheduler ratios.
kubecell's scheduler runs as a separate process (``kubecell scheduler``), as it would in a cluster.

    python bench/k8s_scheduler.py [--nodes 1000] [--pods 2000] [--clients 8] [--repeat 3] [--fill 50000]

``--fill N`` then gives kubecell more pods (shares of a quarter GPU) until N pods exist, waits until they
are bound, and reports kubecell's resident memory (now and peak) at that size.

Needs Go for the first testbed build (cached afterwards). Loopback only; everything is stopped at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from kubecell.kube.rest import Kube
from kubecell.testbed import testbed
from kubecell.testbed.load import alternating_rounds, fill, measure, memory_kib, print_comparison, start_kubecell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="Rounds per scheduler, alternating which goes first; medians are printed.")
    parser.add_argument("--fill", type=int, default=0, help="Then grow kubecell's pods to this many; report memory.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kubecell-bench-") as scratch:
        state = testbed.up("synthetic", nodes=args.nodes, directory=Path(scratch), kube_scheduler=True,
                           log=lambda line: print(line, file=sys.stderr)).state
        kube = Kube.from_kubeconfig(state.admin_kubeconfig, pool=args.clients + 4)
        ours = start_kubecell(state.admin_kubeconfig)
        filled: tuple[float, int, int] | None = None
        try:
            def one_round(name: str, round_: int) -> dict[str, float]:
                namespace = f"bench-{name}-{round_}"
                figures = measure(kube, name, namespace, args.pods, args.clients, args.timeout)
                if round_ < args.repeat - 1:
                    testbed.clear_pods(kube, namespace)
                return figures
            results = alternating_rounds(args.repeat, one_round)
            rss_kib, _ = memory_kib(ours.pid)
            if args.fill > 2 * args.pods:
                last = f"bench-kubecell-{args.repeat - 1}"
                seconds = fill(kube, last, 0, args.fill - 2 * args.pods, args.clients, 4 * args.timeout)
                filled = (seconds, *memory_kib(ours.pid))
        finally:
            ours.terminate()
            ours.wait(timeout=30)
            kube.close()
            testbed.down(Path(scratch))
    print(f"{args.nodes} nodes x 8 GPUs, {args.pods} whole-GPU pods, {args.clients} client threads, "
          f"median of {args.repeat} round(s) alternating which scheduler goes first")
    print_comparison(results, f"; kubecell scheduler RSS {rss_kib / 1024:.0f} MiB")
    if filled is not None:
        seconds, now_kib, peak_kib = filled
        print(f"filled to {args.fill} pods ({args.fill - 2 * args.pods} quarter-GPU shares created and bound in "
              f"{seconds:.0f} s): kubecell scheduler RSS {now_kib / 1024:.0f} MiB, peak {peak_kib / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
