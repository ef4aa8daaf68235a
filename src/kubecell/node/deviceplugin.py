"""The kubelet device plugin (API v1beta1): advertises GPUs or milli-GPU slots and answers Allocate.

One :class:`DevicePlugin` serves one extended resource on one Unix socket in the kubelet's
device-plugin directory: kubecell runs one for ``kubecell.io/gpu`` (a device per GPU UUID) and one for
``kubecell.io/gpu-milli`` (``<uuid>::<k>`` slots, see :func:`milli_devices`). The plugin makes no
decisions: the device list comes from a :class:`DeviceFeed` the node agent publishes to (inventory,
health from XID events), and ``GetPreferredAllocation``/``Allocate`` delegate to an injected
:class:`Allocator` that reads the scheduler's allocation record. An allocator that raises
:class:`AllocationRefused` makes the RPC fail with ``FAILED_PRECONDITION`` and its message, so a
pod whose record does not match is refused by the kubelet instead of starting on the wrong GPU.

Re-registration: a restarting kubelet deletes every socket in the directory and recreates
``kubelet.sock``. A watcher thread polls (every ``poll_interval`` seconds) the identity of
``kubelet.sock`` and the presence of the plugin's own socket; on any change it restarts the gRPC
server on a fresh socket and registers again, retrying with a bounded back-off while the kubelet is down.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc  # type: ignore[import-untyped]

from kubecell.core.errors import KubecellError
from kubecell.node import protos

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
GPU_RESOURCE = "kubecell.io/gpu"
MILLI_RESOURCE = "kubecell.io/gpu-milli"
MILLI_SEPARATOR = "::"
MAX_WATCHERS = 4
"""ListAndWatch streams served at once (the kubelet keeps one; a restarting kubelet's old one may linger)."""
ALLOCATE_WORKERS = 8
"""Threads left for the kubelet's unary calls (Allocate, GetPreferredAllocation) whatever the streams hold."""


@dataclass(frozen=True, slots=True)
class Device:
    """One advertised device: its ID, health and the NUMA nodes it is attached to."""

    id: str
    healthy: bool = True
    numa_nodes: tuple[int, ...] = ()


def milli_devices(gpus: Sequence[Device], unit: int = 1) -> list[Device]:
    """The ``kubecell.io/gpu-milli`` slots of ``gpus``: ``<uuid>::<k>`` for k < 1000 // unit, same health/NUMA.

    ``unit`` is the milli-GPU per slot (1 gives 1000 slots per GPU; 8 GPUs make a ~0.5 MB ListAndWatch message).
    """
    if unit < 1 or 1000 % unit:
        raise KubecellError(f"milli unit {unit} must divide 1000 (accepted: 1, 2, 4, 5, 8, 10, ..., 1000)")
    return [Device(f"{gpu.id}{MILLI_SEPARATOR}{k}", gpu.healthy, gpu.numa_nodes)
            for gpu in gpus for k in range(1000 // unit)]


def gpu_of(device_id: str) -> str:
    """The GPU UUID a device ID names (itself for whole GPUs, the prefix for milli slots)."""
    return device_id.split(MILLI_SEPARATOR, 1)[0]


class DeviceFeed:
    """The latest device list with a version counter, published by the agent and watched by ListAndWatch."""

    def __init__(self, devices: Sequence[Device] = ()) -> None:
        self._condition = threading.Condition()
        self._devices: tuple[Device, ...] = tuple(devices)
        self._version = 0

    def publish(self, devices: Sequence[Device]) -> None:
        """Replace the list; watchers are woken only when it actually changed."""
        new = tuple(devices)
        with self._condition:
            if new == self._devices:
                return
            self._devices = new
            self._version += 1
            self._condition.notify_all()

    def snapshot(self) -> tuple[int, tuple[Device, ...]]:
        with self._condition:
            return self._version, self._devices

    def wait_newer(self, version: int, timeout: float) -> tuple[int, tuple[Device, ...]]:
        """The list once its version passes ``version``, or the current one after ``timeout`` seconds."""
        with self._condition:
            self._condition.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version, self._devices


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What one container gets from Allocate: environment, mounts, device nodes, runtime annotations."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


class DevicePluginError(KubecellError):
    """The plugin cannot serve its socket (the kubelet's device-plugin directory is missing or unusable)."""


class AllocationRefused(KubecellError):  # noqa: N818 - a decision, reported to the kubelet as such
    """The allocator will not allocate these devices; the message reaches the kubelet (FAILED_PRECONDITION)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class Allocator(Protocol):
    """The decision side of the plugin (the record-reading allocator lives elsewhere)."""

    def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        """The ``size`` device IDs the kubelet should pick from ``available`` (including ``must_include``)."""
        ...

    def allocate(self, resource: str, container_requests: list[list[str]]) -> list[ContainerAllocation]:
        """One allocation per container request, in order; raise :class:`AllocationRefused` to refuse."""
        ...


def abort(context: Any, code: Any, message: str) -> NoReturn:
    """End an RPC with ``code``; ``context.abort`` raises, and saying so lets mypy follow the flow."""
    context.abort(code, message)
    raise AssertionError("grpc's context.abort returned")


def device_to_proto(pb2: Any, device: Device) -> Any:
    topology = pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=node) for node in device.numa_nodes])
    return pb2.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY,
                      topology=topology if device.numa_nodes else None)


def device_from_proto(message: Any) -> Device:
    nodes = tuple(int(node.ID) for node in message.topology.nodes) if message.HasField("topology") else ()
    return Device(str(message.ID), message.health == HEALTHY, nodes)


def allocation_to_proto(pb2: Any, allocation: ContainerAllocation) -> Any:
    return pb2.ContainerAllocateResponse(
        envs=dict(allocation.envs), annotations=dict(allocation.annotations),
        mounts=[pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in allocation.mounts],
        devices=[pb2.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                 for d in allocation.devices])


def allocation_from_proto(message: Any) -> ContainerAllocation:
    return ContainerAllocation(
        envs=dict(message.envs), annotations=dict(message.annotations),
        mounts=tuple(Mount(m.container_path, m.host_path, m.read_only) for m in message.mounts),
        devices=tuple(DeviceSpec(d.container_path, d.host_path, d.permissions) for d in message.devices))


def _unavailable(context: Any, resource: str, call: str, error: KubecellError) -> NoReturn:
    """The allocator could not decide (the API server is away, say): a clear UNAVAILABLE to the kubelet and
    one log line, instead of grpc's UNKNOWN "Exception calling application" and a stack trace."""
    log.warning("%s for %s failed: %s", call, resource, error)
    abort(context, grpc.StatusCode.UNAVAILABLE, f"{resource}: {call} cannot be decided now: {error}")


def _shown(ids: Sequence[str], most: int = 5, width: int = 80) -> str:
    """Device IDs for an error message: at most ``most`` of them, each cut to ``width`` characters and
    quoted, so a hostile request cannot flood the kubelet's event or the log with one enormous or
    multi-line ID."""
    shown = [repr(i if len(i) <= width else i[:width] + "...") for i in ids[:most]]
    return ", ".join(shown) + (f" ... ({len(ids)} in all)" if len(ids) > most else "")


def _malformed(requests: Sequence[Sequence[str]]) -> str | None:
    """What makes an Allocate request one the kubelet never sends, or None: no container, a container
    with no device, or one device ID twice in a container."""
    if not requests:
        return "names no container"
    for position, ids in enumerate(requests):
        if not ids:
            return f"names no device for container request {position}"
        repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
        if repeated:
            return f"names device(s) {_shown(repeated)} more than once in container request {position}"
    return None


def socket_name(resource: str) -> str:
    """``kubecell.io/gpu-milli`` -> ``kubecell-gpu-milli.sock``: one file per resource, kubelet-safe chars."""
    return "kubecell-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", resource.split("/", 1)[-1]) + ".sock"


class _Servicer:
    """The ``DevicePlugin`` service; a thin translation between protos and the feed and allocator."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self._plugin = plugin
        self._pb2 = protos.deviceplugin().pb2
        self._lock = threading.Lock()
        self.watchers = 0
        """ListAndWatch streams open now."""

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        return self._pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        """A stream holds a worker thread for its whole life. The kubelet keeps one per plugin; streams past
        ``MAX_WATCHERS`` are refused, so ``Allocate`` always has ``ALLOCATE_WORKERS`` threads (before, seven
        idle streams from another client of the socket left the kubelet's Allocate to time out)."""
        with self._lock:
            if self.watchers >= MAX_WATCHERS:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{MAX_WATCHERS} ListAndWatch streams are open already; the kubelet keeps one")
            self.watchers += 1
        try:
            feed, stopping = self._plugin.feed, self._plugin._serving_stopped
            version, devices = feed.snapshot()
            yield self._pb2.ListAndWatchResponse(devices=[device_to_proto(self._pb2, d) for d in devices])
            while context.is_active() and not stopping.is_set():
                newer, devices = feed.wait_newer(version, timeout=0.5)
                if newer != version:
                    version = newer
                    yield self._pb2.ListAndWatchResponse(devices=[device_to_proto(self._pb2, d) for d in devices])
        finally:
            with self._lock:
                self.watchers -= 1

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        responses = []
        for container in request.container_requests:
            try:
                chosen = self._plugin.allocator.preferred(
                    self._plugin.resource, list(container.available_deviceIDs),
                    list(container.must_include_deviceIDs), int(container.allocation_size))
            except AllocationRefused as refused:
                abort(context, grpc.StatusCode.FAILED_PRECONDITION, refused.message)
            except KubecellError as error:
                _unavailable(context, self._plugin.resource, "GetPreferredAllocation", error)
            responses.append(self._pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return self._pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        requests = [list(container.devices_ids) for container in request.container_requests]
        resource = self._plugin.resource
        malformed = _malformed(requests)
        if malformed:  # the kubelet never sends these; answering would count a container that got nothing
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{resource}: Allocate request {malformed}")
        _, devices = self._plugin.feed.snapshot()
        known = {device.id for device in devices}
        unknown = sorted({i for ids in requests for i in ids} - known)
        if unknown:
            abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                  f"{resource}: Allocate names devices this node does not advertise: {_shown(unknown)}")
        unhealthy = sorted({i for ids in requests for i in ids} & {d.id for d in devices if not d.healthy})
        if unhealthy:  # the GPU took a critical XID after the kubelet chose it: no container starts on it
            abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                  f"{resource}: Allocate names devices this node reports {UNHEALTHY} (a critical XID took their "
                  f"GPU out of service): {_shown(unhealthy)}")
        try:
            allocations = self._plugin.allocator.allocate(self._plugin.resource, requests)
        except AllocationRefused as refused:
            log.warning("Allocate refused for %s: %s", self._plugin.resource, refused.message)
            abort(context, grpc.StatusCode.FAILED_PRECONDITION, refused.message)
        except KubecellError as error:
            _unavailable(context, resource, "Allocate", error)
        if len(allocations) != len(requests):
            abort(context, grpc.StatusCode.INTERNAL,
                  f"allocator returned {len(allocations)} allocations for {len(requests)} containers")
        return self._pb2.AllocateResponse(
            container_responses=[allocation_to_proto(self._pb2, a) for a in allocations])

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._pb2.PreStartContainerResponse()


def register(directory: Path, endpoint: str, resource: str, timeout: float = 5.0) -> None:
    """Call ``Registration.Register`` on ``<directory>/kubelet.sock``; raises ``grpc.RpcError`` on failure."""
    api = protos.deviceplugin()
    with grpc.insecure_channel(f"unix://{directory / KUBELET_SOCKET}") as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        options = api.pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
        api.grpc.RegistrationStub(channel).Register(
            api.pb2.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource,
                                    options=options), timeout=timeout)


def _identity(path: Path) -> tuple[int, int] | None:
    """The inode and change time of a file: a socket recreated at the same path changes it."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_ctime_ns


class DevicePlugin:
    """Serves one resource on ``<directory>/<endpoint>`` and keeps it registered with the kubelet."""

    def __init__(self, resource: str, feed: DeviceFeed, allocator: Allocator, *,
                 directory: Path = DEVICE_PLUGIN_DIR, endpoint: str | None = None,
                 poll_interval: float = 0.2, max_backoff: float = 5.0) -> None:
        self.resource = resource
        self.feed = feed
        self.allocator = allocator
        self.directory = Path(directory)
        self.endpoint = endpoint or socket_name(resource)
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff
        self.registrations = 0
        """How many times Register succeeded (1 after start, +1 per kubelet restart)."""
        self._server: Any = None
        self._serving_stopped = threading.Event()
        self._stop = threading.Event()
        self._registered = threading.Event()
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def socket(self) -> Path:
        return self.directory / self.endpoint

    def start(self, register_timeout: float = 10.0) -> None:
        """Serve, register (waiting up to ``register_timeout`` s for a kubelet) and watch for restarts.

        A directory that is not there yet (the kubelet has not started) is no reason to give up: the watcher
        serves as soon as the kubelet's socket appears."""
        self._stop.clear()
        try:
            self._serve()
        except DevicePluginError as error:
            log.warning("%s: %s; serving once the kubelet's socket appears", self.resource, error)
        self._watcher = threading.Thread(target=self._watch, name=f"deviceplugin-{self.endpoint}", daemon=True)
        self._watcher.start()
        if not self._registered.wait(register_timeout):
            log.warning("%s: no kubelet accepted the registration within %.0f s; still trying",
                        self.resource, register_timeout)

    def wait_registered(self, timeout: float) -> bool:
        return self._registered.wait(timeout)

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=grace + 5 * self.poll_interval + 5)
        with self._lock:
            self._halt(grace)

    def _serve(self) -> None:
        with self._lock:
            self._halt(0.5)
            self.socket.unlink(missing_ok=True)
            api = protos.deviceplugin()
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=ALLOCATE_WORKERS + MAX_WATCHERS,
                                                            thread_name_prefix="deviceplugin"))
            api.grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
            try:
                server.add_insecure_port(f"unix://{self.socket}")
            except RuntimeError as error:  # grpc's "Failed to bind to address": say which and why
                why = f"{self.directory} does not exist" if not self.directory.is_dir() else str(error)
                raise DevicePluginError(f"cannot serve on {self.socket}: {why}") from None
            self._serving_stopped = threading.Event()
            server.start()
            self._server = server
            self._registered.clear()

    def _halt(self, grace: float) -> None:
        if self._server is not None:
            self._serving_stopped.set()  # ends ListAndWatch streams at their next wake-up
            self._server.stop(grace).wait(grace + 1)
            self._server = None

    def _watch(self) -> None:
        """Keep the plugin served and registered until :meth:`stop`; no error ends the thread, since a plugin
        that stops following the kubelet takes the node's GPUs out of service until the agent restarts."""
        backoff = self.poll_interval
        while not self._stop.is_set():
            try:
                self._follow()
                return
            except (DevicePluginError, OSError) as error:
                log.warning("%s: %s; retrying in %.1f s", self.resource, error, backoff)
            except Exception:  # a bug must not end re-registration for the agent's lifetime
                log.exception("%s: unexpected error while following the kubelet; retrying in %.1f s",
                              self.resource, backoff)
            self._registered.clear()  # serve and register afresh once the kubelet is back
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    def _follow(self) -> None:
        """Register; afterwards re-serve and re-register whenever the kubelet's or our socket changes."""
        kubelet = self.directory / KUBELET_SOCKET
        seen: tuple[int, int] | None = None
        backoff = self.poll_interval
        while not self._stop.is_set():
            current = _identity(kubelet)
            if self._registered.is_set() and (current != seen or not self.socket.exists()):
                log.info("%s: kubelet socket changed or our socket vanished; restarting and re-registering",
                         self.resource)
                self._serve()
            if not self._registered.is_set() and current is not None:
                try:
                    if not self.socket.exists():
                        self._serve()
                    register(self.directory, self.endpoint, self.resource)
                except grpc.RpcError as error:
                    log.warning("%s: registration with %s failed: %s", self.resource, kubelet, error)
                except grpc.FutureTimeoutError:
                    log.warning("%s: %s does not answer", self.resource, kubelet)
                else:
                    seen = current
                    backoff = self.poll_interval
                    self.registrations += 1
                    self._registered.set()
                    log.info("%s: registered with the kubelet as %s", self.resource, self.endpoint)
                    continue
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            self._stop.wait(self.poll_interval)
