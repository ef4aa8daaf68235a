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
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
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


def share_pod(name: str, namespace: str) -> dict[str, Any]:
    body = pod(name, namespace, "kubecell")
    body["spec"]["containers"][0]["resources"]["limits"] = {"kubecell.io/gpu-milli": "250"}
    return body


def fill(kube: Kube, namespace: str, start: int, count: int, clients: int, timeout: float) -> float:
    """Create ``count`` share pods for kubecell; returns seconds until all are bound (or the timeout)."""
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(lambda i: kube.create(f"/api/v1/namespaces/{namespace}/pods",
                                            share_pod(f"f{i:06d}", namespace)), range(start, start + count)))
    path = f"/api/v1/namespaces/{namespace}/pods"
    while time.monotonic() - started < timeout:
        unbound = kube.get(path, fieldSelector="spec.nodeName=", limit=1)["items"]
        if not unbound:
            break
        time.sleep(2.0)
    return time.monotonic() - started


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB: resident now and at its peak."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def wait_ready(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"kubecell's scheduler was not ready after {timeout:.0f} s")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
        port = free_port()
        ours = subprocess.Popen([sys.executable, "-m", "kubecell.cli.main", "scheduler", "--kubeconfig",
                                 state.admin_kubeconfig, "--no-leader-elect", "--listen", f"127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        filled: tuple[float, int, int] | None = None
        try:
            wait_ready(port, 300.0)  # kubecell has listed the cluster and run a cycle before its pods arrive
            runs: dict[str, list[dict[str, float]]] = {"default-scheduler": [], "kubecell": []}
            for round_ in range(args.repeat):  # alternate who goes first: the second runs on a fuller cluster
                order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
                for name in order:
                    namespace = f"bench-{name}-{round_}"
                    runs[name].append(measure(kube, name, namespace, args.pods, args.clients, args.timeout))
                    if round_ < args.repeat - 1:
                        testbed.clear_pods(kube, namespace)
            results = {name: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
                       for name, rounds in runs.items()}
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
    base, mine = results["default-scheduler"], results["kubecell"]
    print(f"{args.nodes} nodes x 8 GPUs, {args.pods} whole-GPU pods, {args.clients} client threads, "
          f"median of {args.repeat} round(s) alternating which scheduler goes first")
    print(f"{'scheduler':20} {'bound':>7} {'pods/s':>8} {'p50 s':>8} {'p99 s':>8}")
    for name, result in results.items():
        print(f"{name:20} {result['bound']:7.0f} {result['pods_per_second']:8.1f} {result['p50']:8.3f} "
              f"{result['p99']:8.3f}")
    print(f"kubecell / kube-scheduler: pods/s {mine['pods_per_second'] / base['pods_per_second']:.2f}x, "
          f"p99 {mine['p99'] / base['p99']:.2f}x; kubecell scheduler RSS {rss_kib / 1024:.0f} MiB")
    if filled is not None:
        seconds, now_kib, peak_kib = filled
        print(f"filled to {args.fill} pods ({args.fill - 2 * args.pods} quarter-GPU shares created and bound in "
              f"{seconds:.0f} s): kubecell scheduler RSS {now_kib / 1024:.0f} MiB, peak {peak_kib / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
