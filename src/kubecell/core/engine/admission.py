"""Admission: what a job is charged, and whether it could ever run at all.

A job that can never run is rejected at submission with the reason, instead of waiting forever: a member
no node could hold, a gang larger than the cluster (within its topology constraint), a gang beyond its
VC's guarantee under a policy that does not borrow, or beyond its guarantee plus ``borrowLimitGpus``.

A heterogeneous gang is rejected when a member of one of its groups fits no node (the reason names the
group) or when its minimum cannot fit the empty cluster. The second test adds up necessary conditions
(each group's capacity, and all members' CPU, memory and GPUs; ``hetero.could_hold``), so it rejects
only gangs that certainly never fit; one that passes and still never fits waits, saying why.
"""

from __future__ import annotations

import math

import numpy as np

from kubecell.core.book import AllocationBook, IntArray
from kubecell.core.engine.capacity import empty_capacity
from kubecell.core.engine.containers import cell_holds, container_level
from kubecell.core.engine.hetero import could_hold
from kubecell.core.engine.job import Job, JobSpec, shape_text
from kubecell.core.engine.options import EngineOptions
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.core.placement.filters import model_mask, never_fits
from kubecell.core.tenancy.config import Tenants, VirtualCluster
from kubecell.core.topology import CellChain, CellForest


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


def charge(book: AllocationBook, job: Job) -> Job:
    """Set what each member of the job is charged: its own group's GPU units (``member_charge``)."""
    job.group_milli = tuple(member_charge(book, group.member) for group in job.spec.member_groups)
    job.member_milli = job.group_milli[0]
    return job


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
        within = f" within one {spec.topology.name.lower()}" if spec.topology else ""
        if spec.heterogeneous:
            for position, group in enumerate(spec.member_groups):
                impossible = self._never_fits(spec, spec.group_start(position))
                if impossible is not None:
                    return f"no node could ever hold a member of {group.title(position)}: {impossible}"
            gang: tuple[object, ...] = (spec.topology, spec.minimum, *(
                (g.member.shape, g.count, g.minimum) for g in spec.member_groups))
            if gang not in self._holds:
                self._holds[gang] = self.cluster_could_hold(spec)
            if not self._holds[gang]:
                return f"the gang ({spec.describe()}) is larger than the cluster could ever hold{within}"
        else:
            impossible = self._never_fits(spec, 0)
            if impossible is not None:
                return f"no node could ever hold a member: {impossible}"
            gang = (spec.member.shape, spec.topology, spec.members, spec.minimum)
            if gang not in self._holds:
                self._holds[gang] = self.cluster_could_hold(spec)
            if not self._holds[gang]:
                return f"the gang ({spec.minimum}+ members) is larger than the cluster could ever hold{within}"
        if spec.opportunistic:
            return None
        if not spec.wants_gpu:
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

    def _never_fits(self, spec: JobSpec, index: int) -> str | None:
        """Why no node could ever hold member ``index`` (verdicts kept per shape)."""
        request = spec.member_request(index)
        shape = (request.shape, spec.topology)
        if shape not in self._impossible:
            verdict = never_fits(self.book, request)
            self._impossible[shape] = None if verdict is None else verdict.reason
        return self._impossible[shape]

    def never_guaranteed(self, vc: VirtualCluster, job: Job) -> str | None:
        """Why this job can never run inside its VC's guarantee (None if it can)."""
        spec = job.spec
        need = job.min_milli
        if need > vc.guaranteed_milli:
            return f"VC {vc.name} guarantees {vc.guaranteed_gpus} GPUs; the job needs {need / 1000:g}"
        if not self.options.cells:
            return None
        level = container_level(spec)
        types = [(self.forest.chains[name], cell_level) for name, cell_level in {**vc.demand,
                                                                                **self._pinned_types(vc)}]
        if spec.heterogeneous:
            return self._hetero_never_guaranteed(vc, spec, level, types)
        member_models = spec.member.gpu_models
        for chain, cell_level in types:
            if member_models is not None and chain.model not in member_models:
                continue
            if cell_holds(chain.sizes[cell_level], cell_level, chain, spec, level):
                return None
        return (f"VC {vc.name} has no cell type that holds this job "
                f"({spec.minimum} x {spec.member.gpu_count} GPU"
                + (f" within one {spec.topology.name.lower()}" if spec.topology else "") + ")")

    @staticmethod
    def _hetero_never_guaranteed(vc: VirtualCluster, spec: JobSpec, level: TopologyLevel,
                                 types: list[tuple[CellChain, int]]) -> str | None:
        """A heterogeneous gang's GPU members at its minimum: each needs a cell type of a model it accepts
        and of its size (one cell for the whole gang when it must share a node or rack, of a model every
        one of them accepts)."""
        counts = spec.first_counts(spec.minimum)
        present = [(p, g) for p, (g, c) in enumerate(zip(spec.member_groups, counts, strict=True))
                   if c and g.member.wants_gpu]
        if level == TopologyLevel.GPU:
            for position, group in present:
                gpus = group.member.gpu_count
                if not any(group.member.allows_model(chain.model) and gpus <= min(chain.sizes[cell_level],
                                                                                  chain.node_gpus)
                           for chain, cell_level in types):
                    return (f"VC {vc.name} has no cell type that holds a member of {group.title(position)} "
                            f"({shape_text(group.member)})")
            return None
        for chain, cell_level in types:
            if all(g.member.allows_model(chain.model) for _, g in present) \
                    and cell_holds(chain.sizes[cell_level], cell_level, chain, spec, level):
                return None
        assert spec.topology is not None
        return (f"VC {vc.name} has no cell type that holds this job ({spec.describe()} within one "
                f"{spec.topology.name.lower()})")

    def _pinned_types(self, vc: VirtualCluster) -> dict[tuple[str, int], int]:
        types: dict[tuple[str, int], int] = {}
        for cell_id in vc.pinned:
            cell = self.forest.by_id[cell_id]
            types[(cell.chain.name, cell.level)] = types.get((cell.chain.name, cell.level), 0) + 1
        return types

    def _gpu_free_nodes_hold(self, spec: JobSpec) -> bool:
        if spec.heterogeneous:
            return could_hold(self.book, spec, spec.first_counts(spec.minimum), None,
                              spec.topology == TopologyLevel.NODE, self.book.gpu_count == 0)
        per_node = np.where(self.book.gpu_count == 0, empty_capacity(self.book, spec.member_request(0)), 0)
        if spec.topology == TopologyLevel.NODE and spec.members > 1:
            return int(per_node.max(initial=0)) >= spec.minimum
        return int(per_node.sum()) >= spec.minimum

    def cluster_could_hold(self, spec: JobSpec) -> bool:
        """Could the empty cluster hold the gang's minimum (inside one node, rack or zone if asked)?"""
        level = spec.topology
        if spec.heterogeneous:
            counts = spec.first_counts(spec.minimum)
            if level is None or level < TopologyLevel.NODE or level >= TopologyLevel.CLUSTER:
                return could_hold(self.book, spec, counts, None, False)
            if level == TopologyLevel.NODE:
                return could_hold(self.book, spec, counts, None, True)
            return could_hold(self.book, spec, counts, self.zone_of if level == TopologyLevel.ZONE else self.rack_of,
                              False)
        per_node = empty_capacity(self.book, spec.member_request(0))
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
