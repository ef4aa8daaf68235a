"""A fake kubelet for every testbed node: node leases, pod phases, graceful deletion.

The testbed has no real kubelets (no container runtime, no GPUs), yet the scheduler and its tests rely
on what kubelets do to the API: nodes renew their ``kube-node-lease`` Lease, a bound pod becomes
Running, a pod that has done its work becomes Succeeded (trace replay: after the
``kubecell.io/duration-seconds`` annotation), and a pod being deleted gracefully is removed once its
"containers" stopped (without that step evicted pods would hang in Terminating forever). This loop
does exactly those things for the nodes labelled ``kubecell.io/testbed=true`` and nothing else,
through the same API any kubelet uses; nodes also labelled ``kubecell.io/testbed-runs=processes`` are
served by the process kubelet (:mod:`kubecell.testbed.process_kubelet`), which runs their pods for real,
so this loop leaves them alone.

Every loop is bounded: watches time out and are re-opened from the last resourceVersion, relisting on
``410 Gone``, and everything stops when ``stop`` is set.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import heapq
import itertools
import logging
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubecell.kube.clock import rfc3339, rfc3339_micro
from kubecell.kube.names import ANNOTATION_DURATION
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.kubelet_modes import RUNS_LABEL, RUNS_PROCESSES
from kubecell.testbed.nodes import TESTBED_LABEL

log = logging.getLogger("kubecell.testbed.kubelet")

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
WATCH_SECONDS = 60
MAX_LEASE_WRITES_PER_SECOND = 50.0
"""Lease renewals are spread so that even 5,000 nodes cost the API server at most this many writes
per second (a real kubelet renews every 10 s; with no node-lifecycle controller nothing reads them
closely, and a flood of renewals would distort scheduler benchmarks)."""


def register_nodes(kube: Kube, manifests: Iterable[Mapping[str, Any]], *, workers: int = 16) -> int:
    """Create (or replace) the Node objects and their status; returns how many were registered."""

    def one(manifest: Mapping[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        body = {key: value for key, value in manifest.items() if key != "status"}
        try:
            kube.create("/api/v1/nodes", body)
        except ApiError as error:
            if not error.conflict:
                raise
            kube.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": manifest["metadata"]["labels"],
                                                              "annotations": manifest["metadata"]["annotations"]}})
        kube.patch(f"/api/v1/nodes/{name}/status", {"status": manifest["status"]}, kind="strategic")
        # The NodeRestriction/TaintNodesByCondition admission marks a node created without status
        # not-ready; the node lifecycle controller would lift it once Ready, and the testbed runs none.
        kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": manifest.get("spec", {}).get("taints")}})

    items = list(manifests)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(one, items):
            pass
    return len(items)


def succeeded_status(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The status patch a kubelet writes when every container of ``pod`` exited 0 (also used by benches that
    decide themselves when a pod's work is done, such as an emulated shared GPU)."""
    now = rfc3339()
    containers = pod["spec"].get("containers") or []
    return {"status": {
        "phase": "Succeeded",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                       {"type": "ContainersReady", "status": "False", "reason": "PodCompleted",
                        "lastTransitionTime": now}],
        "containerStatuses": [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                               "started": False, "restartCount": 0,
                               "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                        "finishedAt": now}}} for c in containers]}}


class FakeKubelet:
    """Keeps testbed nodes alive and moves their pods through their phases."""

    def __init__(self, kube: Kube, *, lease_interval: float = 10.0) -> None:
        self.kube = kube
        self.lease_interval = lease_interval
        self.stop = threading.Event()
        self.nodes: set[str] = set()
        self._finishing: list[tuple[float, int, str, str, str]] = []  # (when, seq, namespace, name, uid)
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._ips = itertools.count(1)
        self.started_pods = 0
        self.finished_pods = 0

    # ------------------------------------------------------------------ nodes and leases
    def refresh_nodes(self) -> None:
        """The nodes this kubelet serves; pods already bound to a node it newly serves are handled at once (a
        pod bound to a node registered moments before may have been seen, and skipped, before the node was)."""
        listed = self.kube.get("/api/v1/nodes", labelSelector=f"{TESTBED_LABEL}=true,{RUNS_LABEL}!={RUNS_PROCESSES}")
        before = self.nodes
        self.nodes = {item["metadata"]["name"] for item in listed["items"]}
        for node in sorted(self.nodes - before) if before else ():
            for pod in self.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]:
                self.handle(pod)

    def _renew(self, node: str) -> None:
        now = rfc3339_micro()
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node, "namespace": LEASE_NAMESPACE},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now}}
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        try:
            self.kube.patch(f"{leases}/{node}", {"spec": body["spec"]})
        except ApiError as error:
            if not error.not_found:
                raise
            with contextlib.suppress(ApiError):
                self.kube.create(leases, body)

    def lease_loop(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            nodes = sorted(self.nodes)
            pause = 1.0 / MAX_LEASE_WRITES_PER_SECOND
            for node in nodes:
                if self.stop.is_set():
                    return
                try:
                    self._renew(node)
                except (ApiError, OSError) as error:
                    log.warning("lease of %s not renewed: %s", node, error)
                self.stop.wait(pause)
            self.stop.wait(max(0.0, self.lease_interval - (time.monotonic() - started)))

    # ------------------------------------------------------------------ pods
    def _running_status(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        now = rfc3339()
        containers = pod["spec"].get("containers") or []
        ip = next(self._ips)
        conditions = [{"type": kind, "status": "True", "lastTransitionTime": now}
                      for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready",
                                   "PodScheduled")]
        return {"status": {
            "phase": "Running", "startTime": now, "hostIP": "127.0.0.1",
            "podIP": f"10.{128 + ip // 65536 % 128}.{ip // 256 % 256}.{ip % 256}", "conditions": conditions,
            "containerStatuses": [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True,
                                   "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}}}
                                  for c in containers]}}

    def _duration(self, pod: Mapping[str, Any]) -> float | None:
        text = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_DURATION)
        try:
            return float(text) if text is not None else None
        except ValueError:
            return None

    def handle(self, pod: Mapping[str, Any]) -> None:
        """React to one observed pod state (idempotent: replays of the same state do nothing new)."""
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("nodeName") not in self.nodes:
            return
        namespace, name = meta["namespace"], meta["name"]
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        if meta.get("deletionTimestamp"):
            with contextlib.suppress(ApiError):
                self.kube.delete(path, {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
            return
        phase = status.get("phase", "Pending")
        if phase == "Pending":
            try:
                self.kube.patch(f"{path}/status", self._running_status(pod), kind="strategic")
            except ApiError as error:
                if not error.not_found:
                    log.warning("pod %s/%s not started: %s", namespace, name, error)
                return
            self.started_pods += 1
            started = time.time()
        elif phase == "Running":
            started = _epoch(status.get("startTime")) or time.time()
        else:
            return
        duration = self._duration(pod)
        if duration is not None:
            with self._lock:
                heapq.heappush(self._finishing, (started + duration, next(self._seq), namespace, name, meta["uid"]))

    def finish_loop(self) -> None:
        while not self.stop.is_set():
            due: list[tuple[str, str, str]] = []
            with self._lock:
                while self._finishing and self._finishing[0][0] <= time.time():
                    _, _, namespace, name, uid = heapq.heappop(self._finishing)
                    due.append((namespace, name, uid))
            for namespace, name, uid in due:
                path = f"/api/v1/namespaces/{namespace}/pods/{name}"
                try:
                    current = self.kube.get(path)
                    if current["metadata"]["uid"] != uid or current["status"].get("phase") != "Running":
                        continue
                    self.kube.patch(f"{path}/status", succeeded_status(current), kind="strategic")
                    self.finished_pods += 1
                except ApiError as error:
                    if not error.not_found:
                        log.warning("pod %s/%s not finished: %s", namespace, name, error)
            self.stop.wait(0.1)

    def pod_loop(self) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 or a broken connection."""
        resource_version = ""
        selector = "spec.nodeName!="
        while not self.stop.is_set():
            try:
                if not resource_version:
                    self.refresh_nodes()
                    listed = self.kube.get("/api/v1/pods", fieldSelector=selector)
                    for pod in listed["items"]:
                        self.handle(pod)
                    resource_version = listed["metadata"]["resourceVersion"]
                for event in self.kube.watch("/api/v1/pods", resource_version, timeout_seconds=WATCH_SECONDS,
                                             fieldSelector=selector):
                    if self.stop.is_set():
                        return
                    obj = event["object"]
                    resource_version = obj["metadata"].get("resourceVersion", resource_version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.handle(obj)
            except ApiError as error:
                if not error.gone:
                    log.warning("pod watch failed (%s); relisting", error)
                    self.stop.wait(1.0)
                resource_version = ""
            except (OSError, ValueError) as error:  # connection dropped (API server restart) or a bad chunk
                log.warning("pod watch interrupted (%s); relisting", error)
                resource_version = ""
                self.stop.wait(1.0)

    def node_loop(self) -> None:
        """Pick up nodes registered after start (bounded: one list per lease interval)."""
        while not self.stop.is_set():
            with contextlib.suppress(ApiError, OSError):
                self.refresh_nodes()
            self.stop.wait(self.lease_interval)

    def run(self) -> None:
        threads = [threading.Thread(target=target, name=target.__name__, daemon=True)
                   for target in (self.pod_loop, self.finish_loop, self.lease_loop, self.node_loop)]
        for thread in threads:
            thread.start()
        self.stop.wait()
        for thread in threads:
            thread.join(timeout=5)


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()


def main(argv: list[str] | None = None) -> None:
    """``python -m kubecell.testbed.kubelet --kubeconfig FILE``: run until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--lease-interval", type=float, default=10.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    kubelet = FakeKubelet(Kube.from_kubeconfig(args.kubeconfig), lease_interval=args.lease_interval)
    signal.signal(signal.SIGTERM, lambda *_: kubelet.stop.set())
    signal.signal(signal.SIGINT, lambda *_: kubelet.stop.set())
    log.info("fake kubelet running")
    kubelet.run()


if __name__ == "__main__":
    main()
