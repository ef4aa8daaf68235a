"""``kubecell testbed up / status / down``: the control plane (etcd, kube-apiserver, kube-controller-manager,
optionally kube-scheduler), the nodes and the fake kubelet together.

``up`` returns once the API server is ready, every node is registered and the fake kubelet runs (as
its own process, so the testbed outlives the command); the admin kubeconfig is printed and kept at a
known path. ``down`` stops every process ``up`` started, found through ``state.json``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubecell.kube.rest import Kube
from kubecell.testbed import process_kubelet
from kubecell.testbed.build import ensure_binaries
from kubecell.testbed.control_plane import ControlPlane, ControlPlaneState, Server, stop_state
from kubecell.testbed.kubelet import register_nodes
from kubecell.testbed.nodes import load_cluster_nodes, node_manifest
from kubecell.testbed.paths import default_state_dir
from kubecell.testbed.processes import spawn


@dataclass(frozen=True, slots=True)
class UpResult:
    state: ControlPlaneState
    nodes: int
    seconds: float


def up(cluster: str, *, nodes: int | None = None, directory: Path | None = None, kube_scheduler: bool = False,
       controller_manager: bool = True, log: Callable[[str], None] = print) -> UpResult:
    """Build what is missing, start the control plane, register the cluster's nodes, start the kubelet.

    ``controller_manager`` (on by default, as in any real cluster) runs kube-controller-manager, so that
    Deployments, Jobs and StatefulSets get pods, owners' dependents are garbage-collected and deleted
    namespaces are emptied; leave it off to measure a scheduler alone against the API server."""
    started = time.monotonic()
    directory = directory or default_state_dir()
    cluster_nodes = load_cluster_nodes(cluster, nodes)  # bad input fails before anything starts
    binaries = ensure_binaries(log=log)
    plane = ControlPlane(directory, binaries)
    state = plane.start(kube_scheduler=kube_scheduler, controller_manager=controller_manager)
    try:
        kube = Kube.from_kubeconfig(state.admin_kubeconfig)
        try:
            count = register_nodes(kube, (node_manifest(node) for node in cluster_nodes))
        finally:
            kube.close()
        kubelet_log = Path(state.directory) / "logs" / "kubelet.log"
        process = spawn([sys.executable, "-m", "kubecell.testbed.kubelet", "--kubeconfig",
                         state.kubeconfig("kubelet")], kubelet_log, env=dict(os.environ))
        state.servers.append(Server("fake-kubelet", process.pid, sys.executable, str(kubelet_log)))
        state.extra["cluster"] = cluster
        state.extra["nodes"] = count
        state.save()
    except BaseException:
        plane.stop()
        raise
    return UpResult(state, count, time.monotonic() - started)


def status(directory: Path | None = None) -> ControlPlaneState | None:
    return ControlPlaneState.load(directory or default_state_dir())


def down(directory: Path | None = None) -> list[str]:
    """Stop a running testbed; returns the names of the processes that were still running."""
    state = status(directory)
    if state is None:
        return []
    running = [server.name for server in state.running()]
    stop_state(state)
    # A process kubelet killed with SIGKILL cannot end its containers: its pid files name them.
    process_kubelet.kill_leftovers(Path(state.directory))
    return running


def clear_pods(kube: Kube, namespace: str, *, timeout: float = 300.0) -> None:
    """Delete a namespace's pods at once and wait until they are gone, so that a benchmark's next round
    starts on the same free cluster (bounded by ``timeout``)."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    kube.delete(path, gracePeriodSeconds=0)
    deadline = time.monotonic() + timeout
    while kube.get(path, limit=1)["items"] and time.monotonic() < deadline:
        time.sleep(1.0)
