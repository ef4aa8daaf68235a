"""MIG instances as the unit the scheduler places.

A GPU in MIG mode cannot be given whole or shared by time: CUDA sees only its MIG instances, each a fixed
slice of compute and memory isolated by the hardware. So on such a node the scheduler places *instances*:
each becomes one GPU of the core's node, named by its profile (model ``MIG-3g.20gb``, the memory of the
instance), with the parent GPU's health and NUMA node, and a pod in ``mig`` isolation takes one whole
instance exclusively. A pod picks a profile the way it picks a GPU model (``kubecell.io/gpu-models:
MIG-3g.20gb``, which implies ``kubecell.io/isolation: mig``), or takes any instance.

The core keeps one GPU model per node (its placement scores and tenancy cells are built on it), so a node
is placeable in MIG when every GPU of it is in MIG mode and all its instances share one profile: NVIDIA's
"single" strategy, and what ``nvidia-mig-parted``'s ``all-1g.5gb`` ... ``all-7g.40gb`` configurations
produce. Other layouts (some GPUs in MIG mode and some not, or several profiles on one node) are kept for
CPU work with no GPUs, and the reason is told to every GPU pod that waits (``gpu_note``), never hidden.
MIG layouts are read as the node agent reports them; kubecell does not repartition GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubecell.core.limits import MAX_GPUS_PER_NODE
from kubecell.core.model import Gpu

if TYPE_CHECKING:  # the inventory reads MIG layouts through this module
    from kubecell.kube.inventory_schema import GpuRecord

MIG_MODEL_PREFIX = "MIG-"
_PROFILE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb(\+[a-z0-9]+)*$")
"""NVIDIA's profile names: ``1g.5gb``, ``1g.5gb+me``, ``1c.3g.20gb`` (a compute instance of a 3g)."""


def mig_model(profile: str) -> str:
    """The model name a MIG instance of ``profile`` gets in the core (``MIG-3g.20gb``)."""
    return f"{MIG_MODEL_PREFIX}{profile}"


def is_mig_model(name: str) -> bool:
    """Whether ``name`` names a MIG profile as a model (``MIG-1g.5gb``), known or not on this cluster."""
    return name.startswith(MIG_MODEL_PREFIX) and bool(_PROFILE.match(name[len(MIG_MODEL_PREFIX):]))


def is_mig_profile(profile: str) -> bool:
    return bool(_PROFILE.match(profile))


@dataclass(frozen=True, slots=True)
class MigLayout:
    """A node's MIG instances read for placement: as core GPUs (with their UUIDs and groups), or why not."""

    gpus: tuple[Gpu, ...] = ()
    uuids: tuple[str, ...] = ()
    numa_groups: tuple[tuple[int, ...], ...] = ()
    nvlink_groups: tuple[tuple[int, ...], ...] = ()
    note: str = ""
    """Why the node's GPUs cannot be placed ("" when they can)."""

    def first(self, count: int) -> MigLayout:
        """The layout with only its first ``count`` instances (the lowest positions), its NUMA and per-GPU
        groups cut to them: what the scheduler keeps when the node advertises fewer instances than its
        inventory lists (``kubecell.kube.inventory``)."""
        if count >= len(self.gpus):
            return self

        def cut(groups: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
            kept = (tuple(index for index in group if index < count) for group in groups)
            return tuple(group for group in kept if group)

        return MigLayout(self.gpus[:count], self.uuids[:count], cut(self.numa_groups), cut(self.nvlink_groups),
                         self.note)


def mig_layout(records: Sequence[GpuRecord], *, agent_gives_mig: bool) -> MigLayout | None:
    """The placeable MIG instances of a node whose GPUs are ``records`` (sorted by index); None when no GPU
    is in MIG mode (the node's GPUs are placed whole or shared as usual)."""
    in_mig = [gpu for gpu in records if gpu.mig_mode == "enabled"]
    if not in_mig:
        return None
    others = [gpu.index for gpu in records if gpu.mig_mode != "enabled"]
    if others:
        return MigLayout(note=f"GPU(s) {_indices([g.index for g in in_mig])} are in MIG mode and GPU(s) "
                              f"{_indices(others)} are not: kubecell places a node's GPUs either whole or shared, "
                              "or as MIG instances (put all of them in MIG mode, or none)")
    if not agent_gives_mig:
        return MigLayout(note="its GPUs are in MIG mode but its node agent does not give mig isolation (an agent "
                              "that predates MIG, or GPU Feature Discovery alone)")
    profiles = sorted({instance.profile for gpu in in_mig for instance in gpu.mig_instances})
    if not profiles:
        return MigLayout(note="its GPUs are in MIG mode without MIG instances (create them, e.g. with "
                              "nvidia-mig-parted)")
    if len(profiles) > 1:
        return MigLayout(note=f"its MIG instances are of several profiles ({', '.join(profiles)}): kubecell places "
                              "MIG instances where a node's instances share one profile (NVIDIA's single "
                              "strategy, e.g. mig-parted's all-1g.5gb)")
    uuids_seen = [instance.uuid for gpu in in_mig for instance in gpu.mig_instances]
    if len(set(uuids_seen)) != len(uuids_seen):
        return MigLayout(note="its inventory names one MIG instance UUID twice (a record could not tell them apart)")
    if len(uuids_seen) > MAX_GPUS_PER_NODE:
        return MigLayout(note=f"its {len(uuids_seen)} MIG instances are more than the {MAX_GPUS_PER_NODE} GPUs a node "
                              "may have (choose a larger profile)")
    if not is_mig_profile(profiles[0]):
        return MigLayout(note=f"MIG profile {profiles[0]!r} is not a profile name kubecell reads (<n>g.<m>gb)")
    model = mig_model(profiles[0])
    gpus: list[Gpu] = []
    uuids: list[str] = []
    numa: dict[int, list[int]] = {}
    per_parent: list[tuple[int, ...]] = []
    for parent in in_mig:
        first = len(gpus)
        for instance in sorted(parent.mig_instances, key=lambda m: (m.start, m.uuid)):
            position = len(gpus)
            gpus.append(Gpu(position, model, instance.memory_mib, parent.healthy))
            uuids.append(instance.uuid)
            numa.setdefault(parent.numa_node if parent.numa_node is not None else -1, []).append(position)
        if len(gpus) > first:
            per_parent.append(tuple(range(first, len(gpus))))
    return MigLayout(tuple(gpus), tuple(uuids), tuple(tuple(members) for _, members in sorted(numa.items())),
                     tuple(per_parent))


def _indices(indices: Sequence[int]) -> str:
    return ", ".join(str(index) for index in indices)
