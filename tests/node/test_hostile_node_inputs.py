"""Hostile and broken input on the node agent's own paths: what the kubelet sends the device plugin, what
the kubelet's PodResources API answers, what NVML reports to the overuse monitor, and a kubelet whose
device-plugin directory disappears. Each case is one the agent once mishandled (a dead watcher thread, a
container counted as served with no device, a driver sentinel read as millions of percent, the agent's own
MPS server reported as a pod's unaccounted use, ...). No API server: the Kubernetes side is a recording fake.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

import grpc  # type: ignore[import-untyped]

from kubecell.core.errors import KubecellError
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import parse_record
from kubecell.kube.rest import Kube
from kubecell.node import protos
from kubecell.node.allocator import RecordAllocator, Served
from kubecell.node.deviceplugin import (
    GPU_RESOURCE,
    MILLI_RESOURCE,
    AllocationRefused,
    ContainerAllocation,
    Device,
    DeviceFeed,
    DevicePlugin,
)
from kubecell.node.fake_kubelet import FakeKubelet
from kubecell.node.fake_nvml import FakeNvml
from kubecell.node.isolation import NodeIsolation
from kubecell.node.nvml import GpuProcess
from kubecell.node.overuse import OveruseMonitor
from kubecell.node.podresources import ContainerDevices, PodDevices, PodResourcesClient, PodResourcesError
from tests.node.test_nvml import FakeNvmlModule, backend

WAIT = 10.0
NODE = "hostile-node"
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
UID = "6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
AGENT_UID = "0a0b0c0d-1111-2222-3333-444455556666"


# ---------------------------------------------------------------------------------------------- helpers
@dataclass
class RecordingAllocator:
    """Counts calls; answers every container, or raises what it is told to."""

    raises: Exception | None = None
    calls: list[tuple[str, list[list[str]]]] = field(default_factory=list)

    def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        if self.raises is not None:
            raise self.raises
        return available[:size]

    def allocate(self, resource: str, container_requests: list[list[str]]) -> list[ContainerAllocation]:
        self.calls.append((resource, container_requests))
        if self.raises is not None:
            raise self.raises
        return [ContainerAllocation(envs={"N": str(len(ids))}) for ids in container_requests]


@dataclass
class Plugged:
    kubelet: FakeKubelet
    feed: DeviceFeed
    allocator: RecordingAllocator
    plugin: DevicePlugin

    def stub(self) -> Any:
        """A client of the plugin's own socket: what a (hostile) kubelet could send it directly."""
        channel = grpc.insecure_channel(f"unix://{self.plugin.socket}")
        return protos.deviceplugin().grpc.DevicePluginStub(channel)


@pytest.fixture
def plugged() -> Iterator[Plugged]:
    root = Path(tempfile.mkdtemp(prefix="kh", dir="/tmp"))  # Unix socket paths must stay short
    kubelet = FakeKubelet(root / "dp", root / "pr" / "kubelet.sock").start()
    feed = DeviceFeed([Device("GPU-A"), Device("GPU-B"), Device("GPU-C", healthy=False)])
    allocator = RecordingAllocator()
    plugin = DevicePlugin(GPU_RESOURCE, feed, allocator, directory=kubelet.directory, poll_interval=0.05,
                          max_backoff=0.2)
    try:
        plugin.start(register_timeout=WAIT)
        yield Plugged(kubelet, feed, allocator, plugin)
    finally:
        plugin.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def allocate(plugged: Plugged, *containers: list[str]) -> Any:
    pb2 = protos.deviceplugin().pb2
    request = pb2.AllocateRequest(container_requests=[pb2.ContainerAllocateRequest(devices_ids=ids)
                                                      for ids in containers])
    return plugged.stub().Allocate(request, timeout=WAIT)


def refused(plugged: Plugged, *containers: list[str]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failure:
        allocate(plugged, *containers)
    return failure.value


# ---------------------------------------------------------------------------------------------- device plugin
@pytest.mark.parametrize(("case", "containers", "told"), [
    ("no container at all", [], "names no container"),
    ("a container with no device", [["GPU-A"], []], "no device for container request 1"),
    ("one device twice in a container", [["GPU-A", "GPU-B", "GPU-A"]], "'GPU-A' more than once"),
])
def test_a_malformed_allocate_is_refused_before_the_allocator_counts_it(
        plugged: Plugged, case: str, containers: list[list[str]], told: str) -> None:
    """The kubelet never sends these; the record-reading allocator answers a container from the pod's record
    whatever its device IDs, so an empty one would be served (and counted towards the pod's acknowledgement)
    without any device."""
    error = refused(plugged, *containers)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, case
    assert told in error.details(), (case, error.details())
    assert GPU_RESOURCE in error.details()
    assert plugged.allocator.calls == [], case


def test_allocate_of_an_unhealthy_device_is_refused(plugged: Plugged) -> None:
    """A critical XID took GPU-C out of service after the kubelet chose it: no container starts on it."""
    error = refused(plugged, ["GPU-A", "GPU-C"])
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Unhealthy" in error.details()
    assert "GPU-C" in error.details()
    assert "GPU-A" not in error.details()
    assert plugged.allocator.calls == []
    assert len(allocate(plugged, ["GPU-A", "GPU-B"]).container_responses) == 1, "healthy ones are served"


def test_an_enormous_unknown_device_id_gives_a_short_clear_refusal(plugged: Plugged) -> None:
    """The refusal names the unknown IDs; one of 100,000 characters must not become the gRPC status message
    (a trailer that size is refused by the client, which then reports a transport error, not the reason)."""
    error = refused(plugged, ["GPU-A", "X" * 100_000, *[f"bogus-{i}" for i in range(3000)]])
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "does not advertise" in error.details()
    assert len(error.details()) < 1000
    assert "(3001 in all)" in error.details()


def test_an_allocator_that_cannot_decide_gives_unavailable_with_the_reason(plugged: Plugged) -> None:
    """The API server away: the kubelet is told which resource and why, not UNKNOWN 'Exception calling
    application' (and the agent's log gets one line, not a stack trace)."""
    plugged.allocator.raises = KubecellError("GET /api/v1/pods: connection refused")
    error = refused(plugged, ["GPU-A"])
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert GPU_RESOURCE in error.details()
    assert "connection refused" in error.details()
    pb2 = protos.deviceplugin().pb2
    with pytest.raises(grpc.RpcError) as failure:
        plugged.stub().GetPreferredAllocation(pb2.PreferredAllocationRequest(container_requests=[
            pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["GPU-A"], allocation_size=1)]),
            timeout=WAIT)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    plugged.allocator.raises = AllocationRefused("no pod waits")  # a refusal stays a refusal
    assert refused(plugged, ["GPU-A"]).code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_plugin_registers_again_after_the_device_plugin_directory_was_recreated(plugged: Plugged) -> None:
    """A kubelet reinstall (or a cleanup script) removes /var/lib/kubelet/device-plugins while the kubelet is
    down. Serving there fails then; the watcher must keep trying, not die, or the node's GPUs are gone from
    the kubelet until the agent is restarted by hand."""
    kubelet = plugged.kubelet
    assert kubelet.registrations[GPU_RESOURCE] == 1
    kubelet.stop(grace=0.2)
    shutil.rmtree(kubelet.directory)
    time.sleep(0.5)  # the watcher notices the kubelet's socket is gone and fails to serve, several times
    assert plugged.plugin._watcher is not None
    assert plugged.plugin._watcher.is_alive(), "the watcher thread died"
    kubelet.start()  # recreates the directory and kubelet.sock
    kubelet.wait_for(lambda: kubelet.registrations.get(GPU_RESOURCE, 0) >= 2 and kubelet.connected(GPU_RESOURCE),
                     WAIT, "the plugin registered again")
    assert len(allocate(plugged, ["GPU-A"]).container_responses) == 1


def test_a_plugin_started_before_its_directory_exists_waits_for_the_kubelet() -> None:
    """The agent may start before the kubelet created its directory: that is a wait, not a crash with grpc's
    'Failed to bind to address'."""
    root = Path(tempfile.mkdtemp(prefix="kh", dir="/tmp"))
    kubelet = FakeKubelet(root / "dp", root / "pr" / "kubelet.sock")
    plugin = DevicePlugin(MILLI_RESOURCE, DeviceFeed([Device("GPU-A::0")]), RecordingAllocator(),
                          directory=kubelet.directory, poll_interval=0.05, max_backoff=0.2)
    try:
        plugin.start(register_timeout=0.3)
        assert not plugin.wait_registered(0)
        kubelet.start()
        kubelet.wait_for(lambda: kubelet.connected(MILLI_RESOURCE), WAIT, "the plugin registered")
        assert [d.id for d in kubelet.devices(MILLI_RESOURCE)] == ["GPU-A::0"]
    finally:
        plugin.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- PodResources
def test_an_absent_pod_resources_socket_is_a_clear_kubecell_error(tmp_path: Path) -> None:
    """The kubelet restarting (or its socket not mounted): one line naming the call, the socket and the gRPC
    status, as a KubecellError the agent's loops expect, not grpc's multi-line debug dump."""
    socket = tmp_path / "kubelet.sock"
    with PodResourcesClient(socket, timeout=2) as client:
        for call in (client.list, client.allocatable, lambda: client.get("ns", "p")):
            with pytest.raises(PodResourcesError) as failure:
                call()
            assert isinstance(failure.value, KubecellError)
            message = str(failure.value)
            assert str(socket) in message, message
            assert "UNAVAILABLE" in message, message
            assert "\n" not in message, message


def record(uid: str, gpus: list[tuple[int, str, int, int]], isolation: str = "accounting") -> str:
    """An allocation record for pod ``uid`` on NODE; gpus are (index, uuid, milli, memoryMiB)."""
    return json.dumps({
        "schema": "kubecell.io/allocation/v1", "allocationId": f"{uid}-0", "podUID": uid, "attempt": 0,
        "node": NODE, "gpus": [{"index": i, "uuid": u, "milli": m, "memoryMiB": mem} for i, u, m, mem in gpus],
        "cpuMilli": 0, "memoryMiB": 0, "isolation": isolation, "job": "j", "vc": "default", "class": "borrowed",
        "member": 0, "batch": 1, "scheduler": "test", "createdAt": "2026-11-23T00:00:00Z"})


@dataclass
class FakeKube:
    """The pods bound to NODE, and what the agent writes (acknowledgements, Events)."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    patched: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    created: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        return {"items": self.pods}

    def patch(self, path: str, body: Mapping[str, Any], **query: Any) -> dict[str, Any]:
        self.patched.append((path, dict(body)))
        return dict(body)

    def create(self, path: str, body: Mapping[str, Any], **query: Any) -> dict[str, Any]:
        self.created.append((path, dict(body)))
        return dict(body)


def gpu_pod(containers: list[tuple[str, str]], annotation: str) -> dict[str, Any]:
    """A pod bound to NODE, not yet acknowledged; containers are (name, the kubecell resource it asks for)."""
    return {"metadata": {"name": "p", "namespace": "ns", "uid": UID,
                         "annotations": {ANNOTATION_ALLOCATION: annotation}},
            "spec": {"nodeName": NODE, "containers": [{"name": name, "resources": {"limits": {resource: "1"}}}
                                                       for name, resource in containers]},
            "status": {"phase": "Pending"}}


def allocator_for(kube: FakeKube, answer: PodDevices) -> RecordAllocator:
    return RecordAllocator(cast(Kube, kube), NODE, lambda: {GPU0: 40_536, GPU1: 40_536},
                           NodeIsolation(("accounting",)), verify=lambda namespace, name: answer, verify_after=0.01)


def test_a_pod_resources_answer_listing_a_container_twice_does_not_settle_the_pod() -> None:
    """Settling acknowledges a pod admitted while the agent was away once PodResources shows every GPU
    container served. A reply listing container ``a`` twice (and never ``b``) is no such proof: acknowledged
    now, the node's next GPU pod would be bound, and ``b``'s Allocate would be answered from its record."""
    kube = FakeKube([gpu_pod([("a", GPU_RESOURCE), ("b", GPU_RESOURCE)],
                             record(UID, [(0, GPU0, 1000, 40_536), (1, GPU1, 1000, 40_536)]))])
    twice = PodDevices("ns", "p", (ContainerDevices("a", {GPU_RESOURCE: (GPU0,)}),
                                   ContainerDevices("a", {GPU_RESOURCE: (GPU0,)})))
    assert allocator_for(kube, twice).settle() == []
    assert kube.patched == []
    stranger = PodDevices("ns", "p", (ContainerDevices("a", {GPU_RESOURCE: (GPU0,)}),
                                      ContainerDevices("not-in-the-pod", {GPU_RESOURCE: (GPU1,)})))
    assert allocator_for(kube, stranger).settle() == []
    both = PodDevices("ns", "p", (ContainerDevices("a", {GPU_RESOURCE: (GPU0,)}),
                                  ContainerDevices("b", {GPU_RESOURCE: (GPU1,)})))
    assert allocator_for(kube, both).settle() == [f"{UID}-0"], "the honest answer still settles it"


def test_a_gpu_init_container_pod_resources_cannot_show_counts_once_the_kubelet_started_it() -> None:
    """PodResources lists regular and sidecar containers only (upstream ``podresources/server_v1.go``): a pod
    whose GPU init container was served before the agent restarted was never settled, and the node's next GPU
    pod waited for ever. The init container counts once the kubelet reports it running or ended; until then,
    or with nothing else shown, nothing is settled."""
    pod = gpu_pod([("main", GPU_RESOURCE)], record(UID, [(0, GPU0, 1000, 40_536)]))
    pod["spec"]["initContainers"] = [{"name": "warm-up", "resources": {"limits": {GPU_RESOURCE: "1"}}}]
    shown = PodDevices("ns", "p", (ContainerDevices("main", {GPU_RESOURCE: (GPU0,)}),))
    kube = FakeKube([pod])
    assert allocator_for(kube, shown).settle() == [], "the init container not started yet: its Allocate may come"
    pod["status"]["initContainerStatuses"] = [{"name": "warm-up", "state": {"terminated": {"exitCode": 0}}}]
    assert allocator_for(kube, shown).settle() == [f"{UID}-0"]
    alone = gpu_pod([], record(UID, [(0, GPU0, 1000, 40_536)]))
    alone["spec"]["initContainers"] = [{"name": "warm-up", "resources": {"limits": {GPU_RESOURCE: "1"}}},
                                       {"name": "main-sidecar", "restartPolicy": "Always",
                                        "resources": {"limits": {GPU_RESOURCE: "1"}}}]
    alone["status"]["initContainerStatuses"] = [{"name": "warm-up", "state": {"running": {}}}]
    nothing = PodDevices("ns", "p", ())
    assert allocator_for(FakeKube([alone]), nothing).settle() == [], "a sidecar PodResources can show, not shown"


def test_pod_resources_showing_a_gpu_the_agent_never_served_is_a_mismatch() -> None:
    """The agent served a share (milli slots of GPU0); the kubelet's record also gives the pod a whole GPU1.
    Comparing only the resources served would call that a match."""
    annotation = record(UID, [(0, GPU0, 500, 10_000)])
    pod = gpu_pod([("a", MILLI_RESOURCE)], annotation)
    slots = tuple(f"{GPU0}::{k}" for k in range(500))
    kube = FakeKube([pod])
    extra = PodDevices("ns", "p", (ContainerDevices("a", {MILLI_RESOURCE: slots, GPU_RESOURCE: (GPU1,)}),))
    parsed = parse_record(annotation, pod="ns/p", uid=UID)
    allocator = allocator_for(kube, extra)
    allocator._verify(Served(parsed, pod, 1, {MILLI_RESOURCE: set(slots)}))
    assert allocator.mismatches == 1
    assert any("other devices" in body.get("message", "") for _, body in kube.created)
    honest = allocator_for(kube, PodDevices("ns", "p", (ContainerDevices("a", {MILLI_RESOURCE: slots}),)))
    honest._verify(Served(parsed, pod, 1, {MILLI_RESOURCE: set(slots)}))
    assert honest.mismatches == 0


@pytest.mark.parametrize(("case", "containers", "gpus", "calls"), [
    # a pod bound by hand asks one GPU; its forged record also names the GPU another pod runs on
    ("a GPU the kubelet never gave", [("main", GPU_RESOURCE)], [(0, GPU0, 1000, 40_536), (1, GPU1, 1000, 40_536)],
     [(GPU_RESOURCE, [[GPU0]])]),
    # two containers, one GPU each: the record's second GPU is checked once the last container is served
    ("a GPU no container got", [("a", GPU_RESOURCE), ("b", GPU_RESOURCE)],
     [(0, GPU0, 1000, 40_536), (1, GPU1, 1000, 40_536)], [(GPU_RESOURCE, [[GPU0]]), (GPU_RESOURCE, [[GPU0]])]),
    # one milli slot reserved at the kubelet, half the GPU (and MPS's thread share) claimed by the record
    ("more of a share than the slots", [("main", MILLI_RESOURCE)], [(0, GPU0, 500, 10_000)],
     [(MILLI_RESOURCE, [[f"{GPU0}::0"]])]),
])
def test_a_record_naming_more_than_the_kubelet_gave_is_refused(
        case: str, containers: list[tuple[str, str]], gpus: list[tuple[int, str, int, int]],
        calls: list[tuple[str, list[list[str]]]]) -> None:
    """A user can bind a pod by hand with an allocation record of their own. The kubelet reserves what the pod's
    resources ask (one GPU, one milli slot); the environment comes from the record. A record naming a GPU the
    kubelet never gave the pod, or more of a share than the slots it reserved, would hand the pod a GPU (or a
    share) that another pod's Allocate may be given as well, and hide that use from the overuse monitor."""
    kube = FakeKube([gpu_pod(containers, record(UID, gpus))])
    allocator = allocator_for(kube, PodDevices("ns", "p", ()))
    *before, (resource, requests) = calls
    for earlier in before:  # the record's GPUs may still come with a later container
        allocator.allocate(*earlier)
    with pytest.raises(AllocationRefused, match="kubelet"):
        allocator.allocate(resource, requests)
    assert kube.patched == [], f"{case}: never acknowledged"
    assert any("GPUAllocationRefused" in str(body) for _, body in kube.created), "a Warning Event on the pod"


@pytest.mark.parametrize(("containers", "gpus", "calls"), [
    ([("a", GPU_RESOURCE), ("b", GPU_RESOURCE)], [(0, GPU0, 1000, 40_536), (1, GPU1, 1000, 40_536)],
     [(GPU_RESOURCE, [[GPU0]]), (GPU_RESOURCE, [[GPU1]])]),
    ([("main", MILLI_RESOURCE)], [(0, GPU0, 500, 10_000)], [(MILLI_RESOURCE, [[f"{GPU0}::{k}" for k in range(500)]])]),
    ([("a", MILLI_RESOURCE), ("b", MILLI_RESOURCE)], [(0, GPU0, 500, 10_000)],
     [(MILLI_RESOURCE, [[f"{GPU0}::{k}" for k in range(300)]]),
      (MILLI_RESOURCE, [[f"{GPU0}::{k}" for k in range(300, 500)]])]),
])
def test_a_record_the_kubelets_devices_cover_is_served_and_acknowledged(
        containers: list[tuple[str, str]], gpus: list[tuple[int, str, int, int]],
        calls: list[tuple[str, list[list[str]]]]) -> None:
    kube = FakeKube([gpu_pod(containers, record(UID, gpus))])
    allocator = allocator_for(kube, PodDevices("ns", "p", ()))
    allocator.verify = None  # no PodResources check thread
    for resource, requests in calls:
        allocator.allocate(resource, requests)
    assert [body["metadata"]["annotations"] for _, body in kube.patched] == [{"kubecell.io/allocated": f"{UID}-0"}]


# ---------------------------------------------------------------------------------------------- overuse
FAKE = f"""
name: {NODE}
gpus: [{{product: NVIDIA A100-SXM4-40GB, count: 2}}]
uuids: [{GPU0}, {GPU1}]
"""


def put_proc(root: Path, pid: int | str, pod_uid: str | None) -> None:
    """``<root>/<pid>/cgroup`` of a process in pod ``pod_uid`` (None: a host process)."""
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    text = "0::/system.slice/ssh.service\n" if pod_uid is None else (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/"
        "cri-containerd-0123abcd.scope\n")
    (directory / "cgroup").write_text(text)


def share_pod(uid: str = UID) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": uid,
                         "annotations": {ANNOTATION_ALLOCATION: record(uid, [(0, GPU0, 500, 10_000)])}},
            "spec": {"nodeName": NODE}}


def monitor(backend: Any, listed: list[dict[str, Any]], proc: Path, kube: FakeKube | None = None) -> OveruseMonitor:
    return OveruseMonitor(cast(Kube, kube or FakeKube()), NODE, backend, lambda: listed, None, proc_root=proc, window=3)


def test_nvml_sentinel_sm_utilisation_reads_as_unsampled() -> None:
    """Drivers have answered nvmlDeviceGetProcessUtilization with smUtil 2147483632 (NVIDIA/DCGM#83) and
    other nonsense (Syllo/nvtop#110); memUtil was already checked, smUtil was passed on as is."""
    class Sentinel(FakeNvmlModule):
        def nvmlDeviceGetProcessUtilization(self, handle: Any, since: int) -> list[Any]:  # noqa: N802
            return [types.SimpleNamespace(pid=100, smUtil=2147483632, memUtil=17)]

    assert backend(Sentinel()).processes(0)[0] == GpuProcess(100, 512, None, 17)


@pytest.mark.parametrize("absurd", [2147483632, 250])
def test_one_absurd_utilisation_sample_is_not_overuse(tmp_path: Path, absurd: int) -> None:
    """One impossible reading must not be averaged into the window: 2147483632% once, then 10%, 10% would be a
    mean of 715 million percent, an Event and (with evict_after_seconds) an eviction of a pod within its share."""
    nvml = FakeNvml.from_text(FAKE)
    put_proc(tmp_path, 100, UID)
    kube = FakeKube()
    watching = monitor(nvml, [share_pod()], tmp_path, kube)
    findings = []
    for utilization in (absurd, 10, 10):
        nvml.set_processes(0, [GpuProcess(100, 1_000, utilization)])
        findings = watching.sample()
    assert findings == []
    assert kube.created == []


def test_a_nan_utilisation_does_not_blind_the_window(tmp_path: Path) -> None:
    """NaN compares false with everything: once in the window, the mean is NaN and a pod at 100% of a 50% share
    would never be over for as long as the NaN stays in the window."""
    nvml = FakeNvml.from_text(FAKE)
    put_proc(tmp_path, 100, UID)
    watching = monitor(nvml, [share_pod()], tmp_path)
    findings = []
    for utilization in (float("nan"), 100, 100):
        nvml.set_processes(0, [GpuProcess(100, 1_000, cast(int, utilization))])
        findings = watching.sample()
    assert {f.kind for f in findings} == {"utilization"}


def test_the_agents_own_mps_server_is_not_a_pods_unaccounted_use(tmp_path: Path) -> None:
    """The agent starts the MPS control daemons; the ``nvidia-cuda-mps-server`` they spawn lives in the agent's
    own pod cgroup and NVML lists it as a compute process. The agent's pod has no allocation record, so it was
    reported as unaccounted GPU use (a Warning Event on the agent) on every MPS node."""
    nvml = FakeNvml.from_text(FAKE)
    put_proc(tmp_path, "self", AGENT_UID)  # <proc_root>/self/cgroup: the agent itself
    put_proc(tmp_path, 300, AGENT_UID)  # the MPS server
    put_proc(tmp_path, 100, UID)  # an mps client, in its pod
    agent_pod = {"metadata": {"name": "kubecell-node-agent-x", "namespace": "kubecell-node", "uid": AGENT_UID},
                 "spec": {"nodeName": NODE}}
    nvml.set_processes(0, [GpuProcess(300, 30, 0), GpuProcess(100, 1_000, 10)])
    kube = FakeKube()
    watching = monitor(nvml, [agent_pod, share_pod()], tmp_path, kube)
    assert watching.sample() == []
    assert kube.created == []
    put_proc(tmp_path, 301, "99999999-8888-7777-6666-555555555555")  # any other pod's use is still seen
    nvml.set_processes(1, [GpuProcess(301, 500, 0)])
    assert {f.kind for f in watching.sample()} == {"unaccounted"}


def test_more_gpus_than_an_inventory_holds_is_a_clear_error_not_a_traceback() -> None:
    """A backend reporting 300 GPUs (a broken driver, a tampered fake) failed pydantic's validation inside the
    publisher's loop, logged there as an "unexpected error" with a traceback."""
    from kubecell.node.inventory import InventoryError, build_inventory
    from kubecell.node.nvml import GpuDevice
    from kubecell.node.xid import HealthTracker

    devices = [GpuDevice(i, f"GPU-{i}", "NVIDIA A100-SXM4-40GB", 40960) for i in range(300)]
    with pytest.raises(InventoryError, match=r"the 300 GPU\(s\) the backend reports cannot be published: "
                                             r"GpuRecord index: .*less than or equal to 255"):
        build_inventory(devices, HealthTracker())
    assert len(build_inventory(devices[:8], HealthTracker()).gpus) == 8
