"""Capacity counts: how many members of one shape each node can take, now or when empty.

A member lowers the capacity of the node it lands on by exactly one member and changes no other node,
so for one shape these counts are exact: when they add up to a gang's minimum, member-by-member
placement succeeds. The gang PreFilter (``placement``), the explanations (``explain``), admission and
the starvation backstop all count with these two functions, so they agree on what fits where.
"""

from __future__ import annotations

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.core.placement.filters import model_mask

BIG = 1 << 40


def group_ids(book: AllocationBook, level: TopologyLevel | None) -> IntArray | None:
    """Per GPU slot, its NVLink group or NUMA node for a member confined to one (None: no such level)."""
    if level == TopologyLevel.NVLINK:
        return book.nvlink_group
    if level == TopologyLevel.NUMA:
        return book.numa_group
    return None


def member_capacity(book: AllocationBook, member: Request, allowed: BoolArray | None,
                    nodes: BoolArray | None = None) -> IntArray:
    """Members each node can take now, within ``allowed`` GPUs and ``nodes`` (None: no restriction)."""
    cap: IntArray = np.where(book.node_ok, BIG, 0).astype(np.int64)
    if nodes is not None:
        cap = np.where(nodes, cap, 0)
    if member.cpu_milli:
        cap = np.minimum(cap, book.cpu_free // member.cpu_milli)
    if member.memory_mib:
        cap = np.minimum(cap, book.mem_free // member.memory_mib)
    if not member.wants_gpu:
        return cap
    usable = book.gpu_present & book.gpu_healthy
    if allowed is not None:
        usable = usable & allowed
    if member.is_whole:
        full = book.gpu_full & usable
        groups = group_ids(book, member.topology)
        if groups is None:
            gpu_cap = full.sum(axis=1) // member.gpu_count
        else:
            gpu_cap = np.zeros(book.size, np.int64)
            for group in range(book.max_gpus):
                gpu_cap += (full & (groups == group)).sum(axis=1) // member.gpu_count
    else:
        per_gpu = np.where(usable, book.gpu_avail // max(member.gpu_milli, 1), 0)
        if member.gpu_memory_mib:
            per_gpu = np.minimum(per_gpu, book.gpu_mem_free // member.gpu_memory_mib)
        gpu_cap = per_gpu.sum(axis=1)
    cap = np.minimum(cap, gpu_cap)
    if member.gpu_models is not None:
        cap = np.where(model_mask(book, member), cap, 0)
    return cap


def empty_capacity(book: AllocationBook, member: Request) -> IntArray:
    """Members each node could take if it were empty (its capacity, whatever runs there now)."""
    cap: IntArray = np.full(book.size, BIG, np.int64)
    if member.cpu_milli:
        cap = np.minimum(cap, book.cpu_capacity // member.cpu_milli)
    if member.memory_mib:
        cap = np.minimum(cap, book.mem_capacity // member.memory_mib)
    if member.wants_gpu:
        present = book.gpu_present.sum(axis=1)
        per_gpu = 1 if member.is_whole else MILLI_PER_GPU // max(member.gpu_milli, 1)
        cap = np.minimum(cap, present // member.gpu_count * per_gpu)
        if member.gpu_models is not None:
            cap = np.where(model_mask(book, member), cap, 0)
    return cap
