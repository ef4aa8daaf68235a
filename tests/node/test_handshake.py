"""The scheduler/device-plugin handshake end to end: kubecell's scheduler on the real API server binds GPU
pods to an agent-served node one at a time; the device plugin (behind a fake kubelet speaking the real
protos) serves each from its allocation record, acknowledges it, and refuses what it cannot trust."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

from kubecell.core.model import GPU_MODELS, Gpu, Node
from kubecell.kube import pods
from kubecell.kube.inventory import inventory_of
from kubecell.kube.names import ANNOTATION_ACK, ANNOTATION_ALLOCATION, ANNOTATION_INVENTORY
from kubecell.kube.rest import Kube
from kubecell.node.allocator import RecordAllocator
from kubecell.node.deviceplugin import Device, DeviceFeed, DevicePlugin, milli_devices
from kubecell.node.fake_kubelet import AdmissionFailed, FakeKubelet
from kubecell.node.isolation import NodeIsolation
from kubecell.node.podresources import PodResourcesClient
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from tests.cluster_fixtures import RunningScheduler
from tests.support import registered_node, wait_for

GPUS = 4


@dataclass
class AgentNode:
    name: str
    uuids: list[str]
    kubelet: FakeKubelet
    allocator: RecordAllocator


@pytest.fixture
def agent(kube: Kube) -> Iterator[AgentNode]:
    """A node whose inventory says kubecell's device plugin serves it, the plugin for kubecell.io/gpu and
    kubecell.io/gpu-milli registered with a fake kubelet, and the record-reading allocator behind it."""
    name = f"dp-{uuid.uuid4().hex[:6]}"
    model = GPU_MODELS["A100"]
    node = Node(name, 64_000, 256_000, tuple(Gpu(i, "A100", model.memory_mib) for i in range(GPUS)),
                labels={"kubecell.io/test-node": name})
    uuids = [f"GPU-{uuid.uuid4()}" for _ in range(GPUS)]
    manifest = node_manifest(node)
    inventory = inventory_of(node, uuids, agent="kubecell-node-agent/test").model_copy(
        update={"device_plugin": True, "isolation": ["accounting", "mps"]})
    manifest["metadata"]["annotations"][ANNOTATION_INVENTORY] = inventory.to_annotation()
    with registered_node(kube, manifest):
        root = Path(tempfile.mkdtemp(dir="/tmp", prefix="kc-"))
        kubelet = FakeKubelet(root / "dp", root / "pr" / "kubelet.sock").start()
        client = PodResourcesClient(kubelet.pod_resources, timeout=5)
        allocator = RecordAllocator(kube, name, lambda: dict.fromkeys(uuids, model.memory_mib),
                                    NodeIsolation(("accounting", "mps"), mps_root=root / "mps"),
                                    verify=client.get, verify_after=0.2)
        whole = [Device(u, True, (0,)) for u in uuids]
        plugins = [DevicePlugin("kubecell.io/gpu", DeviceFeed(whole), allocator, directory=kubelet.directory,
                                poll_interval=0.05),
                   DevicePlugin("kubecell.io/gpu-milli", DeviceFeed(milli_devices(whole)), allocator,
                                directory=kubelet.directory, poll_interval=0.05)]
        for plugin in plugins:
            plugin.start()
        kubelet.wait_for(lambda: kubelet.connected("kubecell.io/gpu") and kubelet.connected("kubecell.io/gpu-milli"),
                         10, "both plugins registered")
        try:
            yield AgentNode(name, uuids, kubelet, allocator)
        finally:
            for plugin in plugins:
                plugin.stop()
            kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)


def make(kube: Kube, namespace: str, name: str, node: str, limits: dict[str, str],
         annotations: dict[str, str] | None = None, **spec: Any) -> None:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubecell.io/test-node": node},
                     "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}], **spec}}
    kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


def get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def start_like_the_kubelet(agent: AgentNode, kube: Kube, namespace: str, names: list[str],
                           limits: dict[str, int], timeout: float = 60.0) -> dict[str, dict[str, str]]:
    """Admit each pod once it is bound to the agent's node (as the kubelet would), in bind order;
    returns the environment each got."""
    envs: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + timeout
    while len(envs) < len(names) and time.monotonic() < deadline:
        for name in names:
            if name not in envs and get(kube, namespace, name)["spec"].get("nodeName") == agent.name:
                admitted = agent.kubelet.admit(namespace, name, "main", limits)
                envs[name] = dict(next(iter(admitted.allocations.values())).envs)
        time.sleep(0.1)
    assert len(envs) == len(names), f"only {sorted(envs)} of {names} were bound and admitted"
    return envs


def test_two_pods_of_the_same_size_at_once_get_the_gpus_their_records_name(
        testbed: ControlPlaneState, kube: Kube, namespace: str, agent: AgentNode,
        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    for name in ("a", "b"):
        make(kube, namespace, name, agent.name, {"kubecell.io/gpu": "1"})
    envs = start_like_the_kubelet(agent, kube, namespace, ["a", "b"], {"kubecell.io/gpu": 1})
    for name in ("a", "b"):
        pod = get(kube, namespace, name)
        record = pods.record_of(pod)
        assert record is not None
        assert envs[name]["NVIDIA_VISIBLE_DEVICES"] == record.gpus[0].uuid
        assert pod["metadata"]["annotations"][ANNOTATION_ACK] == record.allocation_id
        assert agent.kubelet.assignments()[(namespace, name)]["main"]["kubecell.io/gpu"] == (record.gpus[0].uuid,)
    assert envs["a"]["NVIDIA_VISIBLE_DEVICES"] != envs["b"]["NVIDIA_VISIBLE_DEVICES"]
    time.sleep(1.0)
    assert agent.allocator.mismatches == 0


def test_shares_get_their_budget_and_mps_its_limits(
        testbed: ControlPlaneState, kube: Kube, namespace: str, agent: AgentNode,
        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    make(kube, namespace, "half", agent.name, {"kubecell.io/gpu-milli": "500", "kubecell.io/gpu-memory": "10000"},
         {"kubecell.io/isolation": "mps"})
    env = start_like_the_kubelet(agent, kube, namespace, ["half"], {"kubecell.io/gpu-milli": 500})["half"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10000M"
    assert env["KUBECELL_ISOLATION"] == "mps"
    assert 0.24 < float(env["KUBECELL_GPU_MEMORY_FRACTION"]) < 0.25  # 10000 of 40536 MiB
    assert env["CUDA_MPS_PIPE_DIRECTORY"]


def refused(kube: Kube, namespace: str, name: str) -> str | None:
    events = kube.get(f"/api/v1/namespaces/{namespace}/events",
                      fieldSelector=f"involvedObject.name={name},reason=GPUAllocationRefused")["items"]
    return events[0]["message"] if events else None


def bound_by_hand(kube: Kube, namespace: str, name: str, node: str, annotations: dict[str, str]) -> None:
    """A pod another scheduler (or a user) put on the node, asking for kubecell's GPUs."""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"nodeName": node, "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"kubecell.io/gpu": "1"}}}]}}
    kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


@pytest.mark.parametrize(("case", "annotation", "expected"), [
    ("missing", None, "no pod bound to node"),
    ("corrupt", "{not json", "cannot be trusted"),
    ("other-node", "node", "is for node elsewhere"),
    ("unknown-gpu", "uuid", "does not have"),
])
def test_a_record_that_cannot_be_trusted_is_refused_loudly(
        kube: Kube, namespace: str, agent: AgentNode, case: str, annotation: str | None, expected: str) -> None:
    annotations: dict[str, str] = {}
    if annotation == "{not json":
        annotations[ANNOTATION_ALLOCATION] = annotation
    bound_by_hand(kube, namespace, case, agent.name, annotations)
    pod = get(kube, namespace, case)
    if annotation in ("node", "uuid"):
        record = {"schema": "kubecell.io/allocation/v1", "allocationId": f"{pod['metadata']['uid']}-0",
                  "podUID": pod["metadata"]["uid"], "attempt": 0,
                  "node": "elsewhere" if annotation == "node" else agent.name,
                  "gpus": [{"index": 0, "uuid": "GPU-nope" if annotation == "uuid" else agent.uuids[0],
                            "milli": 1000, "memoryMiB": 0}],
                  "cpuMilli": 0, "memoryMiB": 0, "job": "x", "vc": "default", "class": "borrowed", "member": 0,
                  "batch": 1, "scheduler": "test", "createdAt": "2026-11-23T00:00:00Z"}

        kube.patch(f"/api/v1/namespaces/{namespace}/pods/{case}",
                   {"metadata": {"annotations": {ANNOTATION_ALLOCATION: json.dumps(record)}}})
    with pytest.raises(AdmissionFailed, match=expected):
        agent.kubelet.admit(namespace, case, "main", {"kubecell.io/gpu": 1})
    assert not agent.kubelet.assignments().get((namespace, case)), "nothing may be allocated"
    if case != "missing":
        assert wait_for("a Warning Event on the pod", lambda: refused(kube, namespace, case), 10)


def test_a_pod_admitted_across_an_agent_restart_is_acknowledged_from_pod_resources(
        testbed: ControlPlaneState, kube: Kube, namespace: str, agent: AgentNode,
        start_scheduler: type[RunningScheduler]) -> None:
    """The agent restarts between the Allocate calls of a pod's two GPU containers: the new agent serves the
    second but never saw the first. Where PodResources does not answer at that call (the kubelet's socket
    away), it cannot count the first and cannot acknowledge; ``settle`` does, once PodResources shows the
    record's devices for both containers (and not before), and the node's next GPU pod is bound. (Where it
    answers, the second call counts the first and acknowledges: ``tests/node/test_forged_records.py``.)"""
    start_scheduler(testbed)
    containers = [{"name": name, "image": "x", "resources": {"limits": {"kubecell.io/gpu": "1"}}}
                  for name in ("a", "b")]
    kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two", "namespace": namespace},
        "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubecell.io/test-node": agent.name},
                 "containers": containers}})
    wait_for("two bound", lambda: get(kube, namespace, "two")["spec"].get("nodeName"))
    agent.kubelet.admit(namespace, "two", "a", {"kubecell.io/gpu": 1})
    assert agent.allocator.settle() == [], "one of two containers admitted: the pod is not served yet"
    agent.allocator.serving.clear()  # the agent restarted: what it served before is forgotten
    verify, agent.allocator.verify = agent.allocator.verify, None  # PodResources away at b's call
    agent.kubelet.admit(namespace, "two", "b", {"kubecell.io/gpu": 1})
    agent.allocator.verify = verify
    record = pods.record_of(get(kube, namespace, "two"))
    assert record is not None
    assert ANNOTATION_ACK not in get(kube, namespace, "two")["metadata"]["annotations"]
    make(kube, namespace, "next", agent.name, {"kubecell.io/gpu": "1"})
    time.sleep(1.0)
    assert not get(kube, namespace, "next")["spec"].get("nodeName"), "held while two is unacknowledged"
    assert agent.allocator.settle() == [record.allocation_id]
    assert get(kube, namespace, "two")["metadata"]["annotations"][ANNOTATION_ACK] == record.allocation_id
    assigned = agent.kubelet.assignments()[(namespace, "two")]
    assert {assigned[c]["kubecell.io/gpu"][0] for c in ("a", "b")} == {g.uuid for g in record.gpus}
    wait_for("the next pod bound once two is acknowledged",
             lambda: get(kube, namespace, "next")["spec"].get("nodeName"))
