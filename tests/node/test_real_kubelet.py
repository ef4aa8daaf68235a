"""kubecell's device plugin against a real kubelet v1.37.2 (built like the control plane) on a fake CRI.

The kubelet (``kubecell.testbed.real_kubelet``) registers its own Node with the session's testbed, takes
the plugin's registration, advertises the devices in the Node's capacity, asks ``GetPreferredAllocation``
and ``Allocate`` when it admits a pod bound to it, "runs" the pod on ``fakecri`` and reports the
assignment through its PodResources API. The module skips, with the reason, where the kubelet cannot
be built (no Go) or cannot run (not root, no mount namespaces, a kubelet start failure).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

from kubecell.kube import pods
from kubecell.kube.dialects.resources import parse_quantity
from kubecell.kube.inventory import node_view
from kubecell.kube.names import ANNOTATION_ACK
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.agent import AgentOptions, NodeAgent
from kubecell.node.deviceplugin import GPU_RESOURCE, MILLI_RESOURCE, Device, DeviceFeed, DevicePlugin
from kubecell.node.fake_nvml import FakeNvml, example_path
from kubecell.node.podresources import PodResourcesClient
from kubecell.testbed.build import TestbedUnavailable as Unavailable
from kubecell.testbed.build import ensure_node_binaries
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.real_kubelet import TAINT_KEY, RealKubelet, preflight
from tests.cluster_fixtures import RunningScheduler
from tests.node.test_deviceplugin import FakeAllocator
from tests.support import wait_for

WAIT = 60.0
"""Upper bound of every wait (the kubelet reports node status every 2 s here)."""

GPUS = [Device(f"GPU-{i:04d}", True, (i // 4,)) for i in range(8)]


@pytest.fixture(scope="module")
def real_kubelet(testbed: ControlPlaneState, kube: Kube) -> Iterator[RealKubelet]:
    """A real kubelet registered as its own Node of the session's testbed (tainted: nothing else lands there)."""
    try:
        preflight()
        binaries = ensure_node_binaries(log=lambda line: print(f"[testbed] {line}", flush=True))
    except Unavailable as error:
        pytest.skip(f"no real kubelet on this machine: {error}")
    root = Path(tempfile.mkdtemp(prefix="kcrk", dir="/tmp"))  # Unix socket paths must stay under ~107 bytes
    kubelet = RealKubelet(binaries, Path(testbed.kubeconfig("kubelet")), f"rk-{uuid.uuid4().hex[:6]}", root)
    try:
        try:
            kubelet.start(timeout=WAIT)
        except Unavailable as error:
            pytest.skip(f"the real kubelet cannot run here: {error}")
        wait_for(f"node {kubelet.node} Ready", lambda: _ready(kube, kubelet.node), WAIT)
        _untaint_not_ready(kube, kubelet.node)
        yield kubelet
    finally:
        kubelet.stop()
        with contextlib.suppress(ApiError):
            kube.delete(f"/api/v1/nodes/{kubelet.node}")
        shutil.rmtree(root, ignore_errors=True)


def _ready(kube: Kube, node: str) -> bool:
    try:
        conditions = kube.get(f"/api/v1/nodes/{node}")["status"].get("conditions", [])
    except ApiError:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _untaint_not_ready(kube: Kube, node: str) -> None:
    """Do the node lifecycle controller's part (the testbed runs no kube-controller-manager): a kubelet
    registers its Node with ``node.kubernetes.io/not-ready:NoSchedule``, lifted once it is Ready."""
    taints = kube.get(f"/api/v1/nodes/{node}")["spec"].get("taints", [])
    kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
    kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": kept}})


def _capacity(kube: Kube, node: str, resource: str) -> tuple[int | None, int | None]:
    """The Node's capacity and allocatable of ``resource`` (the API canonicalises 8000 as ``8k``)."""
    status = kube.get(f"/api/v1/nodes/{node}")["status"]
    values = (status.get("capacity", {}).get(resource), status.get("allocatable", {}).get(resource))
    capacity, allocatable = (None if v is None else int(parse_quantity(v)) for v in values)
    return capacity, allocatable


@pytest.fixture
def plugin(real_kubelet: RealKubelet) -> Iterator[tuple[DevicePlugin, FakeAllocator]]:
    """``kubecell.io/gpu`` with eight devices and the trivial allocator of the fake-kubelet tests."""
    allocator = FakeAllocator()
    served = DevicePlugin(GPU_RESOURCE, DeviceFeed(GPUS), allocator, directory=real_kubelet.device_plugin_dir,
                          poll_interval=0.1)
    served.start(register_timeout=WAIT)
    try:
        yield served, allocator
    finally:
        served.stop()


def _gpu_pod(name: str, node: str, count: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                                     "resources": {"limits": {GPU_RESOURCE: str(count)}}}]}}


def _settled(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """The pod once Running or Failed; on a timeout the failure shows its node, status and events."""
    def probe() -> dict[str, Any] | None:
        pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod if pod.get("status", {}).get("phase") in ("Running", "Failed") else None
    try:
        settled: dict[str, Any] = wait_for(f"pod {name} running or failed", probe, WAIT)
    except AssertionError as error:
        pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        events = [f"{e.get('reason')}: {e.get('message')}"
                  for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
                  if e.get("involvedObject", {}).get("name") == name]
        raise AssertionError(f"{error}; nodeName={pod['spec'].get('nodeName')!r} status={pod.get('status')} "
                             f"annotations={pod['metadata'].get('annotations')} events={events}") from None
    return settled


def test_the_kubelet_registers_its_node_on_the_fake_runtime(real_kubelet: RealKubelet, kube: Kube) -> None:
    node = kube.get(f"/api/v1/nodes/{real_kubelet.node}")
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("fakeRuntime://")
    assert {"key": TAINT_KEY, "effect": "NoSchedule"} in node["spec"]["taints"]
    assert real_kubelet.device_plugin_dir.joinpath("kubelet.sock").is_socket()


def test_the_plugin_registers_and_the_node_advertises_eight_gpus(
        real_kubelet: RealKubelet, kube: Kube, plugin: tuple[DevicePlugin, FakeAllocator]) -> None:
    served, _ = plugin
    assert served.wait_registered(WAIT)
    assert served.registrations == 1
    wait_for("kubecell.io/gpu capacity 8", lambda: _capacity(kube, real_kubelet.node, GPU_RESOURCE) == (8, 8),
             WAIT)


def test_admitting_a_pod_calls_allocate_and_pod_resources_lists_its_device(
        real_kubelet: RealKubelet, kube: Kube, namespace: str, plugin: tuple[DevicePlugin, FakeAllocator]) -> None:
    _, allocator = plugin
    wait_for("kubecell.io/gpu allocatable", lambda: _capacity(kube, real_kubelet.node, GPU_RESOURCE)[1] == 8, WAIT)
    kube.create(f"/api/v1/namespaces/{namespace}/pods", _gpu_pod("train", real_kubelet.node))
    pod = _settled(kube, namespace, "train")
    assert pod["status"]["phase"] == "Running", pod["status"]
    assert [call[0] for call in allocator.preferred_calls] == [GPU_RESOURCE]
    assert len(allocator.allocate_calls) == 1
    resource, requests = allocator.allocate_calls[0]
    assert resource == GPU_RESOURCE
    assert len(requests) == 1
    (device,) = requests[0]
    assert device == "GPU-0007"  # the allocator's preference (highest ID), not the kubelet's own pick
    status = pod["status"]["containerStatuses"][0]
    assert status["containerID"].startswith("fakeRuntime://")
    assert status["allocatedResourcesStatus"] == [
        {"name": GPU_RESOURCE, "resources": [{"resourceID": device, "health": "Healthy"}]}]
    with PodResourcesClient(real_kubelet.pod_resources, timeout=WAIT) as client:
        listed = {(p.namespace, p.name): p for p in client.list()}
        assert listed[namespace, "train"].devices(GPU_RESOURCE) == (device,)
        got = client.get(namespace, "train")
        assert got is not None
        assert got.containers[0].name == "main"
        assert got.devices(GPU_RESOURCE) == (device,)
        assert len(client.allocatable()[GPU_RESOURCE]) == 8


def test_a_refused_allocation_fails_the_pod_with_the_plugins_message(
        real_kubelet: RealKubelet, kube: Kube, namespace: str, plugin: tuple[DevicePlugin, FakeAllocator]) -> None:
    _, allocator = plugin
    allocator.refuse = "no allocation record for this pod"
    wait_for("kubecell.io/gpu allocatable", lambda: _capacity(kube, real_kubelet.node, GPU_RESOURCE)[1] == 8, WAIT)
    kube.create(f"/api/v1/namespaces/{namespace}/pods", _gpu_pod("orphan", real_kubelet.node))
    pod = _settled(kube, namespace, "orphan")
    assert pod["status"]["phase"] == "Failed", pod["status"]
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert "no allocation record for this pod" in pod["status"]["message"]
    assert len(allocator.allocate_calls) == 1


def test_a_restarted_kubelet_gets_the_plugin_back(
        real_kubelet: RealKubelet, kube: Kube, plugin: tuple[DevicePlugin, FakeAllocator]) -> None:
    served, _ = plugin
    assert served.wait_registered(WAIT)
    before = served.registrations
    real_kubelet.restart_kubelet(timeout=WAIT)  # a new kubelet.sock: the plugin must notice and re-register
    wait_for("the plugin registered again", lambda: served.registrations > before, WAIT)
    wait_for("kubecell.io/gpu allocatable again", lambda: _capacity(kube, real_kubelet.node, GPU_RESOURCE) == (8, 8),
             WAIT)
    with PodResourcesClient(real_kubelet.pod_resources, timeout=WAIT) as client:
        assert len(client.allocatable()[GPU_RESOURCE]) == 8


@contextlib.contextmanager
def _agent_on(real_kubelet: RealKubelet, kube: Kube, tmp_path: Path, example: str,
              ready: Callable[[], bool], what: str) -> Iterator[NodeAgent]:
    """The whole ``kubecell node-agent`` on the real kubelet's node with the fake NVML ``example``, once
    ``ready()``; stopped afterwards."""
    options = AgentOptions(node=real_kubelet.node, device_plugin_dir=real_kubelet.device_plugin_dir,
                           pod_resources=real_kubelet.pod_resources, mps_root=tmp_path / "mps", interval=2.0)
    running = NodeAgent(kube, FakeNvml.from_file(example_path(example)), options)
    stop = threading.Event()
    thread = threading.Thread(target=running.run, args=(stop,), daemon=True, name="node-agent")
    thread.start()
    try:
        wait_for(what, ready, WAIT)
        yield running
    finally:
        stop.set()
        thread.join(timeout=30)


@pytest.fixture
def agent(real_kubelet: RealKubelet, kube: Kube, tmp_path: Path) -> Iterator[NodeAgent]:
    """The agent with the fake NVML's eight A100s."""
    node = real_kubelet.node
    with _agent_on(real_kubelet, kube, tmp_path, "a100-nvlink", lambda: (
            _capacity(kube, node, GPU_RESOURCE) == (8, 8) and _capacity(kube, node, MILLI_RESOURCE) == (8000, 8000)),
            "the agent's GPUs on the Node") as running:
        yield running


def test_the_node_agent_advertises_the_fake_nvml_gpus(real_kubelet: RealKubelet, agent: NodeAgent) -> None:
    with PodResourcesClient(real_kubelet.pod_resources, timeout=WAIT) as client:
        allocatable = client.allocatable()
    assert len(allocatable[GPU_RESOURCE]) == 8
    assert all(i.startswith("GPU-") for i in allocatable[GPU_RESOURCE])
    assert len(allocatable[MILLI_RESOURCE]) == 8000


def test_a_pod_placed_by_kubecell_runs_on_the_gpus_its_record_names(
        testbed: ControlPlaneState, kube: Kube, namespace: str, real_kubelet: RealKubelet, agent: NodeAgent,
        start_scheduler: type[RunningScheduler]) -> None:
    """The whole handshake on a real kubelet: kubecell's scheduler writes the record and binds, the agent
    acknowledges, the kubelet admits and calls Allocate, the allocator answers from the record, and the
    kubelet's own PodResources API shows the pod on exactly the record's GPUs."""
    wait_for("the agent's inventory annotation",
             lambda: len(node_view(kube.get(f"/api/v1/nodes/{real_kubelet.node}")).uuids) == 8)
    start_scheduler(testbed)
    pod = _gpu_pod("pair", real_kubelet.node, 2)
    del pod["spec"]["nodeName"]
    pod["spec"]["schedulerName"] = "kubecell"
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": real_kubelet.node}
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    placed = _settled(kube, namespace, "pair")
    assert placed["status"]["phase"] == "Running", placed["status"]
    record = pods.record_of(placed)
    assert record is not None
    assert record.node == real_kubelet.node
    assert placed["metadata"]["annotations"][ANNOTATION_ACK] == record.allocation_id
    with PodResourcesClient(real_kubelet.pod_resources, timeout=WAIT) as client:
        got = client.get(namespace, "pair")
    assert got is not None
    assert sorted(got.devices(GPU_RESOURCE)) == sorted(g.uuid for g in record.gpus)


@pytest.fixture
def mig_agent(real_kubelet: RealKubelet, kube: Kube, tmp_path: Path) -> Iterator[NodeAgent]:
    """The agent with two A100s in MIG mode, seven 1g.5gb instances each."""
    node = real_kubelet.node
    with _agent_on(real_kubelet, kube, tmp_path, "a100-mig-1g", lambda: (
            _capacity(kube, node, GPU_RESOURCE) == (14, 14)
            and node_view(kube.get(f"/api/v1/nodes/{node}")).isolation == ("mig",)),
            "the MIG instances on the Node") as running:
        yield running


def test_a_mig_instance_placed_by_kubecell_is_the_device_the_kubelet_gives(
        testbed: ControlPlaneState, kube: Kube, namespace: str, real_kubelet: RealKubelet, mig_agent: NodeAgent,
        start_scheduler: type[RunningScheduler]) -> None:
    """On a node in MIG mode the scheduler places an instance, and the real kubelet's PodResources shows the
    pod holding exactly the MIG instance its record names."""
    start_scheduler(testbed)
    pod = _gpu_pod("slice", real_kubelet.node, 1)
    del pod["spec"]["nodeName"]
    pod["spec"]["schedulerName"] = "kubecell"
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": real_kubelet.node}
    pod["metadata"]["annotations"] = {"kubecell.io/gpu-models": "MIG-1g.5gb"}
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    placed = _settled(kube, namespace, "slice")
    assert placed["status"]["phase"] == "Running", placed["status"]
    record = pods.record_of(placed)
    assert record is not None
    assert record.isolation == "mig"
    assert [g.uuid[:4] for g in record.gpus] == ["MIG-"]
    with PodResourcesClient(real_kubelet.pod_resources, timeout=WAIT) as client:
        got = client.get(namespace, "slice")
    assert got is not None
    assert list(got.devices(GPU_RESOURCE)) == [record.gpus[0].uuid]
