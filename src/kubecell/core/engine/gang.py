"""Gang placement: all members of a job, or at least its minimum, in one transaction.

Members of a job are identical, so instead of placing them one by one the planner computes, for every
node at once, how many members the node can take inside the allowed GPUs (free CPU, memory, whole GPUs
or per-GPU shares), then picks nodes by the job's topology constraint:

* none: tightest nodes first (bin-packing keeps whole nodes free for large jobs);
* one node: the tightest node that takes every member;
* one rack (or zone): the domain with the least spare capacity that still takes the gang (bin-pack
  across domains), filled from its roomiest nodes (concentrate inside the domain);
* one NVLink group or NUMA node (single-member jobs): the member's GPUs inside the tightest such group.

A plan is pure (reads the book only); ``commit`` allocates it and rolls everything back if any member
fails, so a gang never ends up half placed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import AllocationError
from kubecell.core.model import Allocation, Request, TopologyLevel
from kubecell.core.placement.filters import model_mask

BIG = 1 << 40


@dataclass(frozen=True, slots=True)
class GangPlan:
    """How many members go on which node (node index -> count), in placement order."""

    nodes: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return sum(count for _, count in self.nodes)


def _group_ids(book: AllocationBook, level: TopologyLevel | None) -> IntArray | None:
    if level == TopologyLevel.NVLINK:
        return book.nvlink_group
    if level == TopologyLevel.NUMA:
        return book.numa_group
    return None


def member_capacity(book: AllocationBook, member: Request, allowed: BoolArray | None,
                    group_level: TopologyLevel | None = None) -> IntArray:
    """Members each node can take now, within ``allowed`` GPUs (None = all GPUs)."""
    cap: IntArray = np.full(book.size, BIG, np.int64)
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
        groups = _group_ids(book, group_level or member.topology)
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


def _free_gpu_milli(book: AllocationBook, allowed: BoolArray | None) -> IntArray:
    if allowed is None:
        return book.total_avail
    result: IntArray = np.where(allowed, book.gpu_avail, 0).sum(axis=1)
    return result


def plan_gang(
    book: AllocationBook,
    spec: JobSpec,
    *,
    most: int | None = None,
    least: int | None = None,
    allowed: BoolArray | None = None,
    domain_of: IntArray | None = None,
) -> GangPlan | None:
    """Where ``least``..``most`` members of ``spec`` (default: minimum..headcount) would go, or None.

    ``domain_of`` maps each node to its rack (or zone) id for RACK/ZONE constraints.
    """
    most = spec.members if most is None else most
    least = spec.minimum if least is None else least
    if most <= 0 or least > most:
        return None
    member = spec.member_request(0)
    level = spec.topology
    cap = member_capacity(book, member, allowed)
    if int(np.minimum(cap, most).sum()) < least:
        return None
    free = _free_gpu_milli(book, allowed)
    if level is not None and level >= TopologyLevel.RACK and domain_of is not None and most > 1:
        return _plan_in_domain(cap, free, domain_of, most, least, member)
    one_node = level == TopologyLevel.NODE or domain_of is None
    if level is not None and level >= TopologyLevel.NODE and most > 1 and one_node:
        fits = np.flatnonzero(cap >= least)
        if fits.size == 0:
            return None
        full = fits[cap[fits] >= most]
        if full.size:
            node = int(full[int(np.argmin(free[full]))])
            return GangPlan(((node, most),))
        node = int(fits[int(np.argmax(cap[fits]))])
        return GangPlan(((node, int(cap[node])),))
    # No constraint (or a single member): tightest nodes first.
    candidates = np.flatnonzero(cap > 0)
    tightness = free[candidates] - np.minimum(cap[candidates], most) * member.total_gpu_milli
    order = candidates[np.lexsort((candidates, tightness))]
    return _fill(order, cap, most, least)


def _fill(order: npt.NDArray[np.int64], cap: IntArray, most: int, least: int) -> GangPlan | None:
    chosen: list[tuple[int, int]] = []
    left = most
    for node in order:
        take = int(min(cap[node], left))
        if take <= 0:
            continue
        chosen.append((int(node), take))
        left -= take
        if left == 0:
            break
    placed = most - left
    return GangPlan(tuple(chosen)) if placed >= least else None


def _plan_in_domain(cap: IntArray, free: IntArray, domain_of: IntArray, most: int, least: int,
                    member: Request) -> GangPlan | None:
    valid = domain_of >= 0
    if not valid.any():
        return None
    size = int(domain_of.max()) + 1
    capped = np.where(valid, np.minimum(cap, most), 0)
    domain_cap = np.bincount(np.where(valid, domain_of, 0), weights=capped, minlength=size)
    domain_free = np.bincount(np.where(valid, domain_of, 0), weights=np.where(valid, free, 0), minlength=size)
    full = np.flatnonzero(domain_cap >= most)
    if full.size:
        spare = domain_free[full] - most * member.total_gpu_milli
        domain = int(full[np.lexsort((full, spare))[0]])
        want = most
    else:
        ok = np.flatnonzero(domain_cap >= least)
        if ok.size == 0:
            return None
        domain = int(ok[int(np.argmax(domain_cap[ok]))])
        want = int(domain_cap[domain])
    nodes = np.flatnonzero((domain_of == domain) & (cap > 0))
    order = nodes[np.lexsort((nodes, -cap[nodes]))]
    return _fill(order, cap, want, least)


def _choose_gpus(book: AllocationBook, request: Request, node: int, allowed: BoolArray | None) -> tuple[int, ...]:
    if not request.wants_gpu:
        return ()
    mask = book.gpu_present[node] & book.gpu_healthy[node]
    if allowed is not None:
        mask = mask & allowed[node]
    if request.is_whole:
        full = book.gpu_full[node] & mask
        groups = _group_ids(book, request.topology)
        if groups is not None:
            best, best_free = -1, BIG
            for group in range(book.max_gpus):
                count = int((full & (groups[node] == group)).sum())
                if request.gpu_count <= count < best_free:
                    best, best_free = group, count
            if best < 0:
                raise AllocationError(f"no group of node {node} has {request.gpu_count} free GPUs")
            full = full & (groups[node] == best)
        chosen = np.flatnonzero(full)[: request.gpu_count]
        if len(chosen) < request.gpu_count:
            raise AllocationError(f"node {node} lacks {request.gpu_count} free GPUs in the allowed set")
        return tuple(int(i) for i in chosen)
    fits = mask & (book.gpu_avail[node] >= max(request.gpu_milli, 1)) & (
        book.gpu_mem_free[node] >= request.gpu_memory_mib)
    candidates = np.flatnonzero(fits)
    if candidates.size == 0:
        raise AllocationError(f"no allowed GPU of node {node} fits {request.name}")
    return (int(candidates[int(np.argmin(book.gpu_avail[node, candidates]))]),)


def commit(book: AllocationBook, spec: JobSpec, plan: GangPlan, *, allowed: BoolArray | None = None,
           first_index: int = 0) -> list[Allocation]:
    """Allocate every member of ``plan``; on any failure release what was taken and re-raise."""
    done: list[Allocation] = []
    index = first_index
    try:
        for node, count in plan.nodes:
            for _ in range(count):
                request = spec.member_request(index)
                done.append(book.allocate(request, node, _choose_gpus(book, request, node, allowed)))
                index += 1
    except AllocationError:
        for allocation in reversed(done):
            book.release(allocation.name)
        raise
    return done
