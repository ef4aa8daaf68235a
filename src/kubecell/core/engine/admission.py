"""Admission: what a job is charged, and whether it could ever run at all.

A job that can never run is rejected at submission with the reason, instead of waiting forever: a member
no node could hold, a gang larger than the cluster (within its topology constraint), a gang beyond its
VC's guarantee under a policy that does not borrow, or beyond its guarantee plus ``borrowLimitGpus``.
"""

from __future__ import annotations

import math

import numpy as np

from kubecell.core.book import AllocationBook, IntArray
from kubecell.core.engine.containers import cell_holds, container_level
from kubecell.core.engine.job import Job, JobSpec
from kubecell.core.engine.options import EngineOptions
from kubecell.core.engine.placement import empty_capacity
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.core.placement.filters import model_mask, never_fits
from kubecell.core.tenancy.config import Tenants, VirtualCluster
from kubecell.core.topology import CellForest


def member_charge(book: AllocationBook, member: Request) -> int:
    """GPU units (milli-GPU) a member counts against guarantees and limits.

    Whole GPUs count 1000 each and a compute share its milli. A share asked for by GPU memory counts at
    least the fraction of memory it takes of the smallest GPU (of the models it accepts) that can hold
    it: a user who asks for 16 GiB of 32 GiB GPUs holds half a GPU whatever compute share she names,
    and is never charged less than she could take. Where no GPU's memory is known the memory is not
    enforced and the share counts its compute only. Any GPU request counts at least 1 milli.
    """
    if not member.wants_gpu:
        return 0
    if member.is_whole:
        return member.gpu_count * MILLI_PER_GPU
    charge = member.gpu_milli
    if member.gpu_memory_mib:
        models = model_mask(book, member)[:, None]
        sizes = book.gpu_mem_capacity[book.gpu_present & book.memory_enforced & models
                                      & (book.gpu_mem_capacity >= member.gpu_memory_mib)]
        if sizes.size:
            charge = max(charge, math.ceil(MILLI_PER_GPU * member.gpu_memory_mib / int(sizes.min())))
    return max(min(charge, MILLI_PER_GPU), 1)


class Admission:
    def __init__(self, book: AllocationBook, forest: CellForest, options: EngineOptions, rack_of: IntArray,
                 zone_of: IntArray) -> None:
        self.book = book
        self.forest = forest
        self.options = options
        self.rack_of = rack_of
        self.zone_of = zone_of
        # Capacities never change, so verdicts are kept per shape (a trace repeats a few shapes).
        self._impossible: dict[tuple[object, ...], str | None] = {}
        self._holds: dict[tuple[object, ...], bool] = {}

    def rejection(self, job: Job, tenants: Tenants) -> str | None:
        """Why the job can never run (None: it may, some day)."""
        spec = job.spec
        vc = tenants.get(spec.vc)
        if vc is None:
            return f"unknown virtual cluster {spec.vc!r} (known: {', '.join(tenants.names)})"
        shape = (spec.member.shape, spec.topology)
        if shape not in self._impossible:
            verdict = never_fits(self.book, spec.member_request(0))
            self._impossible[shape] = None if verdict is None else verdict.reason
        impossible = self._impossible[shape]
        if impossible is not None:
            return f"no node could ever hold a member: {impossible}"
        gang = (*shape, spec.members, spec.minimum)
        if gang not in self._holds:
            self._holds[gang] = self.cluster_could_hold(spec)
        if not self._holds[gang]:
            return (f"the gang ({spec.minimum}+ members) is larger than the cluster could ever hold"
                    + (f" within one {spec.topology.name.lower()}" if spec.topology else ""))
        if spec.opportunistic:
            return None
        if not spec.member.wants_gpu:
            if self.options.cells and not self.options.borrowing and not self._gpu_free_nodes_hold(spec):
                return ("a job without GPUs runs guaranteed only on nodes without GPUs, and none could hold it; "
                        "this policy does not borrow")
            return None
        if not self.options.borrowing:
            reason = self.never_guaranteed(vc, job)
            if reason is not None:
                return f"{reason}, and this policy does not borrow"
        limit = vc.borrow_limit_milli
        if self.options.borrowing and limit is not None and job.min_milli > limit:
            reason = self.never_guaranteed(vc, job)
            if reason is not None:
                return f"{reason}, and it may borrow at most {limit / 1000:g} GPUs"
        return None

    def never_guaranteed(self, vc: VirtualCluster, job: Job) -> str | None:
        """Why this job can never run inside its VC's guarantee (None if it can)."""
        spec = job.spec
        need = job.min_milli
        if need > vc.guaranteed_milli:
            return f"VC {vc.name} guarantees {vc.guaranteed_gpus} GPUs; the job needs {need / 1000:g}"
        if not self.options.cells:
            return None
        level = container_level(spec)
        member_models = spec.member.gpu_models
        for chain_name, cell_level in {**vc.demand, **self._pinned_types(vc)}:
            chain = self.forest.chains[chain_name]
            if member_models is not None and chain.model not in member_models:
                continue
            if cell_holds(chain.sizes[cell_level], cell_level, chain, spec, level):
                return None
        return (f"VC {vc.name} has no cell type that holds this job "
                f"({spec.minimum} x {spec.member.gpu_count} GPU"
                + (f" within one {spec.topology.name.lower()}" if spec.topology else "") + ")")

    def _pinned_types(self, vc: VirtualCluster) -> dict[tuple[str, int], int]:
        types: dict[tuple[str, int], int] = {}
        for cell_id in vc.pinned:
            cell = self.forest.by_id[cell_id]
            types[(cell.chain.name, cell.level)] = types.get((cell.chain.name, cell.level), 0) + 1
        return types

    def _gpu_free_nodes_hold(self, spec: JobSpec) -> bool:
        per_node = np.where(self.book.gpu_count == 0, empty_capacity(self.book, spec.member_request(0)), 0)
        if spec.topology == TopologyLevel.NODE and spec.members > 1:
            return int(per_node.max(initial=0)) >= spec.minimum
        return int(per_node.sum()) >= spec.minimum

    def cluster_could_hold(self, spec: JobSpec) -> bool:
        """Could the empty cluster hold the gang's minimum (inside one node, rack or zone if asked)?"""
        per_node = empty_capacity(self.book, spec.member_request(0))
        level = spec.topology
        if level is None or spec.members == 1 or level < TopologyLevel.NODE or level >= TopologyLevel.CLUSTER:
            return int(per_node.sum()) >= spec.minimum
        if level == TopologyLevel.NODE:
            return int(per_node.max(initial=0)) >= spec.minimum
        domain = self.zone_of if level == TopologyLevel.ZONE else self.rack_of
        valid = domain >= 0
        if not valid.any():
            return False
        sums = np.bincount(domain[valid], weights=per_node[valid])
        return float(sums.max(initial=0)) >= spec.minimum
