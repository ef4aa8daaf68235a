"""What the node agent needs from a GPU driver, and the real answer from NVML (``nvidia-ml-py``).

The agent reads GPUs through :class:`GpuBackend` only, so the inventory publisher, the device plugin and
overuse detection run the same code over real NVML (:class:`NvmlBackend`) and over a YAML description
(:mod:`kubecell.node.fake_nvml`) on machines without GPUs and in tests.

Every NVML failure becomes :class:`NvmlError` naming the call and the device (``nvmlDeviceGetUUID(gpu 3):
GPU is lost``), never a bare ``pynvml.NVMLError_GpuIsLost`` with no context. ``pynvml`` is imported when a
backend is opened, not when this module is, so the agent and its tests import everywhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal, Protocol, runtime_checkable

from kubecell.core.errors import KubecellError
from kubecell.node.xid import XidEvent

MigMode = Literal["disabled", "enabled"]
MIB = 2**20


class GpuBackendError(KubecellError):
    """A GPU backend could not answer (driver missing, GPU lost, a bad fake description)."""


class NvmlError(GpuBackendError):
    """An NVML call failed: which call, on which device, and NVML's own message and code."""

    def __init__(self, call: str, device: str, message: str, code: int | None = None) -> None:
        self.call = call
        self.device = device
        self.code = code
        where = f"{call}({device})" if device else call
        suffix = f" (NVML error {code})" if code is not None else ""
        super().__init__(f"{where}: {message}{suffix}")


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device of a GPU: the unit a pod gets in ``mig`` isolation.

    ``start``/``size`` are the GPU instance's placement in memory slices (an A100 has 8), which is what
    decides whether another profile still fits; ``profile`` is NVIDIA's name (``"3g.20gb"``)."""

    uuid: str
    profile: str
    memory_mib: int
    start: int
    size: int
    gpu_instance_id: int = 0


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU as discovered: identity, memory, topology and MIG state."""

    index: int
    uuid: str
    product: str
    memory_mib: int
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] = ()
    mig_mode: MigMode = "disabled"
    mig_instances: tuple[MigInstance, ...] = ()
    pci_bus_id: str = ""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process using a GPU: its memory and (when the driver samples it) its SM and memory-controller
    utilisation (the second tells a bandwidth-bound job from a compute-bound one, which the co-location
    predictor weighs)."""

    pid: int
    memory_mib: int
    utilization_percent: int | None = None
    memory_utilization_percent: int | None = None


@runtime_checkable
class GpuBackend(Protocol):
    """The node agent's view of the GPU driver."""

    def devices(self) -> list[GpuDevice]:
        """Every GPU of the node, ordered by index (0..n-1)."""
        ...

    def processes(self, index: int) -> list[GpuProcess]:
        """The compute processes on GPU ``index`` now (for overuse detection)."""
        ...

    def wait_xid(self, timeout: float) -> XidEvent | None:
        """The next XID event of any GPU, or None after ``timeout`` seconds without one."""
        ...

    def close(self) -> None:
        """Release the driver (NVML shutdown); the backend is unusable afterwards."""
        ...


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalise_bus_id(bus_id: str) -> str:
    """PCI bus ids compared across calls: NVML gives ``00000000:07:00.0`` in some calls and ``0000:07:00.0``
    in others, in either case; the last three fields (bus:device.function) plus a 4-digit domain match."""
    parts = bus_id.strip().lower().split(":")
    domain = parts[0] if len(parts) == 3 else "0"
    try:
        return ":".join([f"{int(domain, 16):04x}", *parts[-2:]])
    except ValueError:
        return bus_id.strip().lower()


@dataclass
class NvmlBackend:
    """:class:`GpuBackend` over NVML. ``module`` is the ``pynvml`` module (tests pass a fake one).

    NVLink peers are the GPUs at the far end of each active link (their PCI bus ids mapped to indices; an
    NVSwitch at the far end is not a GPU and is skipped, so NVSwitch systems need the fabric's view, a
    known limitation). The NUMA node comes from ``nvmlDeviceGetNumaNodeId`` where the driver has it, else
    from sysfs for the GPU's PCI address."""

    module: ModuleType | None = None
    numa_from_sysfs: Callable[[str], int | None] | None = None
    unwatched: list[int] = field(default_factory=list)
    """GPUs whose XID events NVML cannot deliver (``nvmlDeviceRegisterEvents``: not supported)."""
    _nvml: Any = field(init=False, default=None)
    _events: Any = field(init=False, default=None)
    _handles: dict[int, Any] = field(init=False, default_factory=dict)
    _uuids: dict[int, str] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.module is None:
            try:
                import pynvml  # type: ignore[import-untyped]
            except ImportError:
                raise GpuBackendError("nvidia-ml-py is not installed (pip install 'kubecell[node]')") from None
            self.module = pynvml
        self._nvml = self.module
        self.call("nvmlInit")
        if self.numa_from_sysfs is None:
            self.numa_from_sysfs = _sysfs_numa

    # ------------------------------------------------------------------ error handling
    def call(self, name: str, *args: Any, device: str = "") -> Any:
        """Call ``pynvml.<name>(*args)``; an NVML failure becomes :class:`NvmlError` naming call and device."""
        nvml = self._nvml
        function = getattr(nvml, name, None)
        if function is None:
            raise NvmlError(name, device, "not provided by this nvidia-ml-py (upgrade it)")
        try:
            return function(*args)
        except nvml.NVMLError as error:
            raise NvmlError(name, device, str(error), getattr(error, "value", None)) from None

    def _supported(self, name: str, *args: Any, device: str = "") -> Any:
        """Like :meth:`call`, but None where the GPU or driver does not support the query."""
        try:
            return self.call(name, *args, device=device)
        except NvmlError as error:
            if error.code in (self._nvml.NVML_ERROR_NOT_SUPPORTED, self._nvml.NVML_ERROR_FUNCTION_NOT_FOUND) or \
                    "not provided" in str(error):
                return None
            raise

    # ------------------------------------------------------------------ discovery
    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self.call("nvmlDeviceGetHandleByIndex", index, device=f"gpu {index}")
        return self._handles[index]

    def devices(self) -> list[GpuDevice]:
        with self._lock:
            count = int(self.call("nvmlDeviceGetCount"))
            bus_ids: dict[str, int] = {}
            raw: list[dict[str, Any]] = []
            for index in range(count):
                handle, where = self._handle(index), f"gpu {index}"
                uuid = _text(self.call("nvmlDeviceGetUUID", handle, device=where))
                self._uuids[index] = uuid
                bus_id = normalise_bus_id(_text(self.call("nvmlDeviceGetPciInfo", handle, device=where).busId))
                bus_ids[bus_id] = index
                raw.append({"index": index, "handle": handle, "where": f"gpu {index} {uuid}", "uuid": uuid,
                            "bus_id": bus_id})
            return [self._device(item, bus_ids) for item in raw]

    def _device(self, item: dict[str, Any], bus_ids: dict[str, int]) -> GpuDevice:
        handle, where = item["handle"], item["where"]
        product = _text(self.call("nvmlDeviceGetName", handle, device=where))
        memory = int(self.call("nvmlDeviceGetMemoryInfo", handle, device=where).total) // MIB
        numa = self._supported("nvmlDeviceGetNumaNodeId", handle, device=where)
        if numa is None or int(numa) < 0:
            numa = self.numa_from_sysfs(item["bus_id"]) if self.numa_from_sysfs else None
        peers = self._nvlink_peers(handle, where, bus_ids, item["index"])
        mode = self._supported("nvmlDeviceGetMigMode", handle, device=where)
        enabled = bool(mode) and int(mode[0]) == int(self._nvml.NVML_DEVICE_MIG_ENABLE)
        return GpuDevice(index=item["index"], uuid=item["uuid"], product=product, memory_mib=memory,
                         numa_node=None if numa is None else int(numa), nvlink_peers=peers,
                         mig_mode="enabled" if enabled else "disabled",
                         mig_instances=self._mig_instances(handle, where) if enabled else (),
                         pci_bus_id=item["bus_id"])

    def _nvlink_peers(self, handle: Any, where: str, bus_ids: dict[str, int], index: int) -> tuple[int, ...]:
        peers: set[int] = set()
        for link in range(int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                active = self.call("nvmlDeviceGetNvLinkState", handle, link, device=f"{where} link {link}")
            except NvmlError as error:
                # NOT_SUPPORTED: no NVLink at all (PCIe card); INVALID_ARGUMENT: past the last link.
                if error.code in (self._nvml.NVML_ERROR_NOT_SUPPORTED, self._nvml.NVML_ERROR_INVALID_ARGUMENT):
                    break
                raise
            if not active:
                continue
            remote = self.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, device=f"{where} link {link}")
            peer = bus_ids.get(normalise_bus_id(_text(remote.busId)))
            if peer is not None and peer != index:
                peers.add(peer)
        return tuple(sorted(peers))

    def _mig_instances(self, handle: Any, where: str) -> tuple[MigInstance, ...]:
        found: list[MigInstance] = []
        for slot in range(int(self.call("nvmlDeviceGetMaxMigDeviceCount", handle, device=where))):
            try:
                mig = self.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, device=f"{where} MIG {slot}")
            except NvmlError as error:
                if error.code == self._nvml.NVML_ERROR_NOT_FOUND:
                    continue  # an empty slot
                raise
            mig_where = f"{where} MIG {slot}"
            name = _text(self.call("nvmlDeviceGetName", mig, device=mig_where))
            gi_id = int(self.call("nvmlDeviceGetGpuInstanceId", mig, device=mig_where))
            instance = self.call("nvmlDeviceGetGpuInstanceById", handle, gi_id, device=f"{where} GI {gi_id}")
            placement = self.call("nvmlGpuInstanceGetInfo", instance, device=f"{where} GI {gi_id}").placement
            found.append(MigInstance(
                uuid=_text(self.call("nvmlDeviceGetUUID", mig, device=mig_where)),
                profile=name.rsplit("MIG ", 1)[-1].strip() if "MIG " in name else name,
                memory_mib=int(self.call("nvmlDeviceGetMemoryInfo", mig, device=mig_where).total) // MIB,
                start=int(placement.start), size=int(placement.size), gpu_instance_id=gi_id))
        return tuple(sorted(found, key=lambda m: (m.start, m.uuid)))

    # ------------------------------------------------------------------ processes
    def processes(self, index: int) -> list[GpuProcess]:
        with self._lock:
            handle, where = self._handle(index), f"gpu {index}"
            running = self.call("nvmlDeviceGetComputeRunningProcesses", handle, device=where)
            samples = self._utilisation(handle, where)
        result = []
        for process in running:
            used = getattr(process, "usedGpuMemory", None)
            memory = int(used) // MIB if isinstance(used, int) and used >= 0 else 0  # None: not permitted to read
            sm, controller = samples.get(int(process.pid), (None, None))
            result.append(GpuProcess(int(process.pid), memory, sm, controller))
        return result

    def _utilisation(self, handle: Any, where: str) -> dict[int, tuple[int | None, int | None]]:
        """SM and memory-controller utilisation per pid over the driver's last sampling window (empty where
        unsupported or idle)."""
        since = int((time.time() - 10) * 1_000_000)
        try:
            samples = self.call("nvmlDeviceGetProcessUtilization", handle, since, device=where)
        except NvmlError as error:
            if error.code in (self._nvml.NVML_ERROR_NOT_SUPPORTED, self._nvml.NVML_ERROR_NOT_FOUND):
                return {}
            raise
        # smUtil is checked like memUtil: drivers have returned sentinels such as 2147483632 there (DCGM #83,
        # nvtop #110), and one of those would read as a pod using millions of percent of its GPU
        return {int(sample.pid): (_percent(getattr(sample, "smUtil", None)),
                                  _percent(getattr(sample, "memUtil", None)))
                for sample in samples or ()}

    # ------------------------------------------------------------------ events
    def _event_set(self) -> Any:
        """The XID event set, created once; a GPU that cannot deliver XID events is listed in ``unwatched``."""
        if self._events is None:
            events = self.call("nvmlEventSetCreate")
            kind = int(self._nvml.nvmlEventTypeXidCriticalError)
            try:
                for index in range(int(self.call("nvmlDeviceGetCount"))):
                    try:
                        self.call("nvmlDeviceRegisterEvents", self._handle(index), kind, events,
                                  device=f"gpu {index}")
                    except NvmlError as error:
                        if error.code != self._nvml.NVML_ERROR_NOT_SUPPORTED:
                            raise
                        if index not in self.unwatched:
                            self.unwatched.append(index)
            except NvmlError:
                self._supported("nvmlEventSetFree", events)  # the next attempt starts a fresh set
                raise
            self._events = events
        return self._events

    def wait_xid(self, timeout: float) -> XidEvent | None:
        with self._lock:
            events = self._event_set()
            if not self._uuids:
                for index in range(int(self.call("nvmlDeviceGetCount"))):
                    self._uuids[index] = _text(self.call("nvmlDeviceGetUUID", self._handle(index),
                                                         device=f"gpu {index}"))
        try:
            data = self.call("nvmlEventSetWait", events, max(0, int(timeout * 1000)))
        except NvmlError as error:
            if error.code == self._nvml.NVML_ERROR_TIMEOUT:
                return None
            raise
        if int(data.eventType) & int(self._nvml.nvmlEventTypeXidCriticalError) == 0:
            return None
        index = self._index_of(data.device)
        return XidEvent(index=index, uuid=self._uuids.get(index, ""), code=int(data.eventData), at=time.time())

    def _index_of(self, handle: Any) -> int:
        try:
            return int(self.call("nvmlDeviceGetIndex", handle, device="event device"))
        except NvmlError:
            return next((i for i, known in self._handles.items() if known == handle), -1)

    def close(self) -> None:
        with self._lock:
            if self._events is not None:
                self._supported("nvmlEventSetFree", self._events)
                self._events = None
            self._handles.clear()
            self.call("nvmlShutdown")


def _sysfs_numa(bus_id: str) -> int | None:
    """``/sys/bus/pci/devices/<bus id>/numa_node`` (``-1`` there means a single-socket machine: None)."""
    from pathlib import Path

    try:
        value = int(Path(f"/sys/bus/pci/devices/{bus_id}/numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def summary(devices: Sequence[GpuDevice]) -> str:
    """``"8 x NVIDIA A100-SXM4-40GB"``: what the agent logs at start."""
    counts: dict[str, int] = {}
    for device in devices:
        counts[device.product] = counts.get(device.product, 0) + 1
    return ", ".join(f"{n} x {product}" for product, n in counts.items()) or "no GPUs"


def _percent(value: Any) -> int | None:
    """A driver's per-process percentage, or None where it gave none or nonsense."""
    return int(value) if isinstance(value, int) and 0 <= value <= 100 else None
