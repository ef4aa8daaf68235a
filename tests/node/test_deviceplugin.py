"""The device plugin against the fake kubelet, over real Unix sockets in a short temporary directory.

The allocator here is a trivial test double: it prefers the highest device IDs (the fake kubelet's own
fallback takes the lowest, so a preferred allocation is visible in the result) and answers Allocate
with the device IDs in the environment, or refuses when told to.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

import grpc  # type: ignore[import-untyped]

from kubecell.core.errors import KubecellError
from kubecell.node import protos
from kubecell.node.deviceplugin import (
    GPU_RESOURCE,
    MAX_WATCHERS,
    MILLI_RESOURCE,
    AllocationRefused,
    ContainerAllocation,
    Device,
    DeviceFeed,
    DevicePlugin,
    DeviceSpec,
    Mount,
    device_to_proto,
    gpu_of,
    milli_devices,
)
from kubecell.node.fake_kubelet import AdmissionFailed, FakeKubelet
from kubecell.node.podresources import PodResourcesClient

WAIT = 10.0
"""Upper bound of every wait in these tests (the plugin polls every 0.05 s here)."""

GPUS = [Device(f"GPU-{i:04d}", True, (i // 2,)) for i in range(4)]


@dataclass
class FakeAllocator:
    """Prefers the highest IDs; Allocate puts the IDs in the environment; ``refuse`` makes it refuse."""

    refuse: str | None = None
    preferred_calls: list[tuple[str, list[str], list[str], int]] = field(default_factory=list)
    allocate_calls: list[tuple[str, list[list[str]]]] = field(default_factory=list)

    def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        self.preferred_calls.append((resource, available, must_include, size))
        rest = sorted((i for i in available if i not in must_include), reverse=True)
        return [*must_include, *rest][:size]

    def allocate(self, resource: str, container_requests: list[list[str]]) -> list[ContainerAllocation]:
        self.allocate_calls.append((resource, container_requests))
        if self.refuse is not None:
            raise AllocationRefused(self.refuse)
        return [ContainerAllocation(
            envs={"KUBECELL_DEVICES": ",".join(ids),
                  "NVIDIA_VISIBLE_DEVICES": ",".join(sorted({gpu_of(i) for i in ids}))},
            mounts=(Mount("/run/kubecell", "/var/run/kubecell", True),),
            devices=(DeviceSpec("/dev/nvidia0", "/dev/nvidia0", "rw"),),
            annotations={"kubecell.io/resource": resource}) for ids in container_requests]


@dataclass
class Node:
    root: Path
    kubelet: FakeKubelet
    allocator: FakeAllocator
    gpu_feed: DeviceFeed
    milli_feed: DeviceFeed
    gpu: DevicePlugin
    milli: DevicePlugin

    def pod_resources(self) -> PodResourcesClient:
        return PodResourcesClient(self.kubelet.pod_resources, timeout=WAIT)


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="kc", dir="/tmp"))  # Unix socket paths must stay under ~107 bytes
    kubelet = FakeKubelet(root / "dp", root / "pr" / "kubelet.sock").start()
    allocator = FakeAllocator()
    gpu_feed, milli_feed = DeviceFeed(GPUS), DeviceFeed(milli_devices(GPUS))
    gpu = DevicePlugin(GPU_RESOURCE, gpu_feed, allocator, directory=kubelet.directory, poll_interval=0.05)
    milli = DevicePlugin(MILLI_RESOURCE, milli_feed, allocator, directory=kubelet.directory, poll_interval=0.05)
    plugins = []
    try:
        for plugin in (gpu, milli):
            plugin.start(register_timeout=WAIT)
            plugins.append(plugin)
        for resource in (GPU_RESOURCE, MILLI_RESOURCE):
            kubelet.wait_for(lambda r=resource: kubelet.connected(r), WAIT, f"{resource} connected")  # type: ignore[misc]
        yield Node(root, kubelet, allocator, gpu_feed, milli_feed, gpu, milli)
    finally:
        for plugin in plugins:
            plugin.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_registration_with_version_endpoint_and_options(node: Node) -> None:
    assert node.kubelet.registrations == {GPU_RESOURCE: 1, MILLI_RESOURCE: 1}
    assert (node.gpu.registrations, node.milli.registrations) == (1, 1)
    options = node.kubelet.options(GPU_RESOURCE)
    assert options.get_preferred_allocation_available
    assert not options.pre_start_required
    assert node.gpu.socket == node.kubelet.directory / "kubecell-gpu.sock"
    assert node.milli.socket.name == "kubecell-gpu-milli.sock"
    assert node.gpu.socket.is_socket()


def test_list_and_watch_reports_devices_with_numa_and_health_changes(node: Node) -> None:
    assert node.kubelet.devices(GPU_RESOURCE) == GPUS
    assert node.kubelet.capacity() == {GPU_RESOURCE: 4, MILLI_RESOURCE: 4000}
    assert node.kubelet.allocatable() == {GPU_RESOURCE: 4, MILLI_RESOURCE: 4000}
    sick = [Device(g.id, g.id != "GPU-0002", g.numa_nodes) for g in GPUS]  # an XID error on GPU 2
    node.gpu_feed.publish(sick)
    node.milli_feed.publish(milli_devices(sick))
    node.kubelet.wait_for(lambda: node.kubelet.allocatable() == {GPU_RESOURCE: 3, MILLI_RESOURCE: 3000}, WAIT,
                          "GPU-0002 unhealthy")
    assert node.kubelet.capacity() == {GPU_RESOURCE: 4, MILLI_RESOURCE: 4000}
    assert {d.id: d.healthy for d in node.kubelet.devices(GPU_RESOURCE)}["GPU-0002"] is False
    admitted = node.kubelet.admit("ns", "p", "main", {GPU_RESOURCE: 3})
    assert "GPU-0002" not in admitted.devices[GPU_RESOURCE]
    with pytest.raises(AdmissionFailed, match="Requested: 1, Available: 0"):
        node.kubelet.admit("ns", "q", "main", {GPU_RESOURCE: 1})
    node.gpu_feed.publish(GPUS)  # recovered
    node.kubelet.wait_for(lambda: node.kubelet.allocatable()[GPU_RESOURCE] == 4, WAIT, "GPU-0002 healthy again")


def test_preferred_allocation_is_asked_and_used(node: Node) -> None:
    admitted = node.kubelet.admit("ns", "p", "main", {GPU_RESOURCE: 2})
    assert admitted.devices[GPU_RESOURCE] == ("GPU-0003", "GPU-0002")  # the allocator's choice, not the fallback
    assert node.allocator.preferred_calls == [(GPU_RESOURCE, [g.id for g in GPUS], [], 2)]


def test_allocate_returns_the_allocators_response(node: Node) -> None:
    admitted = node.kubelet.admit("ns", "p", "main", {MILLI_RESOURCE: 3})
    ids = admitted.devices[MILLI_RESOURCE]
    assert ids == ("GPU-0003::999", "GPU-0003::998", "GPU-0003::997")
    allocation = admitted.allocations[MILLI_RESOURCE]
    assert allocation.envs == {"KUBECELL_DEVICES": ",".join(ids), "NVIDIA_VISIBLE_DEVICES": "GPU-0003"}
    assert allocation.mounts == (Mount("/run/kubecell", "/var/run/kubecell", True),)
    assert allocation.devices == (DeviceSpec("/dev/nvidia0", "/dev/nvidia0", "rw"),)
    assert allocation.annotations == {"kubecell.io/resource": MILLI_RESOURCE}
    assert node.allocator.allocate_calls == [(MILLI_RESOURCE, [list(ids)])]


def test_a_refused_allocation_reaches_the_kubelet_with_its_message(node: Node) -> None:
    node.allocator.refuse = "pod ns/p: record names GPU-9999, not on this node"
    with pytest.raises(AdmissionFailed) as failure:
        node.kubelet.admit("ns", "p", "main", {GPU_RESOURCE: 4})
    assert failure.value.code == "FAILED_PRECONDITION"
    assert failure.value.message == "pod ns/p: record names GPU-9999, not on this node"
    assert node.kubelet.assignments() == {}
    node.allocator.refuse = None  # the refused devices were not kept: all four are free
    assert len(node.kubelet.admit("ns", "p", "main", {GPU_RESOURCE: 4}).devices[GPU_RESOURCE]) == 4


def test_allocate_of_devices_the_plugin_never_advertised_fails(node: Node) -> None:
    api = protos.deviceplugin()
    with grpc.insecure_channel(f"unix://{node.gpu.socket}") as channel:
        stub = api.grpc.DevicePluginStub(channel)
        request = api.pb2.AllocateRequest(container_requests=[api.pb2.ContainerAllocateRequest(
            devices_ids=["GPU-0000", "GPU-9999"])])
        with pytest.raises(grpc.RpcError) as failure:
            stub.Allocate(request, timeout=WAIT)
    assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "GPU-9999" in failure.value.details()
    assert node.allocator.allocate_calls == []


def test_pod_resources_list_and_get_show_the_assignments(node: Node) -> None:
    first = node.kubelet.admit("team-a", "train-0", "worker", {GPU_RESOURCE: 1})
    second = node.kubelet.admit("team-b", "infer-0", "server", {MILLI_RESOURCE: 250})
    with node.pod_resources() as client:
        pods = {(p.namespace, p.name): p for p in client.list()}
        assert set(pods) == {("team-a", "train-0"), ("team-b", "infer-0")}
        assert pods["team-a", "train-0"].containers[0].name == "worker"
        assert pods["team-a", "train-0"].devices(GPU_RESOURCE) == first.devices[GPU_RESOURCE]
        got = client.get("team-b", "infer-0")
        assert got is not None
        assert got.devices(MILLI_RESOURCE) == second.devices[MILLI_RESOURCE]
        assert got.devices(GPU_RESOURCE) == ()
        assert client.get("team-b", "missing") is None
        allocatable = client.allocatable()
    assert len(allocatable[GPU_RESOURCE]) == 4
    assert len(allocatable[MILLI_RESOURCE]) == 4000


def test_kubelet_restart_makes_the_plugins_register_again(node: Node) -> None:
    before = node.kubelet.admit("ns", "before", "main", {GPU_RESOURCE: 1})
    started = time.monotonic()
    node.kubelet.restart()
    for resource in (GPU_RESOURCE, MILLI_RESOURCE):
        node.kubelet.wait_for(lambda r=resource: node.kubelet.registrations[r] == 2  # type: ignore[misc]
                              and node.kubelet.connected(r), WAIT, f"{resource} re-registered")
    node.kubelet.wait_for(lambda: (node.gpu.registrations, node.milli.registrations) == (2, 2), WAIT,
                          "the plugins saw their Register calls succeed")
    assert time.monotonic() - started < 5.0
    assert node.gpu.socket.is_socket()
    after = node.kubelet.admit("ns", "after", "main", {GPU_RESOURCE: 1, MILLI_RESOURCE: 10})
    assert not set(after.devices[GPU_RESOURCE]) & set(before.devices[GPU_RESOURCE])  # the checkpoint survived
    assert after.allocations[GPU_RESOURCE].envs["KUBECELL_DEVICES"] == after.devices[GPU_RESOURCE][0]
    with node.pod_resources() as client:
        assert {p.name for p in client.list()} == {"before", "after"}


def test_kubelet_started_after_the_plugin() -> None:
    root = Path(tempfile.mkdtemp(prefix="kc", dir="/tmp"))
    plugin = DevicePlugin(GPU_RESOURCE, DeviceFeed(GPUS), FakeAllocator(), directory=root / "dp", poll_interval=0.05,
                          max_backoff=0.2)
    kubelet = FakeKubelet(root / "dp", root / "pr" / "kubelet.sock")
    try:
        (root / "dp").mkdir()
        plugin.start(register_timeout=0.2)  # no kubelet yet: start returns, the watcher keeps trying
        assert not plugin.wait_registered(0.1)
        kubelet.start()
        assert plugin.wait_registered(WAIT)
        kubelet.wait_for(lambda: kubelet.connected(GPU_RESOURCE), WAIT, "plugin connected")
        assert kubelet.capacity() == {GPU_RESOURCE: 4}
    finally:
        plugin.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_two_pods_admitted_at_once_get_disjoint_devices(node: Node) -> None:
    results: dict[str, set[str]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def admit(pod: str, resource: str, count: int) -> None:
        try:
            barrier.wait(timeout=WAIT)
            results[pod] = set(node.kubelet.admit("ns", pod, "main", {resource: count}).devices[resource])
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=admit, args=args) for args in (
        ("a", GPU_RESOURCE, 2), ("b", GPU_RESOURCE, 2), ("c", MILLI_RESOURCE, 500), ("d", MILLI_RESOURCE, 500))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT)
    assert errors == []
    assert len(results["a"] | results["b"]) == 4
    assert len(results["c"] | results["d"]) == 1000
    with node.pod_resources() as client:
        listed = {p.name: set(p.devices(GPU_RESOURCE)) | set(p.devices(MILLI_RESOURCE)) for p in client.list()}
    assert listed == results


def test_milli_devices_name_slots_of_each_gpu() -> None:
    slots = milli_devices(GPUS[:1], unit=10)
    assert [d.id for d in slots[:2]] == ["GPU-0000::0", "GPU-0000::1"]
    assert len(slots) == 100
    assert {gpu_of(d.id) for d in slots} == {"GPU-0000"}
    with pytest.raises(KubecellError, match="must divide 1000"):
        milli_devices(GPUS, unit=3)


def test_list_and_watch_size_for_eight_gpus_of_1000_milli_slots() -> None:
    """8,000 devices fit one ListAndWatch message well under gRPC's default 4 MiB limit."""
    pb2 = protos.deviceplugin().pb2
    gpus = [Device(f"GPU-{i:08x}-4820-abfc-e83e-94318197576e", True, (i // 4,)) for i in range(8)]
    started = time.perf_counter()
    message = pb2.ListAndWatchResponse(devices=[device_to_proto(pb2, d) for d in milli_devices(gpus)])
    size = len(message.SerializeToString())
    elapsed = time.perf_counter() - started
    print(f"ListAndWatch for 8 GPUs x 1000 milli slots: {size} bytes, built and serialized in {elapsed * 1e3:.0f} ms")
    assert size < 1024 * 1024


def test_streams_past_the_cap_are_refused_and_never_starve_allocate(node: Node) -> None:
    """Each ListAndWatch stream holds a worker thread for its life; before, seven idle streams from another
    client of the socket (besides the kubelet's own) took all eight, and the kubelet's Allocate timed out."""
    api = protos.deviceplugin()
    channels, streams = [], []
    try:
        refused = None
        for _ in range(MAX_WATCHERS + 3):
            channel = grpc.insecure_channel(f"unix://{node.gpu.socket}")
            channels.append(channel)
            stream = api.grpc.DevicePluginStub(channel).ListAndWatch(api.pb2.Empty(), timeout=WAIT)
            try:
                next(stream)
                streams.append(stream)
            except grpc.RpcError as error:
                refused = error
                break
        assert refused is not None, "streams past the cap are refused"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(streams) == MAX_WATCHERS - 1, "the kubelet's own stream holds the first slot"
        started = time.monotonic()
        admitted = node.kubelet.admit("ns", "p", "main", {GPU_RESOURCE: 1})
        assert admitted.devices[GPU_RESOURCE]
        assert time.monotonic() - started < 3
        streams.pop().cancel()  # a slot comes back when a stream ends
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            stream = api.grpc.DevicePluginStub(channels[0]).ListAndWatch(api.pb2.Empty(), timeout=WAIT)
            try:
                next(stream)
                streams.append(stream)
                break
            except grpc.RpcError:
                time.sleep(0.1)
        assert len(streams) == MAX_WATCHERS - 1
    finally:
        for stream in streams:
            stream.cancel()
        for channel in channels:
            channel.close()
