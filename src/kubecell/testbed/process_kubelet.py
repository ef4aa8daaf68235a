"""The process kubelet: a testbed kubelet that runs each container of a bound pod as a real host process.

The testbed's fake kubelet (:mod:`kubecell.testbed.kubelet`) runs nothing: pods become Running and end
after ``kubecell.io/duration-seconds``. This kubelet, for the nodes it is given, runs them for real, so a
training script or ``torchrun`` runs under kubecell end to end: kubecell's scheduler places the pod and
writes its allocation record, and the program starts with the environment kubecell's node agent would
have given it (``CUDA_VISIBLE_DEVICES`` and the share's budget from the record), its downward-API
variables, and its exit code decides the pod's phase.

**Which nodes.** Exactly the nodes it is given: a list of names, or (without one) every node labelled
``kubecell.io/testbed-runs=processes``. Given a list, it labels those nodes so; the fake kubelet skips
nodes with that label, so each node has one kubelet. It renews each node's Lease, reports its address as
``InternalIP`` 127.0.0.1 and its HTTPS port as ``daemonEndpoints.kubeletEndpoint`` (where the API server
sends ``kubectl logs``), and kills the pods of a node that is deleted (or stops being its own).

**What it does not isolate**: nothing is a container. No image (the container's ``command`` is a host
executable), no cgroups (CPU and memory limits are not enforced), no namespaces (every pod shares the
host's network, so ``podIP`` is 127.0.0.1 and two pods cannot listen on one port; processes see each
other and the host's files), no volumes, probes, lifecycle hooks or security contexts; every process
runs as the user running the kubelet. GPUs are given by environment only (``CUDA_VISIBLE_DEVICES``,
``NVIDIA_VISIBLE_DEVICES=void`` for containers without GPUs): a program that ignores it reaches every GPU.

Per pod (:mod:`kubecell.testbed.process_pod`): admission as the node agent would answer, init containers
then containers, restart policies with a bounded back-off, statuses and conditions, graceful deletion
(SIGTERM to the process group, SIGKILL after the grace period, then the pod object deleted). Per
container (:mod:`kubecell.testbed.process_env`): argv, working directory and environment. Logs:
``<testbed dir>/process-kubelet/pods/<namespace>_<pod>_<uid>/<container>/<restart count>.log``, served
to ``kubectl logs`` by :mod:`kubecell.testbed.kubelet_server` and read by :func:`container_log`.

**Nothing outlives it.** Stopping it (``close``, SIGTERM to ``python -m kubecell.testbed.process_kubelet``)
ends every process it started within ``shutdown_grace`` seconds; each running process also has a pid
file in ``<testbed dir>/process-kubelet/pids/``, which :func:`kill_leftovers` reads to kill what a kubelet
that died without stopping left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from kubecell.core.digits import decimal_digits
from kubecell.kube.clock import rfc3339, rfc3339_micro
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.kubelet_modes import OWNED_SELECTOR, RUNS_LABEL, RUNS_PROCESSES
from kubecell.testbed.kubelet_server import KubeletServer, serving_certificate
from kubecell.testbed.process_pod import MIN_GRACE, PodWorker
from kubecell.testbed.process_runtime import LiveLogs, PidRegistry, Runtime, process_start_time, signal_container
from kubecell.testbed.processes import TestbedError

log = logging.getLogger("kubecell.testbed.process_kubelet")

__all__ = ["OWNED_SELECTOR", "RUNS_LABEL", "RUNS_PROCESSES", "ProcessKubelet", "container_log", "kill_leftovers",
           "running_process_kubelet", "start_detached"]

DIRECTORY = "process-kubelet"
"""Under the testbed's directory: ``pods/`` (logs, working and home directories), ``pids/``, ``pki/``."""

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
WATCH_SECONDS = 10
"""A watch is re-opened (from its resourceVersion, no relist) this often: the pod loop notices a stop
within this long even when no pod changes."""
READY_TIMEOUT = 60.0
FAKE_KUBELET_NODE_REFRESH = 10.0
"""How often the fake kubelet of ``kubecell testbed up`` lists its nodes (its default ``lease_interval``):
a node labelled for the process kubelet is dropped by it within this long."""
KUBELET_CA = ("kubelet-ca.crt", "kubelet-ca.key")
"""In ``<testbed dir>/pki/``: when the control plane writes this CA (and gives the API server
``--kubelet-certificate-authority`` with it), the serving certificate is signed by it."""
KUBELET_CLIENT_CA = "kubelet-client-ca.crt"
"""In ``<testbed dir>/pki/``: when present, the endpoint requires a client certificate signed by it (the
API server's ``--kubelet-client-certificate``)."""


def root_of(testbed_dir: Path) -> Path:
    return Path(testbed_dir) / DIRECTORY


class ProcessKubelet:
    """Serves the nodes it is given (see the module docstring); ``start``, then ``close`` (or ``with``)."""

    def __init__(self, kube: Kube, testbed_dir: Path, api_url: str, *, nodes: Collection[str] | None = None,
                 lease_interval: float = 10.0, node_interval: float = 2.0, backoff_initial: float = 1.0,
                 backoff_max: float = 30.0, max_grace: float = 30.0, shutdown_grace: float = 5.0,
                 serve_logs: bool = True, host_env: Mapping[str, str] | None = None) -> None:
        self.kube = kube
        self.testbed_dir = Path(testbed_dir)
        self.wanted = sorted(set(nodes)) if nodes is not None else None
        self.lease_interval = lease_interval
        self.node_interval = node_interval
        self.stop = threading.Event()
        self.ready = threading.Event()
        root = root_of(self.testbed_dir)
        self.identity = f"{os.getpid()}-{id(self):x}"
        self.runtime = Runtime(kube=kube, stop=self.stop, root=root, api_url=api_url,
                               host_env=dict(os.environ if host_env is None else host_env),
                               pids=PidRegistry(root / "pids", self.identity), live_logs=LiveLogs(),
                               backoff_initial=backoff_initial, backoff_max=backoff_max, max_grace=max_grace,
                               shutdown_grace=shutdown_grace, ca_cert=Path(self.testbed_dir) / "pki" / "ca.crt")
        self.nodes: dict[str, dict[str, Any]] = {}
        self.workers: dict[str, PodWorker] = {}
        self.finished: set[str] = set()
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        self.server: KubeletServer | None = None
        if serve_logs:
            pki = self.testbed_dir / "pki"
            issuer = (pki / KUBELET_CA[0], pki / KUBELET_CA[1])
            certificate = serving_certificate(root / "pki" / self.identity,
                                              issuer=issuer if all(p.is_file() for p in issuer) else None)
            client_ca = pki / KUBELET_CLIENT_CA
            self.server = KubeletServer(self.find_log, self.runtime.live_logs.__contains__, self.stop,
                                        certificate=certificate, client_ca=client_ca if client_ca.is_file() else None)

    @property
    def port(self) -> int:
        """The HTTPS port the nodes report as their kubelet endpoint (0 without the log server)."""
        return self.server.port if self.server is not None else 0

    # ------------------------------------------------------------------ life
    def start(self, timeout: float = READY_TIMEOUT) -> ProcessKubelet:
        """Start serving; returns once the nodes are set up and the first list of pods was handled."""
        if self.server is not None:
            self.server.start()
        for target in (self._pod_loop, self._node_loop, self._lease_loop):
            thread = threading.Thread(target=target, name=f"process-kubelet {target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if not self.ready.wait(timeout):
            self.close()
            raise TestbedError(f"the process kubelet did not become ready within {timeout:.0f} s")
        return self

    def close(self) -> None:
        """Stop: every process started is ended (SIGTERM, SIGKILL after ``shutdown_grace``) and reaped."""
        self.stop.set()
        with self._lock:
            workers = list(self.workers.values())
        deadline = time.monotonic() + self.runtime.shutdown_grace + 10.0
        for worker in workers:
            worker.thread.join(timeout=max(0.1, deadline - time.monotonic()))
        for thread in self._threads:
            thread.join(timeout=1)  # the pod loop may sit in a watch for up to WATCH_SECONDS: it is a daemon
        if self.server is not None:
            self.server.close()
        kill_leftovers(self.testbed_dir, only_kubelet=self.identity)

    def __enter__(self) -> ProcessKubelet:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------------ nodes
    def _owned(self) -> dict[str, dict[str, Any]]:
        if self.wanted is None:
            return {item["metadata"]["name"]: item
                    for item in self.kube.get("/api/v1/nodes", labelSelector=OWNED_SELECTOR)["items"]}
        found = {}
        for name in self.wanted:
            try:
                found[name] = self.kube.get(f"/api/v1/nodes/{name}")
            except ApiError as error:
                if not error.not_found:
                    raise
        return found

    def _take(self, name: str, node: Mapping[str, Any]) -> None:
        """Make the node ours: the label (the fake kubelet lets go of it), its address and our port."""
        labels = node["metadata"].get("labels") or {}
        if labels.get(RUNS_LABEL) != RUNS_PROCESSES:
            self.kube.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {RUNS_LABEL: RUNS_PROCESSES}}})
        now = rfc3339()
        status = {"status": {
            # InternalIP only: the API server tries Hostname first, which would not resolve.
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubecell testbed process kubelet", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
            "nodeInfo": {"containerRuntimeVersion": "process://kubecell-testbed"}}}
        self.kube.patch(f"/api/v1/nodes/{name}/status", status)

    def refresh_nodes(self) -> None:
        """Take new nodes (and handle the pods already bound to them); kill the pods of lost ones."""
        current = self._owned()
        with self._lock:
            known = set(self.nodes)
        for name in sorted(set(current) - known):
            self._take(name, current[name])
            log.info("serving node %s (kubelet port %d)", name, self.port)
        with self._lock:
            self.nodes = current
            lost = [w for w in self.workers.values() if str(w.node["metadata"]["name"]) not in current]
        for worker in lost:
            worker.terminate(MIN_GRACE, node_gone=True, why=f"node {worker.node['metadata']['name']} was deleted "
                                                            "(or is no longer served by the process kubelet)")
        for name in sorted(set(current) - known):
            for pod in self.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={name}")["items"]:
                self.handle("ADDED", pod)

    def _node_loop(self) -> None:
        while not self.stop.wait(self.node_interval):
            try:
                self.refresh_nodes()
            except (ApiError, OSError) as error:
                log.warning("nodes not refreshed: %s", error)

    def _renew(self, node: str) -> None:
        spec = {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": rfc3339_micro()}
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        try:
            self.kube.patch(f"{leases}/{node}", {"spec": spec})
        except ApiError as error:
            if not error.not_found:
                raise
            with contextlib.suppress(ApiError):
                self.kube.create(leases, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                          "metadata": {"name": node, "namespace": LEASE_NAMESPACE}, "spec": spec})

    def _lease_loop(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                names = sorted(self.nodes)
            for name in names:
                try:
                    self._renew(name)
                except (ApiError, OSError) as error:
                    log.warning("lease of %s not renewed: %s", name, error)
            self.stop.wait(self.lease_interval)

    # ------------------------------------------------------------------ pods
    def handle(self, kind: str, pod: dict[str, Any]) -> None:
        """One observed pod event (idempotent: replays of a state start nothing twice)."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = str(meta.get("uid", ""))
        with self._lock:
            worker = self.workers.get(uid)
            if kind == "DELETED":
                self.finished.discard(uid)
                if worker is not None:
                    worker.terminate(MIN_GRACE, deleted=True, why="the pod was deleted")
                return
            node = self.nodes.get(str(spec.get("nodeName") or ""))
            if node is None:
                return
            if worker is not None:
                worker.update(pod)
            if meta.get("deletionTimestamp"):
                if worker is not None:
                    worker.terminate(float(meta.get("deletionGracePeriodSeconds") or 0))
                    return
            elif worker is not None or uid in self.finished or (pod.get("status") or {}).get("phase") in (
                    "Succeeded", "Failed"):
                return
            else:
                worker = self.workers[uid] = PodWorker(self.runtime, pod, node, self._done)
                worker.thread.start()
                return
        # deleted while nothing of it runs (ended, or never started): remove the object, as the kubelet does
        with contextlib.suppress(ApiError):
            self.kube.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                             {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})

    def _done(self, worker: PodWorker) -> None:
        with self._lock:
            self.workers.pop(worker.uid, None)
            self.finished.add(worker.uid)

    def _pod_loop(self) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 or a broken connection."""
        resource_version = ""
        selector = "spec.nodeName!="
        while not self.stop.is_set():
            try:
                if not resource_version:
                    self.refresh_nodes()
                    listed = self.kube.get("/api/v1/pods", fieldSelector=selector)
                    for pod in listed["items"]:
                        self.handle("ADDED", pod)
                    resource_version = listed["metadata"]["resourceVersion"]
                    self.ready.set()
                for event in self.kube.watch("/api/v1/pods", resource_version, timeout_seconds=WATCH_SECONDS,
                                             fieldSelector=selector):
                    if self.stop.is_set():
                        return
                    obj = event["object"]
                    resource_version = obj["metadata"].get("resourceVersion", resource_version)
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.handle(event["type"], obj)
            except ApiError as error:
                if not error.gone:
                    log.warning("pod watch failed (%s); relisting", error)
                    self.stop.wait(1.0)
                resource_version = ""
            except (OSError, ValueError) as error:
                log.warning("pod watch interrupted (%s); relisting", error)
                resource_version = ""
                self.stop.wait(1.0)

    # ------------------------------------------------------------------ logs
    def find_log(self, namespace: str, pod: str, container: str, previous: bool) -> Path | str:
        """The log ``kubectl logs`` asks for, or the kubelet's kind of answer why there is none."""
        with self._lock:
            uid = next((w.uid for w in self.workers.values() if (w.namespace, w.name) == (namespace, pod)), None)
        path = find_container_log(self.testbed_dir, namespace, pod, container, previous=previous, uid=uid)
        if path is not None:
            return path
        if previous:
            return f'previous terminated container "{container}" in pod "{pod}" not found'
        return f'container "{container}" in pod "{pod}" is waiting to start: no log yet'


def _pod_directories(testbed_dir: Path, namespace: str, pod: str) -> list[Path]:
    """The directories of every pod of that name, oldest first (names and namespaces hold no ``_``)."""
    found = [p for p in (root_of(testbed_dir) / "pods").glob(f"{namespace}_{pod}_*") if p.is_dir()]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def find_container_log(testbed_dir: Path, namespace: str, pod: str, container: str, *, previous: bool = False,
                       uid: str | None = None) -> Path | None:
    """The log file of the container's latest run (``previous``: the run before it) of the pod with ``uid``,
    else of the most recent pod of that name."""
    directories = ([root_of(testbed_dir) / "pods" / f"{namespace}_{pod}_{uid}"] if uid
                   else _pod_directories(testbed_dir, namespace, pod)[-1:])
    for directory in directories:
        runs = sorted((p for p in (directory / container).glob("*.log") if decimal_digits(p.stem)),
                      key=lambda p: int(p.stem))
        if len(runs) > int(previous):
            return runs[-1 - int(previous)]
    return None


def container_log(testbed_dir: Path | str, namespace: str, pod: str, container: str, *, previous: bool = False) -> str:
    """The text a container wrote (stdout and stderr, in order) in its latest run; "" when it has none.
    Works after the pod is gone, which ``kubectl logs`` does not."""
    path = find_container_log(Path(testbed_dir), namespace, pod, container, previous=previous)
    return path.read_text(errors="replace") if path is not None else ""


def kill_leftovers(testbed_dir: Path | str, *, grace: float = 2.0, only_kubelet: str | None = None) -> list[int]:
    """Kill the container processes a process kubelet of this testbed left running (its pid files: the
    same process by start time, never a pid reused since), with their groups and the processes that carry
    their container's marker (``process_runtime.CONTAINER_MARKER``), SIGTERM then SIGKILL after ``grace``;
    returns their pids (``only_kubelet``: those of one kubelet, by its ``identity``). ``kubecell testbed down`` needs
    this only where a process kubelet was killed with SIGKILL: one stopped normally leaves nothing."""
    directory = root_of(Path(testbed_dir)) / "pids"
    targets: list[tuple[int, str, Path]] = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            entry = json.loads(path.read_text())
            pid, start, marker = int(entry["pid"]), entry.get("start"), str(entry.get("marker") or "")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if only_kubelet is not None and entry.get("kubelet") != only_kubelet:
            continue
        if start is None or process_start_time(pid) != start:
            path.unlink(missing_ok=True)  # gone, or the pid is another process now
            continue
        targets.append((pid, marker, path))
    for pid, marker, _ in targets:
        signal_container(pid, marker, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(process_start_time(pid) is not None for pid, _, _ in targets):
        for pid, _, _ in targets:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    for pid, marker, path in targets:
        signal_container(pid, marker, signal.SIGKILL)  # the group, and what left it (torchrun's workers)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        path.unlink(missing_ok=True)
    return [pid for pid, _, _ in targets]


@contextlib.contextmanager
def running_process_kubelet(state: Any, nodes: Collection[str] | None = None,
                            **options: Any) -> Iterator[ProcessKubelet]:
    """A process kubelet in this process's threads for a test: ``with running_process_kubelet(testbed,
    [node]) as kubelet:``; everything it started is ended when the block ends, also on a failure.
    ``state`` is the testbed's ``ControlPlaneState``; ``options`` go to :class:`ProcessKubelet`."""
    kube = Kube.from_kubeconfig(state.kubeconfig("kubelet"))
    kubelet = ProcessKubelet(kube, Path(state.directory), state.api_url, nodes=nodes, **options)
    try:
        kubelet.start()
        yield kubelet
    finally:
        kubelet.close()
        kube.close()


def start_detached(state: Any, nodes: Collection[str], *, timeout: float = READY_TIMEOUT) -> int:
    """Start ``python -m kubecell.testbed.process_kubelet`` for ``nodes`` of a running testbed as one of its
    servers (``kubecell testbed down`` stops it; it ends its processes on SIGTERM); returns its pid.

    Returns once the fake kubelet has let go of the nodes too (:data:`FAKE_KUBELET_NODE_REFRESH` after they
    were labelled), so that no pod created afterwards is seen by both kubelets."""
    from kubecell.testbed.control_plane import Server
    from kubecell.testbed.processes import spawn, tail

    names = sorted({name.strip() for name in nodes if name.strip()})
    kube = Kube.from_kubeconfig(state.admin_kubeconfig)
    try:
        existing = {item["metadata"]["name"] for item in kube.get("/api/v1/nodes")["items"]}
    finally:
        kube.close()
    missing = [name for name in names if name not in existing]
    if missing:
        raise TestbedError(f"--process-nodes: no node {', '.join(missing)} in the testbed (it has "
                           f"{', '.join(sorted(existing)[:5])}{' ...' if len(existing) > 5 else ''})")
    # Labelled first: the fake kubelet, already running, lets go of them at its next node refresh.
    kube = Kube.from_kubeconfig(state.admin_kubeconfig)
    try:
        for name in names:
            kube.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {RUNS_LABEL: RUNS_PROCESSES}}})
    finally:
        kube.close()
    labelled = time.monotonic()
    directory = Path(state.directory)
    log_file = directory / "logs" / "process-kubelet.log"
    ready = root_of(directory) / "ready"
    ready.unlink(missing_ok=True)
    process = spawn([sys.executable, "-m", "kubecell.testbed.process_kubelet", "--kubeconfig",
                     state.kubeconfig("kubelet"), "--testbed-dir", str(directory), "--api-url", state.api_url,
                     "--nodes", ",".join(names), "--ready-file", str(ready)], log_file, env=dict(os.environ))
    deadline = time.monotonic() + timeout
    while not ready.is_file():
        if process.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            raise TestbedError(f"the process kubelet did not start (log {log_file}):\n{tail(log_file)}")
        time.sleep(0.1)
    state.servers.append(Server("process-kubelet", process.pid, sys.executable, str(log_file),
                                f"https://127.0.0.1:{ready.read_text().strip()}"))
    state.extra["process_nodes"] = names
    state.save()
    time.sleep(max(0.0, labelled + FAKE_KUBELET_NODE_REFRESH + 0.5 - time.monotonic()))
    return process.pid


def main(argv: list[str] | None = None) -> None:
    """``python -m kubecell.testbed.process_kubelet --kubeconfig FILE --testbed-dir DIR --api-url URL
    [--nodes a,b]``: run until SIGTERM, then end every process started."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--testbed-dir", required=True, type=Path)
    parser.add_argument("--api-url", required=True)
    parser.add_argument("--nodes", default=None, help="comma-separated node names (default: the labelled nodes)")
    parser.add_argument("--ready-file", type=Path, default=None, help="written with the HTTPS port once serving")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    nodes = [name for name in args.nodes.split(",") if name] if args.nodes else None
    kube = Kube.from_kubeconfig(args.kubeconfig)
    kubelet = ProcessKubelet(kube, args.testbed_dir, args.api_url, nodes=nodes)
    signal.signal(signal.SIGTERM, lambda *_: kubelet.stop.set())
    signal.signal(signal.SIGINT, lambda *_: kubelet.stop.set())
    kubelet.start()
    if args.ready_file is not None:
        args.ready_file.write_text(f"{kubelet.port}\n")
    log.info("process kubelet running for %s", ", ".join(nodes) if nodes else OWNED_SELECTOR)
    while not kubelet.stop.wait(1.0):
        pass
    kubelet.close()
    kube.close()


if __name__ == "__main__":
    main()
