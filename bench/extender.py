"""Extender latency: kube-scheduler's filter + prioritize calls answered by ``kubecell extender``.

Measures, for clusters of 1,000 and 5,000 synthetic 8-GPU nodes, the time from sending a filter request
to receiving the prioritize answer for the same pod (the two calls kube-scheduler makes per pod before
it binds), over real HTTP on loopback against the extender's own server (Starlette/uvicorn) and its
scheduler loop, with the candidate nodes sent as names (``nodeCacheCapable: true``) and as full Node
objects (without a node cache, as gpushare-style extenders are configured). The engine decides every pod
for real (fractional, 1-GPU and 4-GPU asks); nothing is bound, so no API server is needed: the bind verb's
cost is one allocation record + Binding write, measured end to end by ``tests/scheduler/extender/test_extender.py``.

    python bench/extender.py [--nodes 1000 5000] [--pods 300] [--seed 1]

Prints p50/p99/max per configuration and the request body size. The target: p99 under 50 ms at
5,000 nodes with a node cache (kube-scheduler's default extender timeout is 5 s).

    python bench/extender.py --e2e [--nodes 1000] [--pods 2000] [--clients 8]

End to end on a testbed of synthetic 8-GPU nodes: whole-GPU pods created from client threads and watched
until bound, once through the stock kube-scheduler configured with ``deploy/extender``'s sample and calling
``kubecell extender`` (a separate process, as in a cluster), once through ``kubecell scheduler``; prints
pods/s and create-to-bound p50/p99 for both, and the ratio.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
from starlette.applications import Starlette

from kubecell.cli.serving import serve
from kubecell.kube.offline import OfflineKube
from kubecell.kube.rest import Kube
from kubecell.kube.watch import Event
from kubecell.scheduler.extender.config import render
from kubecell.scheduler.extender.http import routes
from kubecell.scheduler.extender.verbs import Extender
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed import testbed
from kubecell.testbed.build import ensure_binaries
from kubecell.testbed.control_plane import ControlPlane
from kubecell.testbed.load import free_port, measure, print_comparison, wait_ready
from kubecell.testbed.nodes import node_manifest, synthetic_cluster

ASKS = ({"kubecell.io/gpu-milli": "500"}, {"kubecell.io/gpu-milli": "250"}, {"kubecell.io/gpu": "1"},
        {"kubecell.io/gpu": "4"})
WEIGHTS = (0.35, 0.25, 0.3, 0.1)


def pod(i: int, limits: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": f"b{i:06d}", "namespace": "bench", "uid": f"bench-{i:06d}",
                         "creationTimestamp": "2026-11-23T00:00:00Z"},
            "spec": {"schedulerName": "kubecell", "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": limits}}]},
            "status": {"phase": "Pending"}}


def watched(scheduler: Scheduler, asked: dict[str, Any], timeout: float = 5.0) -> None:
    """The pod as the scheduler's watch would show it, before kube-scheduler asks about it (its own watch shows
    it at about the same time): the extender never takes a pod from a request, and this bench has no API
    server to read one from. Not timed."""
    scheduler.events.put(Event("pods", "ADDED", asked))
    deadline = time.monotonic() + timeout
    while asked["metadata"]["uid"] not in scheduler.mirror.pods:
        if time.monotonic() > deadline:
            raise SystemExit(f"the scheduler did not take up pod {asked['metadata']['name']} within {timeout:.0f} s")
        time.sleep(0.0005)


def run(nodes: int, pods: int, seed: int) -> list[tuple[str, float, float, float, float, int]]:
    manifests = [node_manifest(node) for node in synthetic_cluster(nodes)]
    scheduler = Scheduler(cast(Kube, OfflineKube()), SchedulerOptions(extender=True))
    scheduler.events.put(Event("nodes", "SYNC", objects=tuple(manifests)))
    thread = threading.Thread(target=scheduler.loop, daemon=True)  # no watches: the nodes were put in above
    thread.start()
    served = serve(Starlette(routes=routes(Extender(scheduler))), "127.0.0.1", 0)
    rows = []
    try:
        assert scheduler.ready.wait(120), "the extender did not build its engine"
        assert scheduler.engine is not None
        assert scheduler.engine.book.size == nodes
        names = json.dumps([m["metadata"]["name"] for m in manifests])
        objects = json.dumps({"metadata": {}, "items": manifests})
        rng = np.random.default_rng(seed)
        asks = rng.choice(len(ASKS), size=2 * pods, p=WEIGHTS)
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
        connection.connect()  # Nagle off, as Go's net/http (kube-scheduler) has it: http.client writes
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body apart
        index = 0
        for label, key, nodes_json, count in (("nodeCacheCapable", "NodeNames", names, pods),
                                              ("full Node objects", "Nodes", objects, max(20, pods // 3))):
            latencies, size = [], 0
            for _ in range(count):
                asked = pod(index, ASKS[asks[index]])
                watched(scheduler, asked)
                body = f'{{"Pod": {json.dumps(asked)}, "{key}": {nodes_json}}}'.encode()
                size = len(body)
                index += 1
                started = time.perf_counter()
                for verb in ("filter", "prioritize"):
                    connection.request("POST", f"/extender/{verb}", body, {"Content-Type": "application/json"})
                    answer = connection.getresponse()
                    payload = answer.read()
                    if answer.status != 200:
                        raise SystemExit(f"{verb} answered {answer.status}: {payload[:200]!r}")
                latencies.append(time.perf_counter() - started)
                if verb == "prioritize" and not any(h["Score"] == 10 for h in json.loads(payload)):
                    raise SystemExit(f"pod {index} was not placed: {payload[:200]!r}")
            ms = np.array(latencies) * 1000
            rows.append((label, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), float(ms.max()),
                         count / (ms.sum() / 1000), size))
        connection.close()
    finally:
        served.stop()
        scheduler.shutdown()
        thread.join(10)
    return rows


def end_to_end(nodes: int, pods: int, clients: int, timeout: float) -> None:
    """kube-scheduler + ``kubecell extender`` against ``kubecell scheduler``, on one testbed."""
    with tempfile.TemporaryDirectory(prefix="kubecell-bench-") as scratch:
        state = testbed.up("synthetic", nodes=nodes, directory=Path(scratch),
                           log=lambda line: print(line, file=sys.stderr)).state
        kube = Kube.from_kubeconfig(state.admin_kubeconfig, pool=clients + 4)
        plane = ControlPlane.attach(state, ensure_binaries(log=lambda _: None))
        results = {}
        try:
            for mode in ("extender", "scheduler"):
                port = free_port()
                ours = subprocess.Popen([sys.executable, "-m", "kubecell.cli.main", mode, "--kubeconfig",
                                         state.admin_kubeconfig, "--no-leader-elect", "--listen",
                                         f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                server = None
                try:
                    wait_ready(port, 300.0, f"kubecell {mode}")
                    if mode == "extender":
                        config = Path(scratch) / "kube-scheduler-extender.yaml"
                        config.write_text(render(url=f"http://127.0.0.1:{port}/extender", qps=5000,
                                                 kubeconfig=state.kubeconfig("kube-scheduler")))
                        server = plane.start_kube_scheduler(config)
                    namespace = f"bench-{mode}"
                    results[mode] = measure(kube, "kubecell", namespace, pods, clients, timeout)
                    testbed.clear_pods(kube, namespace)
                finally:
                    if server is not None:
                        plane.stop_server(server)
                    ours.terminate()
                    ours.wait(timeout=30)
        finally:
            kube.close()
            testbed.down(Path(scratch))
    print(f"{nodes} nodes x 8 GPUs, {pods} whole-GPU pods (nvidia.com/gpu: 1), {clients} client threads")
    print_comparison(results, labels={"extender": "kube-scheduler + kubecell extender",
                                      "scheduler": "kubecell scheduler"},
                     ratio=("extender", "scheduler"), ratio_label="extender / scheduler", heading="path")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=None)
    parser.add_argument("--pods", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--e2e", action="store_true", help="End to end on a testbed (see the module's text).")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if args.e2e:
        end_to_end((args.nodes or [1000])[0], args.pods or 2000, args.clients, args.timeout)
        return
    args.nodes = args.nodes or [1000, 5000]
    args.pods = args.pods or 300
    print(f"{'nodes':>6} {'candidates sent as':<18} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'pods/s':>8} "
          f"{'request':>10}")
    for count in args.nodes:
        for label, p50, p99, worst, rate, size in run(count, args.pods, args.seed):
            print(f"{count:>6} {label:<18} {p50:>8.1f} {p99:>8.1f} {worst:>8.1f} {rate:>8.1f} "
                  f"{size / 1024:>8.0f} KiB", flush=True)


if __name__ == "__main__":
    main()
