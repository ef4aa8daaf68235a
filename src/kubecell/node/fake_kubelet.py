"""A fake kubelet that speaks the real device-plugin and PodResources protos over Unix sockets.

Why a fake: a real kubelet (v1.37.2, buildable from the Go modules like the testbed's control plane)
cannot run in this sandbox or on CI machines: it needs a CRI container runtime on a socket, write
access to the cgroup hierarchy (it creates the kubepods cgroups, and refuses to start without the cpu,
memory and pids controllers), and root for mounts and the device-plugin directory it owns. None of
those exist in an unprivileged container, and a fake CRI runtime would still leave the cgroup manager.

What it does is exactly the part of the kubelet a device plugin talks to, modelled on
``pkg/kubelet/cm/devicemanager``: a ``Registration`` server on ``<dir>/kubelet.sock`` that, on
``Register``, checks the version, dials the plugin's endpoint, calls ``GetDevicePluginOptions`` and
follows ``ListAndWatch``; capacity (all devices) and allocatable (healthy ones) per resource; an
:meth:`FakeKubelet.admit` that picks devices the way ``devicesToAllocate`` does (the plugin's
preferred allocation first when it offers one, then any free healthy device), reserves them, calls
``Allocate`` and records the assignment; the PodResources v1 API served from those assignments; and a
:meth:`FakeKubelet.restart` that, like a restarting kubelet, removes every socket in the directory and
serves ``kubelet.sock`` anew while keeping its assignments (the real one keeps them in a checkpoint).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from kubecell.core.errors import KubecellError
from kubecell.node import protos
from kubecell.node.deviceplugin import (
    API_VERSION,
    KUBELET_SOCKET,
    ContainerAllocation,
    Device,
    abort,
    allocation_from_proto,
    device_from_proto,
)

RPC_TIMEOUT = 10.0


class AdmissionFailed(KubecellError):  # noqa: N818 - what the kubelet reports: UnexpectedAdmissionError
    """The kubelet could not admit the pod: unregistered resource, too few devices, or a plugin RPC error."""

    def __init__(self, resource: str, message: str, code: str | None = None) -> None:
        self.resource = resource
        self.code = code
        self.message = message
        super().__init__(f"{resource}: {message}" + (f" (gRPC {code})" if code else ""))


@dataclass(frozen=True, slots=True)
class Admission:
    """What one admitted container got: device IDs and the plugin's allocation, by resource name."""

    namespace: str
    pod: str
    container: str
    devices: Mapping[str, tuple[str, ...]]
    allocations: Mapping[str, ContainerAllocation]


class _Plugin:
    """The kubelet's end of one registered plugin: a channel, its options, and the followed device list."""

    def __init__(self, resource: str, socket: Path, on_update: Callable[[], None]) -> None:
        api = protos.deviceplugin()
        self.resource = resource
        self.socket = socket
        self.devices: dict[str, Device] = {}
        self.updates = 0
        self.connected = True
        self._pb2 = api.pb2
        self._on_update = on_update
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        grpc.channel_ready_future(self._channel).result(timeout=RPC_TIMEOUT)
        self.stub = api.grpc.DevicePluginStub(self._channel)
        self.options = self.stub.GetDevicePluginOptions(api.pb2.Empty(), timeout=RPC_TIMEOUT)
        self._stream = self.stub.ListAndWatch(api.pb2.Empty())
        self._thread = threading.Thread(target=self._follow, name=f"fake-kubelet-{resource}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for response in self._stream:
                self.devices = {d.id: d for d in map(device_from_proto, response.devices)}
                self.updates += 1
                self._on_update()
        except grpc.RpcError:
            pass  # cancelled by close(), or the plugin went away: the kubelet keeps the last list
        self.connected = False
        self._on_update()

    def close(self) -> None:
        self._stream.cancel()
        self._channel.close()
        self._thread.join(timeout=RPC_TIMEOUT)


class _Registration:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        if request.version != API_VERSION:
            abort(context, grpc.StatusCode.UNKNOWN, f"requested API version {request.version!r} is not supported "
                                                   f"by kubelet. Supported versions are [{API_VERSION!r}]")
        if "/" not in request.resource_name or request.resource_name.startswith("kubernetes.io/"):
            abort(context, grpc.StatusCode.UNKNOWN, f"the ResourceName {request.resource_name!r} is invalid")
        try:
            plugin = _Plugin(request.resource_name, self._kubelet.directory / request.endpoint,
                             self._kubelet._changed)
        except (grpc.RpcError, grpc.FutureTimeoutError) as error:
            abort(context, grpc.StatusCode.UNKNOWN, f"failed to dial device plugin {request.endpoint}: {error}")
        self._kubelet._connect(plugin)
        return protos.deviceplugin().pb2.Empty()


class _PodResources:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet
        self._pb2 = protos.podresources().pb2

    def _pod(self, namespace: str, name: str, containers: Mapping[str, Mapping[str, tuple[str, ...]]]) -> Any:
        return self._pb2.PodResources(namespace=namespace, name=name, containers=[
            self._pb2.ContainerResources(name=container, devices=[
                self._pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                for resource, ids in sorted(by_resource.items())])
            for container, by_resource in containers.items()])

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802
        pods = self._kubelet.assignments()
        return self._pb2.ListPodResourcesResponse(
            pod_resources=[self._pod(ns, name, containers) for (ns, name), containers in sorted(pods.items())])

    def Get(self, request: Any, context: Any) -> Any:  # noqa: N802
        containers = self._kubelet.assignments().get((request.pod_namespace, request.pod_name))
        if containers is None:  # the kubelet answers with a plain error (gRPC code Unknown), not NotFound
            abort(context, grpc.StatusCode.UNKNOWN,
                          f"pod {request.pod_name} in namespace {request.pod_namespace} not found")
        return self._pb2.GetPodResourcesResponse(
            pod_resources=self._pod(request.pod_namespace, request.pod_name, containers))

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        healthy = {resource: [d.id for d in devices if d.healthy]
                   for resource, devices in self._kubelet.all_devices().items()}
        return self._pb2.AllocatableResourcesResponse(devices=[
            self._pb2.ContainerDevices(resource_name=resource, device_ids=ids)
            for resource, ids in sorted(healthy.items())])


class FakeKubelet:
    """Registration + device manager + PodResources, on ``<directory>/kubelet.sock`` and ``pod_resources``."""

    def __init__(self, directory: Path, pod_resources: Path | None = None) -> None:
        self.directory = Path(directory)
        self.pod_resources = pod_resources or self.directory.parent / "pod-resources" / KUBELET_SOCKET
        self.registrations: dict[str, int] = {}
        """How many times each resource registered (it grows by one per plugin re-registration)."""
        self._changes = threading.Condition()
        self._admission = threading.Lock()  # the kubelet admits one pod at a time
        self._plugins: dict[str, _Plugin] = {}
        self._in_use: dict[str, set[str]] = {}
        self._assigned: dict[tuple[str, str], dict[str, dict[str, tuple[str, ...]]]] = {}
        self._servers: list[Any] = []

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pod_resources.parent.mkdir(parents=True, exist_ok=True)
        self._remove_sockets()
        api, resources_api = protos.deviceplugin(), protos.podresources()
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet"))
        api.grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        registration.add_insecure_port(f"unix://{self.directory / KUBELET_SOCKET}")
        lister = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-podresources"))
        resources_api.grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), lister)
        self.pod_resources.unlink(missing_ok=True)
        lister.add_insecure_port(f"unix://{self.pod_resources}")
        registration.start()
        lister.start()
        self._servers = [registration, lister]
        return self

    def stop(self, grace: float = 1.0) -> None:
        for server in self._servers:
            server.stop(grace).wait(grace + 1)
        self._servers = []
        with self._changes:
            plugins, self._plugins = list(self._plugins.values()), {}
        for plugin in plugins:
            plugin.close()

    def restart(self, down_for: float = 0.0) -> None:
        """Stop, remove ``kubelet.sock`` and every plugin socket, and serve again; assignments survive."""
        self.stop(grace=0.2)
        self._remove_sockets()
        time.sleep(down_for)
        self.start()

    def _remove_sockets(self) -> None:
        for path in self.directory.iterdir():
            if path.is_socket():
                path.unlink(missing_ok=True)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the device manager knows ---------------------------------------------------------------

    def _connect(self, plugin: _Plugin) -> None:
        with self._changes:
            old = self._plugins.get(plugin.resource)
            self._plugins[plugin.resource] = plugin
            self.registrations[plugin.resource] = self.registrations.get(plugin.resource, 0) + 1
            self._changes.notify_all()
        if old is not None:
            old.close()

    def _changed(self) -> None:
        with self._changes:
            self._changes.notify_all()

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Block until ``condition()`` holds (re-checked on every registration or device update)."""
        deadline = time.monotonic() + timeout
        with self._changes:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake kubelet: {what} did not happen within {timeout:.1f} s")
                self._changes.wait(min(left, 0.1))

    def connected(self, resource: str) -> bool:
        plugin = self._plugins.get(resource)
        return plugin is not None and plugin.connected and plugin.updates > 0

    def options(self, resource: str) -> Any:
        """The plugin's ``DevicePluginOptions`` as the kubelet received them."""
        return self._plugins[resource].options

    def devices(self, resource: str) -> list[Device]:
        plugin = self._plugins.get(resource)
        return sorted(plugin.devices.values(), key=lambda d: d.id) if plugin else []

    def all_devices(self) -> dict[str, list[Device]]:
        return {resource: self.devices(resource) for resource in list(self._plugins)}

    def capacity(self) -> dict[str, int]:
        """What the kubelet would put in ``Node.status.capacity``: every device, healthy or not."""
        return {resource: len(devices) for resource, devices in self.all_devices().items()}

    def allocatable(self) -> dict[str, int]:
        """``Node.status.allocatable``: healthy devices only."""
        return {resource: sum(d.healthy for d in devices) for resource, devices in self.all_devices().items()}

    def assignments(self) -> dict[tuple[str, str], dict[str, dict[str, tuple[str, ...]]]]:
        """(namespace, pod) -> container -> resource -> device IDs, as PodResources reports them."""
        with self._changes:
            return {pod: {c: dict(r) for c, r in containers.items()} for pod, containers in self._assigned.items()}

    # -- admission -----------------------------------------------------------------------------------

    def admit(self, namespace: str, pod: str, container: str, requests: Mapping[str, int]) -> Admission:
        """Allocate ``requests`` ({resource: count}) to one container like the kubelet's device manager."""
        chosen: dict[str, tuple[str, ...]] = {}
        with self._admission:
            for resource, count in requests.items():
                chosen[resource] = self._pick(resource, count)
        allocations: dict[str, ContainerAllocation] = {}
        try:
            for resource, ids in chosen.items():
                allocations[resource] = self._allocate(resource, ids)
        except AdmissionFailed:
            with self._changes:
                for resource, ids in chosen.items():
                    self._in_use[resource].difference_update(ids)
            raise
        with self._changes:
            self._assigned.setdefault((namespace, pod), {})[container] = dict(chosen)
        return Admission(namespace, pod, container, chosen, allocations)

    def release(self, namespace: str, pod: str) -> None:
        """The pod is gone: its devices are free again."""
        with self._changes:
            for by_resource in self._assigned.pop((namespace, pod), {}).values():
                for resource, ids in by_resource.items():
                    self._in_use[resource].difference_update(ids)

    def _pick(self, resource: str, count: int) -> tuple[str, ...]:
        plugin = self._plugins.get(resource)
        if plugin is None:
            raise AdmissionFailed(resource, f"cannot allocate unregistered device {resource}")
        with self._changes:
            in_use = self._in_use.setdefault(resource, set())
            available = sorted(d.id for d in plugin.devices.values() if d.healthy and d.id not in in_use)
        if len(available) < count:
            raise AdmissionFailed(resource, f"requested number of devices unavailable for {resource}. "
                                            f"Requested: {count}, Available: {len(available)}")
        picked: list[str] = []
        if plugin.options.get_preferred_allocation_available:
            pb2 = protos.deviceplugin().pb2
            request = pb2.PreferredAllocationRequest(container_requests=[pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=[], allocation_size=count)])
            try:
                response = plugin.stub.GetPreferredAllocation(request, timeout=RPC_TIMEOUT)
            except grpc.RpcError as error:
                raise AdmissionFailed(resource, error.details(), error.code().name) from error
            offered = set(available)
            for device_id in response.container_responses[0].deviceIDs:
                if device_id in offered and device_id not in picked and len(picked) < count:
                    picked.append(device_id)
        taken = set(picked)
        picked.extend([i for i in available if i not in taken][:count - len(picked)])
        with self._changes:
            in_use.update(picked)
        return tuple(picked)

    def _allocate(self, resource: str, ids: tuple[str, ...]) -> ContainerAllocation:
        plugin = self._plugins.get(resource)
        if plugin is None:
            raise AdmissionFailed(resource, f"cannot allocate unregistered device {resource}")
        pb2 = protos.deviceplugin().pb2
        request = pb2.AllocateRequest(container_requests=[pb2.ContainerAllocateRequest(devices_ids=list(ids))])
        try:
            response = plugin.stub.Allocate(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as error:
            raise AdmissionFailed(resource, error.details(), error.code().name) from error
        if len(response.container_responses) != 1:
            raise AdmissionFailed(resource, f"Allocate returned {len(response.container_responses)} responses "
                                            "for 1 container")
        return allocation_from_proto(response.container_responses[0])
