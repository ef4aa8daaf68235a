"""etcd, kube-apiserver, kube-controller-manager and (optionally) the stock kube-scheduler on 127.0.0.1.

The flags follow what Kubernetes' own integration tests and controller-runtime's envtest pass, with
RBAC authorization on (so least-privilege manifests are tested for real), our own CA and serving
certificate, a service-account signing key and static tokens per client. The state of a running
control plane (ports, pids, credential paths) is written to ``state.json`` in its directory so that
another process (``kubecell testbed status``/``down``, a test worker) can find it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubecell.testbed import pki as pki_files
from kubecell.testbed.build import Binaries
from kubecell.testbed.processes import TestbedError, alive, free_port, spawn, stop, wait_http

START_TIMEOUT = 120.0
"""Seconds a server may take to become ready; kube-apiserver needs ~5-15 s on an idle 2-core machine,
much more while a build or a test run competes for the CPU."""

SERVICE_CIDR = "10.96.0.0/16"

TERMINATED_POD_GC_THRESHOLD = 1_000_000
"""Terminated pods kept before kube-controller-manager's pod GC deletes the oldest (upstream: 12,500).
Tests and trace replays count Succeeded and Failed pods, and a replay of a large trace leaves more than
12,500 of them; the testbed clears its pods itself (``clear_pods``, the test namespaces)."""

CONTROLLERS = "*,-node-lifecycle-controller,-ttl-controller"
"""kube-controller-manager's ``--controllers``: every on-by-default controller but two.

- ``node-lifecycle-controller`` off: the testbed's nodes are registered by hand and served by the fake
  kubelet, whose Leases and node conditions are not a real kubelet's heartbeat (no status updates, a
  Lease loop paced for 5,000 nodes); the controller would second-guess them into ``not-ready`` or
  ``unreachable`` taints and evict pods mid-test. Tests taint nodes themselves where they need to.
- ``ttl-controller`` off: it writes the ``node.alpha.kubernetes.io/ttl`` annotation on every Node (and
  again on all of them each time the node count crosses 100, 500, 1,000, 2,000...), a cache hint only a
  real kubelet reads; the fake kubelet reads none, and the writes would reach the schedulers under test
  (and benchmarks) as node updates that never happen on the hand-registered cluster.

Everything else runs as in a real cluster: Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, CronJob
and ``ttl-after-finished`` controllers, the garbage collector, namespace, service-account (token), root
CA publisher, endpoint(slice), disruption (PodDisruptionBudget status), resource quota, pod GC (orphans of
deleted nodes included: fine, a real cluster does the same) and taint eviction (``NoExecute`` taints a test
sets are honoured). ``node-ipam-controller`` stays in the list but is inert (``--allocate-node-cidrs=false``)
and the cloud node lifecycle controller is not part of kube-controller-manager v1.37 (it is
cloud-controller-manager's, which never runs here; no ``--cloud-provider`` is set). The CSR signing
controller skips itself: no ``--cluster-signing-*`` files are given, since every testbed client
authenticates with a static token and no test needs a certificate signed (the CA key never leaves
``pki.create``)."""


@dataclass
class Server:
    name: str
    pid: int
    executable: str
    log: str
    url: str = ""
    command: list[str] = field(default_factory=list)


@dataclass
class ControlPlaneState:
    """What ``state.json`` holds: enough for any process to use or stop the control plane."""

    directory: str
    api_url: str
    admin_kubeconfig: str
    servers: list[Server] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def kubeconfig(self, identity: str) -> str:
        return str(Path(self.directory) / "pki" / f"{identity}.kubeconfig")

    def save(self) -> None:
        path = Path(self.directory) / "state.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self), indent=2))
        os.replace(partial, path)

    @classmethod
    def load(cls, directory: Path) -> ControlPlaneState | None:
        path = directory / "state.json"
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        raw["servers"] = [Server(**server) for server in raw.get("servers", [])]
        return cls(**raw)

    def running(self) -> list[Server]:
        return [server for server in self.servers if alive(server.pid, server.executable)]


class ControlPlane:
    """Start and stop one control plane in ``directory`` (created; wiped of a previous run's data)."""

    def __init__(self, directory: Path, binaries: Binaries) -> None:
        self.directory = directory
        self.binaries = binaries
        self.state: ControlPlaneState | None = None

    def start(self, *, kube_scheduler: bool = False, controller_manager: bool = True) -> ControlPlaneState:
        """Start etcd and kube-apiserver, then kube-controller-manager and the stock kube-scheduler when
        asked; every server is stopped again if any of them fails to start."""
        previous = ControlPlaneState.load(self.directory)
        if previous is not None and previous.running():
            raise TestbedError(f"a testbed is already running in {self.directory} ({previous.api_url}); "
                               "stop it first ('kubecell testbed down')")
        for stale in ("etcd-data", "pki", "logs", "flexvolume", "state.json"):
            target = self.directory / stale
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        self.directory.mkdir(parents=True, exist_ok=True)
        api_port = free_port()
        api_url = f"https://127.0.0.1:{api_port}"
        credentials = pki_files.create(self.directory / "pki", api_url)
        state = ControlPlaneState(str(self.directory), api_url, str(credentials.kubeconfig("admin")))
        self.state = state
        try:
            self._start_etcd(state)
            self._start_apiserver(state, credentials, api_port)
            if controller_manager:
                self.start_controller_manager()
            if kube_scheduler:
                self.start_kube_scheduler()
        except BaseException:
            self.stop()
            raise
        return state

    def _logs(self) -> Path:
        return self.directory / "logs"

    def _start_etcd(self, state: ControlPlaneState) -> None:
        client, peer = free_port(), free_port()
        log = self._logs() / "etcd.log"
        url = f"http://127.0.0.1:{client}"
        command = [
            str(self.binaries.etcd), "--name=testbed", f"--data-dir={self.directory / 'etcd-data'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=testbed=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level=warn",
            "--quota-backend-bytes=8589934592",
        ]
        process = spawn(command, log)
        state.servers.append(Server("etcd", process.pid, str(self.binaries.etcd), str(log), url, command))
        state.save()
        wait_http(f"{url}/health", process=process, log=log, timeout=START_TIMEOUT)

    def _start_apiserver(self, state: ControlPlaneState, credentials: pki_files.Pki, port: int) -> None:
        etcd = next(server for server in state.servers if server.name == "etcd")
        log = self._logs() / "kube-apiserver.log"
        command = [
            str(self.binaries.kube_apiserver), f"--etcd-servers={etcd.url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--tls-cert-file={credentials.serving_cert}", f"--tls-private-key-file={credentials.serving_key}",
            f"--cert-dir={self.directory / 'pki'}", f"--token-auth-file={credentials.token_file}",
            "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={credentials.service_account_key}",
            f"--service-account-signing-key-file={credentials.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount", "--endpoint-reconciler-type=none",
            "--profiling=false", "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
            "--v=1",
        ]
        process = spawn(command, log)
        state.servers.append(Server("kube-apiserver", process.pid, str(self.binaries.kube_apiserver), str(log),
                                    state.api_url, command))
        state.save()
        wait_http(f"{state.api_url}/readyz", process=process, log=log, timeout=START_TIMEOUT,
                  token=credentials.tokens["admin"], ca=credentials.ca_cert)

    def start_controller_manager(self) -> Server:
        """kube-controller-manager, ready once its controllers write (see :data:`CONTROLLERS`)."""
        state = self._require_state()
        pki = Path(state.directory) / "pki"
        port = free_port()
        log = self._logs() / "kube-controller-manager.log"
        kubeconfig = state.kubeconfig("kube-controller-manager")
        command = [
            str(self.binaries.kube_controller_manager),
            # Its own identity (system:kube-controller-manager, bound by the bootstrap policy), also for
            # delegated authentication/authorization of its secure port, as kube-scheduler's.
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            # ... but no client-CA lookup: the API server publishes no extension-apiserver-authentication
            # ConfigMap (it has no --client-ca-file), and the lookup would only log an error for each try.
            "--authentication-skip-lookup=true",
            # Loopback only; a free port (two testbeds may run at once, and 10257 may be taken).
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            # One instance: no Lease to win, and no Lease renewal written every 2 s in kube-system.
            "--leader-elect=false",
            # Each controller acts as its own ServiceAccount with its own RBAC role, as in a real cluster
            # (a controller that lacks a permission fails here as it would there).
            "--use-service-account-credentials=true",
            # The API server's signing key (it verifies with the same file): the serviceaccount-token
            # controller signs legacy token Secrets with it; the CA goes into them and into the
            # kube-root-ca.crt ConfigMap published in every namespace.
            f"--service-account-private-key-file={pki / 'service-account.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--controllers={CONTROLLERS}",
            # No cluster CIDR is configured: nodes get no podCIDR (the fake kubelet assigns pod IPs itself).
            "--allocate-node-cidrs=false",
            # The volume plugin probe creates this directory: inside the state directory, not /usr/libexec.
            f"--flex-volume-plugin-dir={self.directory / 'flexvolume'}",
            f"--terminated-pod-gc-threshold={TERMINATED_POD_GC_THRESHOLD}",
            # The client rate limits stay upstream's (20 QPS, burst 30, per controller): the controllers pace
            # their work as in a real cluster, and the namespace controller's ~100 requests per deleted
            # namespace (every test namespace, at teardown) stay in the background of the tests that follow.
            "--profiling=false", "--v=1",
        ]
        process = spawn(command, log)
        server = Server("kube-controller-manager", process.pid, str(self.binaries.kube_controller_manager), str(log),
                        f"https://127.0.0.1:{port}", command)
        state.servers.append(server)
        state.save()
        wait_http(f"{server.url}/healthz", process=process, log=log, timeout=START_TIMEOUT, verify=False)
        # Healthy is not yet working: the controllers start once their ServiceAccount tokens and informer
        # caches are there. The service-account controller creating default/default shows that they do, so a
        # Deployment created right after start is not left waiting on an idle controller manager.
        wait_http(f"{state.api_url}/api/v1/namespaces/default/serviceaccounts/default", process=process, log=log,
                  timeout=START_TIMEOUT, token=pki_files.read_token(Path(state.admin_kubeconfig)),
                  ca=pki / "ca.crt")
        return server

    def start_kube_scheduler(self, config: Path | None = None) -> Server:
        """The stock kube-scheduler (``default-scheduler``), optionally with a KubeSchedulerConfiguration."""
        state = self._require_state()
        port = free_port()
        log = self._logs() / "kube-scheduler.log"
        kubeconfig = state.kubeconfig("kube-scheduler")
        command = [str(self.binaries.kube_scheduler), f"--authentication-kubeconfig={kubeconfig}",
                   f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                   f"--secure-port={port}", "--v=1"]
        # Client rate limits as scheduler_perf sets them (the defaults, 50 QPS, would cap binds at 50 pods/s).
        command += [f"--config={config}"] if config else [f"--kubeconfig={kubeconfig}", "--leader-elect=false",
                                                           "--kube-api-qps=5000", "--kube-api-burst=5000"]
        process = spawn(command, log)
        server = Server("kube-scheduler", process.pid, str(self.binaries.kube_scheduler), str(log),
                        f"https://127.0.0.1:{port}", command)
        state.servers.append(server)
        state.save()
        wait_http(f"{server.url}/healthz", process=process, log=log, timeout=START_TIMEOUT, verify=False)
        return server

    @classmethod
    def attach(cls, state: ControlPlaneState, binaries: Binaries) -> ControlPlane:
        """Drive a control plane already running (e.g. to start a configured kube-scheduler on it)."""
        plane = cls(Path(state.directory), binaries)
        plane.state = state
        return plane

    def stop_server(self, server: Server) -> None:
        """Stop one server this plane started (a kube-scheduler a test or bench is done with)."""
        state = self._require_state()
        stop(server.pid, server.executable)
        state.servers = [s for s in state.servers if s.pid != server.pid]
        state.save()

    def _require_state(self) -> ControlPlaneState:
        if self.state is None:
            raise TestbedError("the control plane is not started")
        return self.state

    def stop(self) -> None:
        if self.state is not None:
            stop_state(self.state)


def stop_state(state: ControlPlaneState) -> None:
    """Stop every server of ``state`` in reverse start order (clients before etcd)."""
    for server in reversed(state.servers):
        stop(server.pid, server.executable)
    state.servers = []
    state.save()


def restart_server(state: ControlPlaneState, name: str, *, down_seconds: float = 0.0) -> Server:
    """Stop one server (SIGTERM, then SIGKILL) and start it again with the same command, e.g. to test
    that clients survive an API server restart (their watches drop, their requests fail meanwhile)."""
    server = next((s for s in state.servers if s.name == name), None)
    if server is None or not server.command:
        raise TestbedError(f"no restartable server {name!r} in {state.directory}")
    stop(server.pid, server.executable)
    if down_seconds:
        time.sleep(down_seconds)
    process = spawn(server.command, Path(server.log))
    server.pid = process.pid
    state.save()
    if name == "kube-apiserver":
        token = pki_files.read_token(Path(state.admin_kubeconfig))
        wait_http(f"{state.api_url}/readyz", process=process, log=Path(server.log), timeout=START_TIMEOUT,
                  token=token, ca=Path(state.directory) / "pki" / "ca.crt")
    return server
