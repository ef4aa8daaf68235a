"""The real NVML backend over a stand-in ``pynvml`` module that behaves like NVML on a two-GPU machine
(no GPU here): discovery, NVLink peers by PCI bus id, NUMA fallback, MIG, processes, XID events, and every
NVML error turned into an error naming the call and the device."""

from __future__ import annotations

import ctypes.util
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubecell.node.nvml import GpuBackend, GpuProcess, NvmlBackend, NvmlError, normalise_bus_id

SUCCESS_CODES = {"NVML_ERROR_INVALID_ARGUMENT": 2, "NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_NOT_FOUND": 6,
                 "NVML_ERROR_TIMEOUT": 10, "NVML_ERROR_GPU_IS_LOST": 15, "NVML_ERROR_DRIVER_NOT_LOADED": 9,
                 "NVML_ERROR_FUNCTION_NOT_FOUND": 13}
MESSAGES = {2: "Invalid Argument", 3: "Not Supported", 6: "Not Found", 9: "Driver Not Loaded", 10: "Timeout",
            13: "Function Not Found", 15: "GPU is lost"}


class FakeNVMLError(Exception):
    """Like ``pynvml.NVMLError``: carries ``value``, prints NVML's message."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return MESSAGES.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class Handle:
    index: int
    mig: int | None = None


@dataclass
class FakeNvmlModule:
    """Two A100s: GPU 0 whole, GPU 1 in MIG mode (3g.20gb + 2g.10gb); NVLink 0<->1 on links 0 and 1."""

    fail: dict[tuple[str, int], int] = field(default_factory=dict)  # (call, gpu index) -> NVML error code
    events: deque[tuple[int, int]] = field(default_factory=deque)  # (gpu index, XID)
    calls: list[str] = field(default_factory=list)
    registered: list[int] = field(default_factory=list)
    shut_down: bool = False

    def module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml")
        module.__dict__.update(SUCCESS_CODES, NVMLError=FakeNVMLError, NVML_DEVICE_MIG_ENABLE=1,
                               NVML_NVLINK_MAX_LINKS=18, nvmlEventTypeXidCriticalError=8)
        for name in dir(self):
            if name.startswith("nvml"):
                module.__dict__[name] = self._wrap(name, getattr(self, name))
        return module

    def _wrap(self, name: str, function: Any) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            index = next((a.index for a in args if isinstance(a, Handle)), -1)
            code = self.fail.get((name, index))
            if code is not None:
                raise FakeNVMLError(code)
            return function(*args)
        return call

    # ------------------------------------------------------------------ NVML calls
    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:  # noqa: N802
        return Handle(index)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:  # noqa: N802
        return handle.index

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:  # noqa: N802
        return f"MIG-{handle.index}-{handle.mig}" if handle.mig is not None else f"GPU-{handle.index}"

    def nvmlDeviceGetName(self, handle: Handle) -> bytes:  # noqa: N802
        profile = {0: " MIG 3g.20gb", 1: " MIG 2g.10gb"}.get(handle.mig or 0, "") if handle.mig is not None else ""
        return f"NVIDIA A100-SXM4-40GB{profile}".encode()

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> Any:  # noqa: N802
        return types.SimpleNamespace(busId=f"00000000:{0x07 + handle.index:02X}:00.0".encode())

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> Any:  # noqa: N802
        mib = {None: 40536, 0: 19968, 1: 9856}[handle.mig]
        return types.SimpleNamespace(total=mib * 2**20)

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:  # noqa: N802
        if handle.index == 1:
            raise FakeNVMLError(3)  # older driver: not supported, the backend asks sysfs
        return 0

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:  # noqa: N802
        if link >= 3:
            raise FakeNVMLError(2)  # past the GPU's last link
        return 1 if link < 2 else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> Any:  # noqa: N802
        other = 1 - handle.index
        return types.SimpleNamespace(busId=f"0000:{0x07 + other:02x}:00.0".encode())

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:  # noqa: N802
        return [1, 1] if handle.index == 1 else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, slot: int) -> Handle:  # noqa: N802
        if slot > 1:
            raise FakeNVMLError(6)  # an empty slot
        return Handle(handle.index, slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:  # noqa: N802
        return 1 + (handle.mig or 0)

    def nvmlDeviceGetGpuInstanceById(self, handle: Handle, gi: int) -> Any:  # noqa: N802
        return ("gi", gi)

    def nvmlGpuInstanceGetInfo(self, instance: Any) -> Any:  # noqa: N802
        start, size = {1: (0, 4), 2: (4, 2)}[instance[1]]
        return types.SimpleNamespace(placement=types.SimpleNamespace(start=start, size=size))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:  # noqa: N802
        return [types.SimpleNamespace(pid=100, usedGpuMemory=512 * 2**20),
                types.SimpleNamespace(pid=101, usedGpuMemory=None)] if handle.index == 0 else []

    def nvmlDeviceGetProcessUtilization(self, handle: Handle, since: int) -> list[Any]:  # noqa: N802
        return [types.SimpleNamespace(pid=100, smUtil=42, memUtil=17)]

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Handle, kinds: int, events: str) -> None:  # noqa: N802
        self.registered.append(handle.index)

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> Any:  # noqa: N802
        if not self.events:
            raise FakeNVMLError(10)
        index, xid = self.events.popleft()
        return types.SimpleNamespace(device=Handle(index), eventType=8, eventData=xid)

    def nvmlEventSetFree(self, events: str) -> None:  # noqa: N802
        pass


def backend(fake: FakeNvmlModule) -> NvmlBackend:
    return NvmlBackend(module=fake.module(), numa_from_sysfs=lambda bus_id: 1 if bus_id == "0000:08:00.0" else None)


def test_discovery_reads_identity_topology_and_mig() -> None:
    fake = FakeNvmlModule()
    nvml = backend(fake)
    assert isinstance(nvml, GpuBackend)
    first, second = nvml.devices()
    assert (first.index, first.uuid, first.product, first.memory_mib) == (0, "GPU-0", "NVIDIA A100-SXM4-40GB", 40536)
    assert (first.nvlink_peers, second.nvlink_peers) == ((1,), (0,)), "remote PCI bus ids mapped to indices"
    assert (first.numa_node, second.numa_node) == (0, 1), "GPU 1's NUMA node from sysfs"
    assert first.pci_bus_id == "0000:07:00.0"
    assert first.mig_mode == "disabled"
    assert first.mig_instances == ()
    assert second.mig_mode == "enabled"
    assert [(m.uuid, m.profile, m.memory_mib, m.start, m.size) for m in second.mig_instances] == [
        ("MIG-1-0", "3g.20gb", 19968, 0, 4), ("MIG-1-1", "2g.10gb", 9856, 4, 2)]
    nvml.close()
    assert fake.shut_down


def test_processes_carry_memory_and_utilisation() -> None:
    nvml = backend(FakeNvmlModule())
    assert nvml.processes(0) == [GpuProcess(100, 512, 42, 17), GpuProcess(101, 0, None, None)]
    assert nvml.processes(1) == []


def test_xid_events_are_read_with_a_timeout() -> None:
    fake = FakeNvmlModule()
    nvml = backend(fake)
    assert nvml.wait_xid(0.01) is None, "NVML's timeout is no event, not an error"
    assert fake.registered == [0, 1]
    fake.events.append((1, 79))
    event = nvml.wait_xid(0.01)
    assert event is not None
    assert (event.index, event.uuid, event.code) == (1, "GPU-1", 79)


@pytest.mark.parametrize(("call", "gpu", "code", "expected"), [
    ("nvmlDeviceGetUUID", 1, 15, "nvmlDeviceGetUUID(gpu 1): GPU is lost (NVML error 15)"),
    ("nvmlDeviceGetMemoryInfo", 0, 15, "nvmlDeviceGetMemoryInfo(gpu 0 GPU-0): GPU is lost"),
    ("nvmlDeviceGetNvLinkRemotePciInfo", 0, 15, "nvmlDeviceGetNvLinkRemotePciInfo(gpu 0 GPU-0 link 0): GPU is lost"),
    ("nvmlDeviceGetGpuInstanceId", 1, 15, "nvmlDeviceGetGpuInstanceId(gpu 1 GPU-1 MIG 0): GPU is lost"),
])
def test_nvml_errors_name_the_call_and_the_device(call: str, gpu: int, code: int, expected: str) -> None:
    nvml = backend(FakeNvmlModule(fail={(call, gpu): code}))
    with pytest.raises(NvmlError) as caught:
        nvml.devices()
    assert expected in str(caught.value)
    assert caught.value.call == call
    assert caught.value.code == code


def test_unsupported_queries_degrade_instead_of_failing() -> None:
    fake = FakeNvmlModule(fail={("nvmlDeviceGetNvLinkState", 0): 3, ("nvmlDeviceGetMigMode", 0): 3,
                                ("nvmlDeviceGetProcessUtilization", 0): 3})
    first = backend(fake).devices()[0]
    assert first.nvlink_peers == ()
    assert first.mig_mode == "disabled"
    assert backend(fake).processes(0)[0].utilization_percent is None


def test_a_failed_init_and_a_failed_event_wait_are_clear_errors() -> None:
    fake = FakeNvmlModule(fail={("nvmlInit", -1): 9})
    with pytest.raises(NvmlError, match=r"^nvmlInit: Driver Not Loaded"):
        backend(fake)
    broken = FakeNvmlModule(fail={("nvmlDeviceRegisterEvents", 1): 15})
    with pytest.raises(NvmlError, match=r"nvmlDeviceRegisterEvents\(gpu 1\): GPU is lost"):
        backend(broken).wait_xid(0.01)


def test_a_gpu_without_xid_events_is_noted_not_fatal() -> None:
    fake = FakeNvmlModule(fail={("nvmlDeviceRegisterEvents", 1): 3})
    nvml = backend(fake)
    assert nvml.wait_xid(0.01) is None
    assert nvml.unwatched == [1]


def test_a_call_this_nvidia_ml_py_lacks_is_named() -> None:
    fake = FakeNvmlModule()
    module = fake.module()
    del module.__dict__["nvmlDeviceGetMaxMigDeviceCount"]
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetMaxMigDeviceCount.*upgrade"):
        NvmlBackend(module=module, numa_from_sysfs=lambda _: None).devices()


def test_the_real_pynvml_error_class_is_translated() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install -e '.[node]')")
    module = types.ModuleType("pynvml")
    module.__dict__.update({k: v for k, v in vars(pynvml).items() if k.startswith(("NVML", "nvmlEventType"))})

    def lost(*_: Any) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    module.__dict__.update(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
                           nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=lost)
    with pytest.raises(NvmlError, match=r"nvmlDeviceGetUUID\(gpu 0\): GPU is lost \(NVML error 15\)"):
        NvmlBackend(module=module, numa_from_sysfs=lambda _: None).devices()


def test_the_backend_imports_without_a_gpu() -> None:
    """Opening the real library here fails with a clear error (no driver), never an ImportError or a crash."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install -e '.[node]')")
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("libnvidia-ml is present: a GPU machine, where opening NVML succeeds")
    with pytest.raises(NvmlError, match=r"^nvmlInit: "):
        NvmlBackend()


@pytest.mark.parametrize(("raw", "expected"), [("00000000:07:00.0", "0000:07:00.0"), ("0000:07:00.0", "0000:07:00.0"),
                                               ("07:00.0", "0000:07:00.0"), ("0000:0A:00.0", "0000:0a:00.0")])
def test_pci_bus_ids_compare_across_spellings(raw: str, expected: str) -> None:
    assert normalise_bus_id(raw) == expected
