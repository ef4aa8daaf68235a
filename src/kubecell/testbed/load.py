"""Load for benchmarks on a testbed: pods created from client threads and watched until bound, and the
process figures a benchmark reports (loopback only, every wait bounded)."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubecell.kube.rest import Kube


def pod(name: str, namespace: str, scheduler: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "bench",
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                                   "limits": {"nvidia.com/gpu": "1"}}}]}}


def claim_pod(name: str, namespace: str, scheduler: str, template: str = "gpu") -> dict[str, Any]:
    """A pod that asks for its GPU through a ResourceClaim made from the template ``template`` (DRA)."""
    body = pod(name, namespace, scheduler)
    container = body["spec"]["containers"][0]
    container["resources"] = {"requests": container["resources"]["requests"], "claims": [{"name": "gpu"}]}
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return body


def measure(kube: Kube, scheduler: str, namespace: str, count: int, clients: int, timeout: float,
            *, make: Callable[[str, str, str], dict[str, Any]] = pod,
            prepare: Callable[[str], None] | None = None) -> dict[str, float]:
    """Create ``count`` pods (``make``: name, namespace, scheduler -> body) for ``scheduler``; return pods/s and
    latency percentiles (seconds). ``prepare`` runs once the namespace exists (a claim template to create)."""
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    if prepare is not None:
        prepare(namespace)
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
        kube.create(f"/api/v1/namespaces/{namespace}/pods", make(name, namespace, scheduler))

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


def wait_ready(port: int, timeout: float, what: str = "kubecell's scheduler") -> None:
    """Wait until ``/readyz`` on the port answers 200 (it has listed the cluster and run a cycle)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} was not ready after {timeout:.0f} s")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_kubecell(kubeconfig: str, *, timeout: float = 300.0) -> subprocess.Popen[bytes]:
    """``kubecell scheduler`` as a separate process (as in a cluster), once it has listed the cluster and run a
    cycle, so that its pods never arrive before it can see them. The caller terminates it."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "kubecell.cli.main", "scheduler", "--kubeconfig", kubeconfig,
                                "--no-leader-elect", "--listen", f"127.0.0.1:{port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, timeout)
    except BaseException:
        process.terminate()
        raise
    return process


SCHEDULERS = ("default-scheduler", "kubecell")


def alternating_rounds(repeat: int, run: Callable[[str, int], dict[str, float]]) -> dict[str, dict[str, float]]:
    """``run(scheduler, round)`` for both schedulers, ``repeat`` rounds alternating who goes first (the second
    runs on a fuller cluster); the median of each figure per scheduler."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SCHEDULERS}
    for round_ in range(repeat):
        for name in SCHEDULERS if round_ % 2 == 0 else reversed(SCHEDULERS):
            runs[name].append(run(name, round_))
    return {name: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
            for name, rounds in runs.items()}


def print_comparison(results: dict[str, dict[str, float]], note: str = "", *,
                     labels: dict[str, str] | None = None, ratio: tuple[str, str] = ("kubecell", "default-scheduler"),
                     ratio_label: str = "kubecell / kube-scheduler", heading: str = "scheduler") -> None:
    """The table of ``measure``'s figures per run (``labels``: how each is named in the table), and the ratios
    of run ``ratio[0]`` to run ``ratio[1]``; ``note`` ends the last line."""
    labels = labels or {name: name for name in results}
    width = max(20, *(len(label) for label in labels.values()))
    print(f"{heading:{width}} {'bound':>7} {'pods/s':>8} {'p50 s':>8} {'p99 s':>8}")
    for name, result in results.items():
        print(f"{labels[name]:{width}} {result['bound']:7.0f} {result['pods_per_second']:8.1f} {result['p50']:8.3f} "
              f"{result['p99']:8.3f}")
    mine, base = results[ratio[0]], results[ratio[1]]
    print(f"{ratio_label}: pods/s {mine['pods_per_second'] / base['pods_per_second']:.2f}x, "
          f"p99 {mine['p99'] / base['p99']:.2f}x{note}")
