"""kubecell's scheduler against the stock kube-scheduler on the same testbed: throughput and latency.

Starts a testbed of N synthetic 8-GPU nodes (with the stock kube-scheduler), then for each scheduler
creates P whole-GPU pods (``nvidia.com/gpu: 1``, as scheduler_perf's extended-resource case) from a
pool of client threads and watches them bound. Prints pods/s from the first create to the last bind
and the p50/p99 of create-to-bound latency (client clocks), and kubecell / kube-scheduler ratios.
kubecell's scheduler runs as a separate process (``kubecell scheduler``), as it would in a cluster.

    python bench/k8s_scheduler.py [--nodes 1000] [--pods 2000] [--clients 8]

Needs Go for the first testbed build (cached afterwards). Loopback only; everything is stopped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubecell.k8s.rest import Kube
from kubecell.testbed import testbed


def pod(name: str, namespace: str, scheduler: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "bench",
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                                   "limits": {"nvidia.com/gpu": "1"}}}]}}


def measure(kube: Kube, scheduler: str, namespace: str, count: int, clients: int, timeout: float) -> dict[str, float]:
    """Create ``count`` pods for ``scheduler``; return pods/s and latency percentiles (seconds)."""
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    listed = kube.get(f"/api/v1/namespaces/{namespace}/pods")
    version = listed["metadata"]["resourceVersion"]
    done = threading.Event()

    def watch() -> None:
        nonlocal version
        deadline = time.monotonic() + timeout
        while not done.is_set() and time.monotonic() < deadline:
            for event in kube.watch(f"/api/v1/namespaces/{namespace}/pods", version, timeout_seconds=30):
                obj = event["object"]
                version = obj["metadata"].get("resourceVersion", version)
                name = obj["metadata"].get("name")
                if name and obj.get("spec", {}).get("nodeName") and name not in bound:
                    bound[name] = time.monotonic()
                    if len(bound) >= count:
                        done.set()
                        return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()

    def create(i: int) -> None:
        name = f"p{i:06d}"
        created[name] = time.monotonic()
        kube.create(f"/api/v1/namespaces/{namespace}/pods", pod(name, namespace, scheduler))

    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(create, range(count)))
    done.wait(timeout)
    finished = max(bound.values()) if bound else time.monotonic()
    latencies = sorted(bound[n] - created[n] for n in bound if n in created)
    return {"bound": float(len(bound)), "pods_per_second": len(bound) / max(finished - started, 1e-9),
            "p50": statistics.median(latencies) if latencies else float("nan"),
            "p99": latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kubecell-bench-") as scratch:
        state = testbed.up("synthetic", nodes=args.nodes, directory=Path(scratch), kube_scheduler=True,
                           log=lambda line: print(line, file=sys.stderr)).state
        kube = Kube.from_kubeconfig(state.admin_kubeconfig, pool=args.clients + 4)
        ours = subprocess.Popen([sys.executable, "-m", "kubecell.cli.main", "scheduler", "--kubeconfig",
                                 state.admin_kubeconfig, "--no-leader-elect", "--listen", ""],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(5.0)  # let kubecell list the cluster before its pods arrive
            results = {name: measure(kube, name, f"bench-{name}", args.pods, args.clients, args.timeout)
                       for name in ("default-scheduler", "kubecell")}
            rss_kib = int(next(line.split()[1] for line in Path(f"/proc/{ours.pid}/status").read_text().splitlines()
                               if line.startswith("VmRSS")))
        finally:
            ours.terminate()
            ours.wait(timeout=30)
            kube.close()
            testbed.down(Path(scratch))
    base, mine = results["default-scheduler"], results["kubecell"]
    print(f"{args.nodes} nodes x 8 GPUs, {args.pods} whole-GPU pods, {args.clients} client threads")
    print(f"{'scheduler':20} {'bound':>7} {'pods/s':>8} {'p50 s':>8} {'p99 s':>8}")
    for name, result in results.items():
        print(f"{name:20} {result['bound']:7.0f} {result['pods_per_second']:8.1f} {result['p50']:8.3f} "
              f"{result['p99']:8.3f}")
    print(f"kubecell / kube-scheduler: pods/s {mine['pods_per_second'] / base['pods_per_second']:.2f}x, "
          f"p99 {mine['p99'] / base['p99']:.2f}x; kubecell scheduler RSS {rss_kib / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
