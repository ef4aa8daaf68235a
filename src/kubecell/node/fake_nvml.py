"""A :class:`~kubecell.node.nvml.GpuBackend` described in YAML: GPUs for tests and machines without any.

The node agent, the device plugin and their tests run unchanged on a laptop or in CI by reading GPUs from
a file instead of NVML. A description says what NVML would report and what will go wrong::

    name: dgx-a100-0                 # seeds the GPU UUIDs (stable across runs)
    gpus:
      - {product: NVIDIA A100-SXM4-40GB, count: 8}   # memoryMiB defaults to the catalog's
    nvlink: [[0, 1, 2, 3], [4, 5, 6, 7]]             # NVLink islands: every GPU of one is a peer of the rest
    numa: [[0, 1, 2, 3], [4, 5, 6, 7]]               # NUMA node i holds the GPUs of the i-th list
    mig:
      - gpu: 0
        instances: [{profile: 3g.20gb}, {profile: 2g.10gb}, {profile: 1g.5gb, start: 6}]
    processes:
      - {gpu: 1, pid: 4242, memoryMiB: 2048, utilization: 35}
    xids:
      - {gpu: 3, code: 79, at: 5.0}                  # seconds after the backend opened

XIDs can also be raised while running (:meth:`FakeNvml.inject_xid`), which is how tests make a GPU fail.
Examples ship in ``kubecell/node/examples`` (:func:`example_path`).
"""

from __future__ import annotations

import re
import threading
import time
import uuid as uuid_lib
from collections import deque
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import GPU_MODELS, UNKNOWN_GPU_MEMORY_MIB
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.kube.gfd import catalog_model
from kubecell.node.nvml import GpuDevice, GpuProcess, MigInstance
from kubecell.node.xid import XidEvent

MIG_SLICES = 8
"""Memory slices of a MIG-capable GPU (A100, A30 use fewer compute slices but 8 placement positions)."""

MIG_SIZE_OF_COMPUTE = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
"""A profile's compute slices (the ``3`` of ``3g.20gb``) to its placement size in memory slices (A100)."""

_PROFILE = re.compile(r"^(?P<compute>[1-7])g\.(?P<gb>\d+)gb(\+me)?$")
_STRICT = ConfigDict(extra="forbid", populate_by_name=True)
Index = Annotated[int, Field(ge=0, le=255)]


class GpuGroupSpec(BaseModel):
    model_config = _STRICT
    product: str = Field(min_length=1)
    count: int = Field(default=1, ge=1, le=64)
    memory_mib: int | None = Field(default=None, ge=1, alias="memoryMiB")


class MigInstanceSpec(BaseModel):
    model_config = _STRICT
    profile: str
    start: int | None = Field(default=None, ge=0, lt=MIG_SLICES)
    size: int | None = Field(default=None, ge=1, le=MIG_SLICES)
    memory_mib: int | None = Field(default=None, ge=1, alias="memoryMiB")

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        if not _PROFILE.match(value):
            raise ValueError("not a MIG profile name (<compute slices>g.<GB>gb)")
        return value


class MigSpec(BaseModel):
    model_config = _STRICT
    gpu: Index
    instances: list[MigInstanceSpec] = Field(default_factory=list)


class ProcessSpec(BaseModel):
    model_config = _STRICT
    gpu: Index
    pid: int = Field(ge=1)
    memory_mib: int = Field(ge=0, alias="memoryMiB")
    utilization: int | None = Field(default=None, ge=0, le=100)


class XidSpec(BaseModel):
    model_config = _STRICT
    gpu: Index
    code: int = Field(ge=1, le=999)
    at: float = Field(default=0.0, ge=0.0)


class FakeNodeSpec(BaseModel):
    """The whole description; cross-field checks (indices, overlaps) are in :func:`_check`."""

    model_config = _STRICT
    name: str = "fake-node"
    gpus: list[GpuGroupSpec] = Field(min_length=1)
    uuids: list[str] | None = None
    nvlink: list[list[Index]] = Field(default_factory=list)
    numa: list[list[Index]] = Field(default_factory=list)
    mig: list[MigSpec] = Field(default_factory=list)
    processes: list[ProcessSpec] = Field(default_factory=list)
    xids: list[XidSpec] = Field(default_factory=list)


ACCEPTED = {
    "gpus": "a non-empty list of {product, count, memoryMiB}",
    "gpus.*.product": "an NVML product name such as 'NVIDIA A100-SXM4-40GB'",
    "mig.*.instances.*.profile": "a MIG profile such as 1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb",
    "nvlink": "a list of NVLink islands, each a list of GPU indices",
    "numa": "a list of NUMA nodes, each a list of GPU indices",
    "processes.*.utilization": "a percentage 0..100",
}
KEYS = "name, gpus, uuids, nvlink, numa, mig, processes, xids"


def _stable_uuid(prefix: str, *parts: object) -> str:
    return f"{prefix}-{uuid_lib.uuid5(uuid_lib.NAMESPACE_URL, '/'.join(str(p) for p in ('kubecell', *parts)))}"


def _memory_of(group: GpuGroupSpec, doc: YamlDocument, at: int) -> int:
    if group.memory_mib is not None:
        return group.memory_mib
    spec = GPU_MODELS.get(catalog_model(group.product))
    if spec is None or spec.memory_mib == UNKNOWN_GPU_MEMORY_MIB:
        raise InvalidInputError(f"no catalog memory size for product {group.product!r}",
                                location=doc.where(("gpus", at, "product")),
                                accepted="memoryMiB: the GPU's memory in MiB, or a product of the catalog ("
                                         + ", ".join(sorted(GPU_MODELS)) + ")")
    return spec.memory_mib


def _partition(groups: Sequence[Sequence[int]], count: int, doc: YamlDocument, key: str) -> dict[int, int]:
    """GPU index -> group number; every index in range and in at most one group."""
    owner: dict[int, int] = {}
    for number, group in enumerate(groups):
        for position, index in enumerate(group):
            where = doc.where((key, number, position))
            if index >= count:
                raise InvalidInputError(f"GPU index {index} does not exist", location=where,
                                        accepted=f"indices 0..{count - 1}")
            if index in owner:
                raise InvalidInputError(f"GPU {index} is already in {key} group {owner[index]}", location=where,
                                        accepted=f"each GPU in at most one {key} group")
            owner[index] = number
    return owner


def _mig_instances(spec: MigSpec, at: int, parent: str, doc: YamlDocument) -> tuple[MigInstance, ...]:
    """Placements filled in (first aligned free start) and checked: inside the GPU, no two overlapping."""
    used: list[tuple[int, int, int]] = []  # (start, end, position in the list)
    found = []
    for position, item in enumerate(spec.instances):
        where = doc.where(("mig", at, "instances", position))
        match = _PROFILE.match(item.profile)
        assert match is not None  # the pattern was validated
        size = item.size or MIG_SIZE_OF_COMPUTE.get(int(match["compute"]))
        if size is None:
            raise InvalidInputError(f"profile {item.profile}: no placement size for {match['compute']} compute "
                                    f"slices", location=where, accepted="size: the placement size in slices")
        start = item.start
        if start is None:
            start = next((s for s in range(0, MIG_SLICES - size + 1, size)
                          if all(s + size <= a or s >= b for a, b, _ in used)), None)
            if start is None:
                raise InvalidInputError(f"no free placement of size {size} left for {item.profile}", location=where,
                                        accepted=f"instances whose placements fit {MIG_SLICES} slices")
        if start + size > MIG_SLICES:
            raise InvalidInputError(f"placement {start}+{size} ends past slice {MIG_SLICES}", location=where,
                                    accepted=f"start + size <= {MIG_SLICES}")
        clash = next((p for a, b, p in used if start < b and a < start + size), None)
        if clash is not None:
            raise InvalidInputError(f"placement {start}+{size} overlaps instance {clash}", location=where,
                                    accepted="instances on disjoint slices")
        used.append((start, start + size, position))
        memory = item.memory_mib or int(match["gb"]) * 1024
        found.append(MigInstance(uuid=_stable_uuid("MIG", parent, position, item.profile), profile=item.profile,
                                 memory_mib=memory, start=start, size=size, gpu_instance_id=position + 1))
    return tuple(sorted(found, key=lambda m: m.start))


def build_devices(spec: FakeNodeSpec, doc: YamlDocument) -> list[GpuDevice]:
    """The GPUs a description declares, checked across fields, with errors naming file, line and key."""
    products = [(group.product, _memory_of(group, doc, at)) for at, group in enumerate(spec.gpus)
                for _ in range(group.count)]
    count = len(products)
    if spec.uuids is not None and len(spec.uuids) != count:
        raise InvalidInputError(f"{len(spec.uuids)} UUIDs for {count} GPUs", location=doc.where(("uuids",)),
                                accepted=f"exactly {count} UUIDs, or none (derived from name)")
    uuids = spec.uuids or [_stable_uuid("GPU", spec.name, index) for index in range(count)]
    if len(set(uuids)) != count:
        raise InvalidInputError("UUIDs repeat", location=doc.where(("uuids",)), accepted="distinct UUIDs")
    island = _partition(spec.nvlink, count, doc, "nvlink")
    numa = _partition(spec.numa, count, doc, "numa")
    mig: dict[int, tuple[MigInstance, ...]] = {}
    for at, item in enumerate(spec.mig):
        if item.gpu >= count:
            raise InvalidInputError(f"GPU index {item.gpu} does not exist", location=doc.where(("mig", at, "gpu")),
                                    accepted=f"indices 0..{count - 1}")
        if item.gpu in mig:
            raise InvalidInputError(f"GPU {item.gpu} has two MIG entries", location=doc.where(("mig", at, "gpu")),
                                    accepted="one entry per GPU")
        mig[item.gpu] = _mig_instances(item, at, uuids[item.gpu], doc)
    targets = [("processes", at, p.gpu) for at, p in enumerate(spec.processes)]
    targets += [("xids", at, x.gpu) for at, x in enumerate(spec.xids)]
    for key, at, gpu in targets:
        if gpu >= count:
            raise InvalidInputError(f"GPU index {gpu} does not exist", location=doc.where((key, at, "gpu")),
                                    accepted=f"indices 0..{count - 1}")
    devices = []
    for index, (product, memory) in enumerate(products):
        peers = tuple(p for p in spec.nvlink[island[index]] if p != index) if index in island else ()
        devices.append(GpuDevice(index=index, uuid=uuids[index], product=product, memory_mib=memory,
                                 numa_node=numa.get(index), nvlink_peers=tuple(sorted(peers)),
                                 mig_mode="enabled" if index in mig else "disabled",
                                 mig_instances=mig.get(index, ()),
                                 pci_bus_id=f"0000:{0x10 + index:02x}:00.0"))
    return devices


class FakeNvml:
    """GPUs from a description; XIDs from the description's schedule and from :meth:`inject_xid`.

    ``clock`` (seconds, monotonic) is injectable so tests can step time instead of sleeping."""

    def __init__(self, spec: FakeNodeSpec, doc: YamlDocument | None = None, *,
                 clock: Any = time.monotonic) -> None:
        self.spec = spec
        self.doc = doc or YamlDocument("<fake-nvml>", "{}")
        self._devices = build_devices(spec, self.doc)
        self._clock = clock
        self._opened = clock()
        self._processes: dict[int, list[GpuProcess]] = {}
        for item in spec.processes:
            self._processes.setdefault(item.gpu, []).append(GpuProcess(item.pid, item.memory_mib, item.utilization))
        self._scheduled = sorted((x.at, x.gpu, x.code) for x in spec.xids)
        self._pending: deque[XidEvent] = deque()
        self._changed = threading.Condition()
        self.closed = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_text(cls, text: str, source: str = "<fake-nvml>", **options: Any) -> FakeNvml:
        doc = YamlDocument(source, text)
        return cls(parse_spec(doc), doc, **options)

    @classmethod
    def from_file(cls, path: str | Path, **options: Any) -> FakeNvml:
        doc = YamlDocument.read(path)
        return cls(parse_spec(doc), doc, **options)

    # ------------------------------------------------------------------ GpuBackend
    def devices(self) -> list[GpuDevice]:
        self._check_open()
        return list(self._devices)

    def processes(self, index: int) -> list[GpuProcess]:
        self._check_open()
        self._device(index)
        return list(self._processes.get(index, ()))

    def wait_xid(self, timeout: float) -> XidEvent | None:
        """The next injected or due scheduled XID; waits at most ``timeout`` seconds (in real time)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._changed:
            while True:
                self._check_open()
                self._release_due()
                if self._pending:
                    return self._pending.popleft()
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if self._scheduled:
                    left = min(left, max(0.01, self._scheduled[0][0] - (self._clock() - self._opened)))
                self._changed.wait(left)

    def close(self) -> None:
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    # ------------------------------------------------------------------ test controls
    def inject_xid(self, index: int, code: int) -> XidEvent:
        """Raise XID ``code`` on GPU ``index`` now; a waiter in :meth:`wait_xid` gets it at once."""
        device = self._device(index)
        event = XidEvent(index=index, uuid=device.uuid, code=code, at=time.time())
        with self._changed:
            self._pending.append(event)
            self._changed.notify_all()
        return event

    def set_processes(self, index: int, processes: Sequence[GpuProcess]) -> None:
        """Replace the processes running on GPU ``index`` (overuse detection tests)."""
        self._device(index)
        self._processes[index] = list(processes)

    # ------------------------------------------------------------------ internals
    def _release_due(self) -> None:
        elapsed = self._clock() - self._opened
        while self._scheduled and self._scheduled[0][0] <= elapsed:
            _, index, code = self._scheduled.pop(0)
            self._pending.append(XidEvent(index=index, uuid=self._devices[index].uuid, code=code, at=time.time()))

    def _device(self, index: int) -> GpuDevice:
        if not 0 <= index < len(self._devices):
            raise InvalidInputError(f"GPU index {index} does not exist on fake node {self.spec.name!r}",
                                    accepted=f"indices 0..{len(self._devices) - 1}")
        return self._devices[index]

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidInputError(f"fake NVML of {self.spec.name!r} is closed")


def parse_spec(doc: YamlDocument) -> FakeNodeSpec:
    """Validate a description; the first problem is told with file, line, key path and what is accepted."""
    if not isinstance(doc.data, dict):
        raise InvalidInputError("expected a mapping with at least 'gpus'", location=doc.where(), accepted=KEYS)
    try:
        return FakeNodeSpec.model_validate(doc.data)
    except ValidationError as error:
        raise doc.invalid(error, accepted=ACCEPTED, keys=_keys) from None


def _keys(parts: Sequence[str | int]) -> str:
    names = {(): KEYS, ("gpus",): "product, count, memoryMiB", ("mig",): "gpu, instances",
             ("mig", "instances"): "profile, start, size, memoryMiB",
             ("processes",): "gpu, pid, memoryMiB, utilization", ("xids",): "gpu, code, at"}
    return names.get(tuple(p for p in parts if isinstance(p, str)), KEYS)


def example_path(name: str) -> Path:
    """A bundled example description (``a100-nvlink``, ``mixed-t4-v100``, ``a100-mig``)."""
    path = Path(str(resources.files("kubecell.node") / "examples" / f"{name}.yaml"))
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise InvalidInputError(f"no fake GPU example {name!r}", accepted=", ".join(known))
    return path
