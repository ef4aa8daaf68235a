"""``kubecell node-agent`` as a whole, on the real API server behind a fake kubelet: it publishes the fake
GPUs with its capabilities, registers its device plugins, serves pods from their records, follows an
XID into both the kubelet's device list and the scheduler's view, and a restarted agent goes on.

The Node is registered as a kubelet registers it before any device plugin did (CPU, memory and pods; no GPU
resource, no inventory), and :func:`kubelet_node_status` then writes the fake kubelet's device-plugin
resources into its status as a real kubelet does: the scheduler never offers more GPUs than a node
advertises (``kubecell.kube.advertised``), so a harness whose Node advertised a fixed count would hide the
agent's devices behind it (a MIG node's 14 instances behind 2 GPUs)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

from kubecell.core.model import Node
from kubecell.kube import pods
from kubecell.kube.inventory import node_view
from kubecell.kube.names import ANNOTATION_ACK
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.agent import AgentOptions, NodeAgent
from kubecell.node.fake_kubelet import FakeKubelet
from kubecell.node.fake_nvml import FakeNvml, example_path
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.deploy_support import DEPLOY, kubectl, service_account_kubeconfig
from tests.support import registered_node, wait_for


@dataclass
class Running:
    name: str
    backend: FakeNvml
    kubelet: FakeKubelet
    root: Path
    agent: NodeAgent
    stop: threading.Event
    thread: threading.Thread


def start_agent(kube: Kube, name: str, backend: FakeNvml, kubelet: FakeKubelet, root: Path) -> Running:
    options = AgentOptions(node=name, isolation=("accounting", "mps"), device_plugin_dir=kubelet.directory,
                           pod_resources=kubelet.pod_resources, mps_root=root / "mps", interval=2.0,
                           settle_seconds=0.5)
    agent = NodeAgent(kube, backend, options)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True, name="node-agent")
    thread.start()
    return Running(name, backend, kubelet, root, agent, stop, thread)


STATUS_INTERVAL = 0.1
"""How often the harness's kubelet compares its device counts with what it last wrote on the Node. A real
kubelet writes its node status every ``nodeStatusUpdateFrequency`` (10 s by default); tests need not wait."""


def kubelet_node_status(kube: Kube, name: str, kubelet: FakeKubelet, stop: threading.Event) -> threading.Thread:
    """The part of a kubelet's node-status loop that reports device-plugin resources: for every resource a
    plugin registered, ``status.capacity`` counts all its devices and ``status.allocatable`` the healthy ones
    (the kubelet's ``devicemanager.GetCapacity``), written whenever they change until ``stop`` is set."""

    def run() -> None:
        written: tuple[dict[str, int], dict[str, int]] = ({}, {})
        while not stop.is_set():
            now = (kubelet.capacity(), kubelet.allocatable())
            if now != written:
                capacity, allocatable = now
                try:
                    kube.patch(f"/api/v1/nodes/{name}/status", {"status": {
                        "capacity": {resource: str(count) for resource, count in capacity.items()},
                        "allocatable": {resource: str(count) for resource, count in allocatable.items()}}})
                    written = now
                except ApiError:  # a conflict or the Node going away at the end of a test: try again, or stop
                    pass
            stop.wait(STATUS_INTERVAL)

    thread = threading.Thread(target=run, daemon=True, name=f"kubelet-status-{name}")
    thread.start()
    return thread


@contextlib.contextmanager
def agent_node(kube: Kube, example: str, prefix: str, *, agent_kube: Kube | None = None,
               agent_for: Callable[[str], Kube] | None = None) -> Iterator[Running]:
    """A registered Node, a fake kubelet reporting its device plugins' resources on it, and the whole agent
    with the fake ``example``'s GPUs; all removed afterwards.

    The Node starts as a kubelet registers it before any plugin did: CPU, memory and pods, no GPU resource
    and no inventory annotation (the agent writes that). ``agent_kube``: the agent's own client (default: the
    admin's); ``agent_for``: made from the node's name once the Node exists (a token bound to a pod there)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    with registered_node(kube, node_manifest(Node(name, 96_000, 512_000, labels={"kubecell.io/test-node": name}))):
        root = Path(tempfile.mkdtemp(dir="/tmp", prefix=f"{prefix}-"))
        kubelet = FakeKubelet(root / "dp", root / "pr" / "kubelet.sock").start()
        reporting = threading.Event()
        status = kubelet_node_status(kube, name, kubelet, reporting)
        client = agent_for(name) if agent_for is not None else agent_kube or kube
        agent = start_agent(client, name, FakeNvml.from_file(example_path(example)), kubelet, root)
        try:
            yield agent
        finally:
            agent.stop.set()
            agent.thread.join(10)
            reporting.set()
            status.join(10)
            kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def running(kube: Kube) -> Iterator[Running]:
    with agent_node(kube, "a100-nvlink", "na") as agent:
        yield agent


def view(kube: Kube, name: str) -> Any:
    return node_view(kube.get(f"/api/v1/nodes/{name}"))


def make(kube: Kube, namespace: str, name: str, node: str, limits: dict[str, str]) -> None:
    kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubecell.io/test-node": node},
                 "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}})


def admit_when_bound(r: Running, kube: Kube, namespace: str, name: str, requests: dict[str, int]) -> dict[str, str]:
    wait_for(f"{name} bound", lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")["spec"].get("nodeName"))
    admitted = r.kubelet.admit(namespace, name, "main", requests)
    return dict(next(iter(admitted.allocations.values())).envs)


def _unhealthy_in_book(scheduler: Scheduler, node: str, gpu: int) -> bool:
    engine = scheduler.engine
    if engine is None or node not in engine.book.index:
        return False
    return not bool(engine.book.gpu_healthy[engine.book.index[node], gpu])


def test_the_agent_publishes_serves_and_follows_health(
        testbed: ControlPlaneState, kube: Kube, namespace: str, running: Running,
        start_scheduler: type[RunningScheduler]) -> None:
    r = running
    uuids = [d.uuid for d in r.backend.devices()]
    published = wait_for("the agent's inventory", lambda: view(kube, r.name) if view(kube, r.name).uuids == tuple(
        uuids) else None)
    assert published.serial_binds
    assert published.isolation == ("accounting",)  # mps was asked for, but fake GPUs run no MPS daemon
    assert published.node.nvlink_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    r.kubelet.wait_for(lambda: r.kubelet.capacity().get("kubecell.io/gpu") == 8
                       and r.kubelet.capacity().get("kubecell.io/gpu-milli") == 8000, 10, "devices advertised")
    scheduler = start_scheduler(testbed).scheduler
    make(kube, namespace, "two", r.name, {"kubecell.io/gpu": "2"})
    env = admit_when_bound(r, kube, namespace, "two", {"kubecell.io/gpu": 2})
    record = pods.record_of(kube.get(f"/api/v1/namespaces/{namespace}/pods/two"))
    assert record is not None
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in record.gpus)
    assert {g.index for g in record.gpus} <= {0, 1, 2, 3} or {g.index for g in record.gpus} <= {4, 5, 6, 7}

    victim = next(i for i in range(8) if uuids[i] not in env["NVIDIA_VISIBLE_DEVICES"])
    r.backend.inject_xid(victim, 79)  # "GPU has fallen off the bus"
    r.kubelet.wait_for(lambda: r.kubelet.allocatable().get("kubecell.io/gpu") == 7, 10,
                       "the kubelet sees the GPU unhealthy")
    wait_for("the node's published view marks it unhealthy",
             lambda: not view(kube, r.name).node.gpus[victim].healthy, 15)
    # The scheduler learns it from its node watch, which the pods' watch may outrun: a pod created before the
    # scheduler has read the change may be bound onto the bad GPU (there a kubelet refuses it at admission),
    # so the pods below are made only once the scheduler's own book has it.
    wait_for("the scheduler's book marks it unhealthy", lambda: _unhealthy_in_book(scheduler, r.name, victim), 15)
    make(kube, namespace, "six", r.name, {"kubecell.io/gpu": "6"})  # only 5 healthy GPUs are free: waits
    make(kube, namespace, "five", r.name, {"kubecell.io/gpu": "5"})
    env = admit_when_bound(r, kube, namespace, "five", {"kubecell.io/gpu": 5})
    assert uuids[victim] not in env["NVIDIA_VISIBLE_DEVICES"]
    assert not kube.get(f"/api/v1/namespaces/{namespace}/pods/six")["spec"].get("nodeName")


def test_a_restarted_agent_serves_on_from_the_annotations(
        testbed: ControlPlaneState, kube: Kube, namespace: str, running: Running,
        start_scheduler: type[RunningScheduler]) -> None:
    r = running
    r.kubelet.wait_for(lambda: r.kubelet.capacity().get("kubecell.io/gpu-milli") == 8000, 15, "shares advertised")
    start_scheduler(testbed)
    make(kube, namespace, "first", r.name, {"kubecell.io/gpu-milli": "500"})
    admit_when_bound(r, kube, namespace, "first", {"kubecell.io/gpu-milli": 500})
    r.stop.set()
    r.thread.join(10)
    make(kube, namespace, "second", r.name, {"kubecell.io/gpu-milli": "500"})
    again = start_agent(kube, r.name, r.backend, r.kubelet, r.root)
    try:
        r.kubelet.wait_for(lambda: r.kubelet.registrations.get("kubecell.io/gpu-milli", 0) >= 2
                           and r.kubelet.capacity().get("kubecell.io/gpu-milli") == 8000, 15,
                           "the new agent registered again")
        env = admit_when_bound(again, kube, namespace, "second", {"kubecell.io/gpu-milli": 500})
        pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/second")
        record = pods.record_of(pod)
        assert record is not None
        assert env["KUBECELL_ALLOCATION_ID"] == record.allocation_id == pod["metadata"]["annotations"][ANNOTATION_ACK]
    finally:
        again.stop.set()
        again.thread.join(10)


def test_a_restarted_agent_acknowledges_a_pod_admitted_across_its_restart(
        testbed: ControlPlaneState, kube: Kube, namespace: str, running: Running,
        start_scheduler: type[RunningScheduler]) -> None:
    r = running
    r.kubelet.wait_for(lambda: r.kubelet.capacity().get("kubecell.io/gpu") == 8, 15, "GPUs advertised")
    start_scheduler(testbed)
    kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two", "namespace": namespace},
        "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubecell.io/test-node": r.name},
                 "containers": [{"name": name, "image": "x", "resources": {"limits": {"kubecell.io/gpu": "1"}}}
                                for name in ("a", "b")]}})
    wait_for("two bound", lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/two")["spec"].get("nodeName"))
    r.kubelet.admit(namespace, "two", "a", {"kubecell.io/gpu": 1})
    r.stop.set()
    r.thread.join(10)
    again = start_agent(kube, r.name, r.backend, r.kubelet, r.root)
    try:
        r.kubelet.wait_for(lambda: r.kubelet.registrations.get("kubecell.io/gpu", 0) >= 2
                           and r.kubelet.connected("kubecell.io/gpu")
                           and r.kubelet.allocatable().get("kubecell.io/gpu") == 8, 15, "registered again")
        r.kubelet.admit(namespace, "two", "b", {"kubecell.io/gpu": 1})
        pod = wait_for("two acknowledged by the new agent's housekeeping", lambda: (
            lambda p: p if ANNOTATION_ACK in p["metadata"]["annotations"] else None)(
            kube.get(f"/api/v1/namespaces/{namespace}/pods/two")))
        record = pods.record_of(pod)
        assert record is not None
        assert pod["metadata"]["annotations"][ANNOTATION_ACK] == record.allocation_id
    finally:
        again.stop.set()
        again.thread.join(10)


def does_its_work(r: Running, kube: Kube, namespace: str, start_scheduler: Callable[[], object]) -> None:
    """The agent publishes the inventory and the GPU memory, and serves and acknowledges a pod (``one``) the
    scheduler places on its node."""
    wait_for("the inventory published by the agent", lambda: len(view(kube, r.name).uuids) == 8)
    wait_for("the GPU memory on the node's status", lambda: kube.get(f"/api/v1/nodes/{r.name}")["status"]
             .get("capacity", {}).get("kubecell.io/gpu-memory"))
    start_scheduler()
    make(kube, namespace, "one", r.name, {"kubecell.io/gpu": "1"})
    admit_when_bound(r, kube, namespace, "one", {"kubecell.io/gpu": 1})
    record = pods.record_of(kube.get(f"/api/v1/namespaces/{namespace}/pods/one"))
    assert record is not None
    wait_for("the agent's acknowledgement on the pod", lambda: kube.get(
        f"/api/v1/namespaces/{namespace}/pods/one")["metadata"].get("annotations", {}).get(
        ANNOTATION_ACK) == record.allocation_id)


def test_the_shipped_rbac_is_enough_for_the_agent(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                  start_scheduler: type[RunningScheduler], tmp_path: Path) -> None:
    """The agent with a token of its ServiceAccount, bound only by deploy/node-agent's RBAC: it publishes the
    inventory and the GPU memory, serves a pod and acknowledges it; and may not write pods' specs or Secrets."""
    directory = DEPLOY / "node-agent"
    kubectl(testbed, "apply", "-f", str(directory / "namespace.yaml"))
    kubectl(testbed, "apply", "-f", str(directory / "rbac.yaml"))
    as_agent = Kube.from_kubeconfig(service_account_kubeconfig(testbed, kube, tmp_path / "agent.kubeconfig",
                                                               "kubecell-node-agent", namespace="kubecell-node"))
    try:
        with agent_node(kube, "a100-nvlink", "rbac", agent_kube=as_agent) as r:
            does_its_work(r, kube, namespace, lambda: start_scheduler(testbed))
            for attempt in (partial(as_agent.get, "/api/v1/namespaces/kube-system/secrets"),
                            partial(as_agent.delete, f"/api/v1/namespaces/{namespace}/pods/one"),
                            partial(as_agent.create, f"/api/v1/namespaces/{namespace}/pods", {
                                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "intruder"},
                                "spec": {"containers": [{"name": "c", "image": "x"}]}})):
                with pytest.raises(ApiError) as refused:
                    attempt()
                assert refused.value.status == 403
    finally:
        as_agent.close()
        kubectl(testbed, "delete", "-f", str(directory / "rbac.yaml"), "--ignore-not-found")
