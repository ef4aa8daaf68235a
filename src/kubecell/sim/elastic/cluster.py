"""The clusters of the elastic experiment, as the ``ClusterNode`` lists every elastic policy sees.

Sia's Table 3 is measured on one 64-GPU heterogeneous cluster (``simulator_config.py`` of the Sia artifact:
6 AWS g4dn.12xlarge nodes of 4 T4, 3 nodes of 8 RTX 2080Ti, 2 DGX-A100 nodes of 8 A100 40 GB). The GPU types
are named after the GPU (``t4``, ``rtx2080ti``, ``a100``) so a report reads without a glossary; each type
says which profile files describe it (``placements-<profile>.csv``: ``aws``, ``rtx``, ``dgx-ext``) and which
rows of the 1-GPU seed profiles (``seed-1gpu/<app>.csv``: ``t4``, ``rtx``, ``dgx``) are its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kubecell.core.elastic.types import ClusterNode
from kubecell.core.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class GpuKind:
    """One GPU type of a simulated cluster and where its measurements are."""

    gpu_type: str
    """The name policies and reports use (``ClusterNode.gpu_type``)."""
    profile: str
    """Suffix of its ``placements-`` and ``scalability-`` files."""
    seed: str
    """Its ``gpu_type`` in the 1-GPU seed profiles."""
    gpus_per_node: int
    description: str


T4 = GpuKind("t4", "aws", "t4", 4, "NVIDIA T4 16 GB (AWS g4dn.12xlarge, 4 per node)")
RTX2080TI = GpuKind("rtx2080ti", "rtx", "rtx", 8, "NVIDIA RTX 2080Ti 11 GB (8 per node)")
A100 = GpuKind("a100", "dgx-ext", "dgx", 8, "NVIDIA A100 40 GB (DGX-A100, 8 per node, NVLink)")

GPU_KINDS: Mapping[str, GpuKind] = {kind.gpu_type: kind for kind in (T4, RTX2080TI, A100)}


def gpu_kind(gpu_type: str) -> GpuKind:
    """The kind of a GPU type name, or a clear error naming the known ones."""
    try:
        return GPU_KINDS[gpu_type]
    except KeyError:
        raise InvalidInputError(f"unknown GPU type {gpu_type!r}", field="gpu_type",
                                accepted=", ".join(GPU_KINDS)) from None


def nodes_of(kind: GpuKind, count: int) -> list[ClusterNode]:
    """``count`` nodes of one kind, named ``<gpu_type>-<index>`` (``t4-0``, ``a100-1``)."""
    return [ClusterNode(f"{kind.gpu_type}-{index}", kind.gpu_type, kind.gpus_per_node) for index in range(count)]


def sia64() -> tuple[ClusterNode, ...]:
    """Sia's default cluster (Table 3): 6 x 4 T4, 3 x 8 RTX 2080Ti, 2 x 8 A100 = 64 GPUs."""
    return (*nodes_of(T4, 6), *nodes_of(RTX2080TI, 3), *nodes_of(A100, 2))


CLUSTERS: Mapping[str, Callable[[], tuple[ClusterNode, ...]]] = {"sia64": sia64}


def cluster_by_name(name: str) -> tuple[ClusterNode, ...]:
    """A named cluster, or a clear error naming the known ones."""
    try:
        return CLUSTERS[name]()
    except KeyError:
        raise InvalidInputError(f"unknown cluster {name!r}", field="cluster", accepted=", ".join(CLUSTERS)) from None


def kinds_of(nodes: Sequence[ClusterNode]) -> tuple[GpuKind, ...]:
    """The GPU kinds present in ``nodes``, in first-appearance order. Every node's type must be known, and no
    node may have more GPUs than the profiled machines (a placement of 6 replicas on one T4 node was never
    measured); fewer is fine (a part of such a machine)."""
    seen: dict[str, GpuKind] = {}
    for node in nodes:
        kind = gpu_kind(node.gpu_type)
        if not 1 <= node.gpus <= kind.gpus_per_node:
            raise InvalidInputError(f"node {node.name} has {node.gpus} GPUs; the {kind.gpu_type} profiles were "
                                    f"measured on nodes of {kind.gpus_per_node}", field="gpus",
                                    accepted=f"1..{kind.gpus_per_node}")
        seen.setdefault(kind.gpu_type, kind)
    return tuple(seen.values())
