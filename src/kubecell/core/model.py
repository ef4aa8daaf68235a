"""The scheduling vocabulary: GPUs, nodes, requests and allocations.

These are plain, immutable values with no I/O and no knowledge of Kubernetes or the simulator, so the
same objects describe a pod in a real cluster, a row of a production trace and a job in a test.

Units are fixed everywhere: CPU in milli-cores, host memory in MiB, GPU compute share in milli-GPU
(1000 = one whole GPU) and GPU memory in MiB of *that GPU's* real memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference.profile import SoloProfile
from kubecell.core.limits import (
    MAX_CPU_MILLI,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_MIB,
    check_amount,
    is_whole,
)

MILLI_PER_GPU = 1000
"""Compute capacity of one GPU in milli-GPU."""

UNKNOWN_GPU_MEMORY_MIB = 0
"""Sentinel for a GPU model whose memory size is not published (e.g. Alibaba's internal codes)."""


class TopologyLevel(IntEnum):
    """Levels of the cell tree above a GPU, from the tightest to the widest.

    A request may ask that all of its GPUs sit within one cell of a level (one NVLink domain, one
    NUMA node, one node, one rack); the allocator and the tenancy guarantees speak the same levels.
    """

    GPU = 0
    NVLINK = 1
    NUMA = 2
    NODE = 3
    RACK = 4
    ZONE = 5
    CLUSTER = 6

    @classmethod
    def parse(cls, text: str, *, location: str | None = None) -> TopologyLevel:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise InvalidInputError(
                f"unknown topology level {text!r}",
                location=location,
                accepted=", ".join(level.name.lower() for level in cls),
            ) from None


@dataclass(frozen=True, slots=True)
class GpuModelSpec:
    """What the scheduler needs to know about a GPU model."""

    name: str
    memory_mib: int
    nvlink: bool = False
    note: str = ""


# Memory sizes as reported by NVML (bytes // 2**20) for the models that appear in public traces.
# G1/G2/G3 are Alibaba's undisclosed internal codes in the openb trace: their memory is unknown, so
# GPU-memory requests against them cannot be enforced and the book says so (see ``enforces_memory``).
GPU_MODELS: Mapping[str, GpuModelSpec] = {
    spec.name: spec
    for spec in (
        GpuModelSpec("P4", 7611),
        GpuModelSpec("T4", 15109),
        GpuModelSpec("P100", 16280),
        GpuModelSpec("P40", 22919),
        GpuModelSpec("V100M16", 16160, nvlink=True),
        GpuModelSpec("V100M32", 32510, nvlink=True),
        GpuModelSpec("A10", 22731),
        GpuModelSpec("A30", 24576),
        GpuModelSpec("A100", 40536, nvlink=True),
        GpuModelSpec("A100-80G", 81251, nvlink=True),
        GpuModelSpec("H100", 81559, nvlink=True),
        GpuModelSpec("L4", 23034),
        GpuModelSpec("RTX2080Ti", 11019),
        GpuModelSpec("RTX3090", 24268),
        GpuModelSpec("K80", 11441),
        GpuModelSpec("M40", 11448),
        GpuModelSpec("G1", UNKNOWN_GPU_MEMORY_MIB, note="Alibaba internal code; memory undisclosed"),
        GpuModelSpec("G2", UNKNOWN_GPU_MEMORY_MIB, note="Alibaba internal code; memory undisclosed"),
        GpuModelSpec("G3", UNKNOWN_GPU_MEMORY_MIB, note="Alibaba internal code; memory undisclosed"),
    )
}


def gpu_model_spec(name: str, *, location: str | None = None, field: str | None = None) -> GpuModelSpec:
    """Look a GPU model up in the catalog, with an error that lists what is known."""
    spec = GPU_MODELS.get(name)
    if spec is None:
        raise InvalidInputError(
            f"unknown GPU model {name!r}",
            location=location,
            field=field,
            accepted=", ".join(sorted(GPU_MODELS)) + " (or give the GPU's memory explicitly)",
        )
    return spec


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU of a node. ``memory_mib == 0`` means the size is unknown (not enforced)."""

    index: int
    model: str
    memory_mib: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Node:
    """A machine: its host resources, its GPUs and where it sits in the topology.

    ``nvlink_groups`` and ``numa_groups`` partition the GPU indices; a node without that information
    gets one group holding every GPU, which is what a single PCIe switch or an unknown board implies.
    ``rack`` and ``zone`` usually come from node labels (see ``kubecell.core.topology``).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    nvlink_groups: tuple[tuple[int, ...], ...] = ()
    numa_groups: tuple[tuple[int, ...], ...] = ()
    rack: str = ""
    zone: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"node {self.name!r}"
        if not self.name:
            raise InvalidInputError("node name is empty", field="name", accepted="a non-empty name")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise InvalidInputError(
                "CPU and memory capacity must not be negative", location=where, accepted="integers >= 0"
            )
        # make_node checks these with the caller's file location; this is the backstop for nodes built
        # directly, so that nothing reaches the allocation book with an amount it cannot hold.
        check_amount(self.cpu_milli, MAX_CPU_MILLI, what="CPU capacity (milli-CPU)", field="cpu_milli", location=where)
        check_amount(self.memory_mib, MAX_MEMORY_MIB, what="host memory (MiB)", field="memory_mib", location=where)
        check_amount(len(self.gpus), MAX_GPUS_PER_NODE, what="GPU count", field="gpus", location=where)
        for gpu in self.gpus:
            check_amount(gpu.memory_mib, MAX_GPU_MEMORY_MIB, what="GPU memory (MiB)", field="gpu_memory_mib",
                         location=where)
        indices = [gpu.index for gpu in self.gpus]
        if indices != list(range(len(indices))):
            raise InvalidInputError(
                f"GPU indices {indices} are not 0..{len(indices) - 1}", location=where, field="gpus"
            )
        models = {gpu.model for gpu in self.gpus}
        if len(models) > 1:
            raise InvalidInputError(
                f"mixes GPU models {sorted(models)}",
                location=where,
                field="gpus",
                accepted="one GPU model per node (split heterogeneous machines into one node per model)",
            )
        for name, groups in (("nvlink_groups", self.nvlink_groups), ("numa_groups", self.numa_groups)):
            if groups:
                flat = sorted(i for group in groups for i in group)
                if flat != indices:
                    raise InvalidInputError(
                        f"{name} {groups} do not partition the GPU indices {indices}",
                        location=where,
                        field=name,
                    )

    @property
    def gpu_model(self) -> str:
        """The node's GPU model, or '' for a CPU-only node."""
        return self.gpus[0].model if self.gpus else ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def groups_at(self, level: TopologyLevel) -> tuple[tuple[int, ...], ...]:
        """The GPU index groups at an intra-node topology level (NVLINK, NUMA or NODE)."""
        everything = (tuple(range(self.gpu_count)),) if self.gpus else ()
        if level == TopologyLevel.NVLINK:
            return self.nvlink_groups or everything
        if level == TopologyLevel.NUMA:
            return self.numa_groups or everything
        if level == TopologyLevel.GPU:
            return tuple((i,) for i in range(self.gpu_count))
        return everything


def make_node(
    name: str,
    *,
    cpu_milli: int,
    memory_mib: int,
    gpu_count: int = 0,
    gpu_model: str = "",
    gpu_memory_mib: int | None = None,
    nvlink_groups: Sequence[Sequence[int]] = (),
    numa_groups: Sequence[Sequence[int]] = (),
    rack: str = "",
    zone: str = "",
    labels: Mapping[str, str] | None = None,
    location: str | None = None,
) -> Node:
    """Build a homogeneous node, taking the GPU memory from the model catalog unless given.

    Every amount is checked against the allocation book's limits (``kubecell.core.limits``) here, where
    the caller's ``location`` (a file line) is known, before a single GPU is built.
    """
    if gpu_count < 0:
        raise InvalidInputError(f"GPU count {gpu_count} is negative", location=location, field="gpu")
    check_amount(gpu_count, MAX_GPUS_PER_NODE, what="GPU count", field="gpu", location=location)
    check_amount(cpu_milli, MAX_CPU_MILLI, what="CPU capacity (milli-CPU)", field="cpu_milli", location=location)
    check_amount(memory_mib, MAX_MEMORY_MIB, what="host memory (MiB)", field="memory_mib", location=location)
    if gpu_memory_mib is not None:
        check_amount(gpu_memory_mib, MAX_GPU_MEMORY_MIB, what="GPU memory (MiB per GPU)", field="gpu_memory_mib",
                     location=location)
    if gpu_count and not gpu_model:
        raise InvalidInputError(
            f"node has {gpu_count} GPUs but no GPU model", location=location, field="model",
            accepted=", ".join(sorted(GPU_MODELS)),
        )
    memory = gpu_memory_mib
    if gpu_count and memory is None:
        memory = gpu_model_spec(gpu_model, location=location, field="model").memory_mib
    gpus = tuple(Gpu(i, gpu_model, memory or UNKNOWN_GPU_MEMORY_MIB) for i in range(gpu_count))
    return Node(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=gpus,
        nvlink_groups=tuple(tuple(g) for g in nvlink_groups),
        numa_groups=tuple(tuple(g) for g in numa_groups),
        rack=rack,
        zone=zone,
        labels=dict(labels or {}),
    )


@dataclass(frozen=True, slots=True)
class Request:
    """What one pod (or one member of a gang) asks for.

    Three shapes exist: CPU-only (``gpu_count == 0``); a *share* of one GPU (``gpu_count == 1`` and
    ``gpu_milli < 1000``, and/or ``gpu_memory_mib`` of that GPU's memory); or ``gpu_count`` *whole*
    GPUs (``gpu_milli == 1000``), which are exclusive. ``gpu_models`` restricts the GPU model (None
    means any); ``topology`` asks for all GPUs within one cell of that level.
    """

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    gpu_models: frozenset[str] | None = None
    topology: TopologyLevel | None = None
    profile: SoloProfile | None = None
    """What the workload uses when it runs alone (its history's solo profile), for interference-aware
    sharing (``placement.colocation``); None: unknown, judged by what it asks for. Not part of ``shape``:
    no policy score reads it."""

    def __post_init__(self) -> None:
        where = f"request {self.name!r}"
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_memory_mib < 0:
            raise InvalidInputError("resource amounts must not be negative", location=where)
        if self.gpu_count < 0:
            raise InvalidInputError("GPU count must not be negative", location=where, field="gpu_count")
        check_amount(self.cpu_milli, MAX_CPU_MILLI, what="CPU request (milli-CPU)", field="cpu_milli", location=where)
        check_amount(self.memory_mib, MAX_MEMORY_MIB, what="host memory request (MiB)", field="memory_mib",
                     location=where)
        check_amount(self.gpu_memory_mib, MAX_GPU_MEMORY_MIB, what="GPU memory request (MiB)",
                     field="gpu_memory_mib", location=where)
        check_amount(self.gpu_count, MAX_GPUS_PER_NODE, what="GPU count (one node's worth at most)",
                     field="gpu_count", location=where)
        if self.gpu_count == 0:
            if self.gpu_milli or self.gpu_memory_mib:
                raise InvalidInputError(
                    "asks for GPU share or GPU memory but for zero GPUs",
                    location=where,
                    accepted="gpu_count >= 1 when gpu_milli or gpu_memory_mib is set",
                )
            return
        if not is_whole(self.gpu_milli) or not 0 <= self.gpu_milli <= MILLI_PER_GPU:
            raise InvalidInputError(
                f"gpu_milli {self.gpu_milli} is out of range", location=where, field="gpu_milli",
                accepted="0..1000 per GPU",
            )
        if self.gpu_count > 1 and self.gpu_milli != MILLI_PER_GPU:
            raise InvalidInputError(
                f"asks for {self.gpu_count} GPUs with a share of {self.gpu_milli} milli each",
                location=where,
                field="gpu_milli",
                accepted="fractional shares for one GPU only; multi-GPU requests take whole GPUs (1000)",
            )
        if self.gpu_milli == 0 and self.gpu_memory_mib == 0:
            raise InvalidInputError(
                "asks for a GPU but neither a compute share nor GPU memory",
                location=where,
                accepted="gpu_milli in 1..1000 and/or gpu_memory_mib > 0",
            )
        if self.gpu_milli == MILLI_PER_GPU and self.gpu_memory_mib:
            raise InvalidInputError(
                "whole GPUs are exclusive, so a GPU-memory amount makes no sense with gpu_milli=1000",
                location=where,
                field="gpu_memory_mib",
            )
        if self.gpu_models is not None and not self.gpu_models:
            raise InvalidInputError("empty list of allowed GPU models", location=where, field="gpu_models")

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_count > 0

    @property
    def is_share(self) -> bool:
        """A fraction of one GPU (by compute, by memory, or both)."""
        return self.gpu_count == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def is_whole(self) -> bool:
        return self.gpu_count >= 1 and self.gpu_milli == MILLI_PER_GPU

    @property
    def total_gpu_milli(self) -> int:
        """GPU compute this request takes from the cluster, in milli-GPU."""
        return self.gpu_count * self.gpu_milli

    def allows_model(self, model: str) -> bool:
        return self.gpu_models is None or model in self.gpu_models

    @property
    def shape(self) -> RequestShape:
        """The request without its name: what placement decisions depend on."""
        return RequestShape(
            self.cpu_milli,
            self.memory_mib,
            self.gpu_count,
            self.gpu_milli,
            self.gpu_memory_mib,
            self.gpu_models,
            self.topology,
        )


@dataclass(frozen=True, slots=True)
class RequestShape:
    """A request's resource shape; equal shapes get equal placement scores, so scores are cached by it."""

    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int
    gpu_memory_mib: int
    gpu_models: frozenset[str] | None
    topology: TopologyLevel | None


@dataclass(frozen=True, slots=True)
class Allocation:
    """A request bound to a node and, for GPU requests, to specific GPUs of that node.

    ``gpu_milli`` and ``gpu_memory_mib`` are taken from *each* GPU in ``gpu_indices``. This is the
    record the Kubernetes driver persists on the pod and the node agent reads back.
    """

    request: Request
    node: str
    gpu_indices: tuple[int, ...]
    gpu_milli: int
    gpu_memory_mib: int

    @property
    def name(self) -> str:
        return self.request.name
