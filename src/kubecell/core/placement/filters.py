"""The Filter extension point: which nodes could hold a request right now.

One vectorized pass over the allocation book replaces kube-scheduler's per-node Filter calls: host CPU
and memory fit (NodeResourcesFit), allowed GPU model, and GPU fit (a GPU with the share and memory
free, or enough completely free GPUs, optionally inside one NVLink group or NUMA node).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubecell.core.book import AllocationBook
from kubecell.core.model import Request, TopologyLevel

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def model_mask(book: AllocationBook, request: Request) -> BoolArray:
    """Nodes whose GPU model the request accepts (all nodes when it accepts any model)."""
    if request.gpu_models is None:
        return np.ones(book.size, np.bool_)
    allowed = np.array([name in request.gpu_models for name in book.model_names], np.bool_)
    mask: BoolArray = allowed[book.model_id]
    return mask


def whole_gpus_in_one_group(book: AllocationBook, rows: IntArray, level: TopologyLevel,
                            full: BoolArray | None = None) -> IntArray:
    """For each node in ``rows``: the most completely free GPUs inside one cell of ``level``
    (``full``: the free GPUs of those rows to count, when only some of them may be used)."""
    full = book.gpu_full[rows] if full is None else full
    if level >= TopologyLevel.NODE:
        counts: IntArray = full.sum(axis=1)
        return counts
    groups = book.nvlink_group[rows] if level == TopologyLevel.NVLINK else book.numa_group[rows]
    if level == TopologyLevel.GPU:
        single: IntArray = np.minimum(full.sum(axis=1), 1)
        return single
    best = np.zeros(len(rows), np.int64)
    for group in range(book.max_gpus):
        best = np.maximum(best, (full & (groups == group)).sum(axis=1))
    return best


def feasible_mask(book: AllocationBook, request: Request, allowed: BoolArray | None = None,
                  nodes: BoolArray | None = None) -> BoolArray:
    """Nodes where ``request`` fits now, as a boolean mask over the book's nodes.

    ``allowed`` (nodes x GPU slots) limits the GPUs the request may take, which is how tenancy speaks
    to placement: a virtual cluster's cells, capacity nobody has bound, everything but a reservation.
    ``nodes`` limits the nodes (a rack, or the nodes a GPU-less job may use).
    """
    mask: BoolArray = (book.cpu_free >= request.cpu_milli) & (book.mem_free >= request.memory_mib) & book.node_ok
    if nodes is not None:
        mask &= nodes
    if not request.wants_gpu:
        return mask
    mask &= book.gpu_count >= request.gpu_count
    if request.gpu_models is not None:
        mask &= model_mask(book, request)
    if request.is_whole:
        if allowed is None and (request.topology is None or request.topology >= TopologyLevel.NODE):
            mask &= book.full_count >= request.gpu_count
            return mask
        rows = np.flatnonzero(mask & (book.full_count >= request.gpu_count))
        full = book.gpu_full[rows] if allowed is None else book.gpu_full[rows] & allowed[rows]
        level = request.topology if request.topology is not None else TopologyLevel.NODE
        ok = whole_gpus_in_one_group(book, rows, level, full) >= request.gpu_count
        mask[:] = False
        mask[rows[ok]] = True
        return mask
    needed = max(request.gpu_milli, 1)
    if request.gpu_memory_mib == 0 and allowed is None:
        mask &= book.max_avail >= needed
        return mask
    rows = np.flatnonzero(mask & (book.max_avail >= needed))
    fits = (book.gpu_avail[rows] >= needed) & (book.gpu_mem_free[rows] >= request.gpu_memory_mib)
    if allowed is not None:
        fits &= allowed[rows]
    mask[:] = False
    mask[rows[fits.any(axis=1)]] = True
    return mask


@dataclass(frozen=True, slots=True)
class Impossible:
    """Why a request can never be placed on a cluster: the request field at fault and a reason."""

    field: str
    reason: str


def never_fits(book: AllocationBook, request: Request) -> Impossible | None:
    """Why no node of this cluster could hold the request even when empty, or None if some could.

    Used to reject impossible requests up front with a specific reason instead of letting them wait.
    """
    cap_cpu = book.cpu_capacity >= request.cpu_milli
    cap_mem = book.mem_capacity >= request.memory_mib
    if not cap_cpu.any():
        largest = int(book.cpu_capacity.max(initial=0))
        return Impossible("cpu_milli", f"asks for {request.cpu_milli}m CPU; the largest node has {largest}m")
    if not cap_mem.any():
        largest = int(book.mem_capacity.max(initial=0))
        return Impossible("memory_mib", f"asks for {request.memory_mib} MiB memory; the largest node has {largest} MiB")
    if not (cap_cpu & cap_mem).any():
        return Impossible("cpu_milli", "no node has both the CPU and the memory it asks for")
    if not request.wants_gpu:
        return None
    models = model_mask(book, request) & (book.gpu_count > 0)
    scope = f" of model {'|'.join(sorted(request.gpu_models))}" if request.gpu_models else ""
    if not models.any():
        present = sorted({m for m in book.model_names if m})
        allowed = sorted(request.gpu_models or [])
        return Impossible("gpu_models", f"allows GPU models {allowed}; the cluster has {present}")
    sized = models & (book.gpu_count >= request.gpu_count)
    if not sized.any():
        most = int(book.gpu_count[models].max(initial=0))
        return Impossible(
            "gpu_count", f"asks for {request.gpu_count} GPUs{scope} on one node; such nodes have at most {most}"
        )
    hosts = f"nodes with {request.gpu_count}+ GPUs{scope}"
    if not (sized & cap_cpu).any():
        most = int(book.cpu_capacity[sized].max(initial=0))
        return Impossible("cpu_milli", f"asks for {request.cpu_milli}m CPU; {hosts} have at most {most}m")
    if not (sized & cap_mem).any():
        most = int(book.mem_capacity[sized].max(initial=0))
        return Impossible("memory_mib", f"asks for {request.memory_mib} MiB memory; {hosts} have at most {most} MiB")
    candidates = sized & cap_cpu & cap_mem
    if not candidates.any():
        return Impossible("cpu_milli", f"none of the {hosts} has both {request.cpu_milli}m CPU and "
                                       f"{request.memory_mib} MiB memory")
    if request.is_whole and request.topology is not None and request.topology < TopologyLevel.NODE:
        rows = np.flatnonzero(candidates)
        empty = np.zeros(len(rows), np.int64)
        groups = book.nvlink_group[rows] if request.topology == TopologyLevel.NVLINK else book.numa_group[rows]
        for group in range(book.max_gpus):
            empty = np.maximum(empty, ((groups == group) & book.gpu_present[rows]).sum(axis=1))
        if request.topology == TopologyLevel.GPU:
            empty = np.minimum(empty, 1)  # a GPU cell holds one GPU (as in ``whole_gpus_in_one_group``)
        if not (empty >= request.gpu_count).any():
            return Impossible(
                "topology",
                f"asks for {request.gpu_count} GPUs within one {request.topology.name} cell; none is that large",
            )
    if request.gpu_memory_mib:
        mem_ok = (book.gpu_mem_capacity >= request.gpu_memory_mib) & book.gpu_present
        if not (mem_ok.any(axis=1) & candidates).any():
            return Impossible(
                "gpu_memory_mib",
                f"asks for {request.gpu_memory_mib} MiB of GPU memory; no allowed GPU has that much",
            )
    return None
