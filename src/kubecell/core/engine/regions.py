"""Regions: where a job may go in one class, as filters for the placement policy.

A guaranteed job goes inside its VC's cells: the cells already bound to the VC, or a free cell it may
bind (safe splits only). Candidates are the best free cells by array operations per cell type: least
occupied by borrowed work first (fewest victims), then cells whose parent is already split (HiveD's
buddy order keeps whole parents free), then by name. For machines whose racks the cell forest could not
model (some nodes unlabelled), a labelled rack counts as the parent. A gang whose members may spread
over cells also gets a region made of the VC's bound cells plus as many new cells as its headcount
needs (bounded by the cells the VC may still bind).

Borrowed and opportunistic work prefers cells nobody has bound, then takes any idle capacity. A
GPU-less job runs guaranteed only where it can keep no other VC from its guarantee: on nodes without
GPUs, which no guarantee covers, and on nodes pinned whole to its own VC. Elsewhere it borrows, so it is
reclaimed when a guarantee needs the host's CPU or memory (a binding is dynamic: a node bound to its VC
today may be another VC's tomorrow).

A heterogeneous gang is GPU work when any of its groups asks for GPUs; cells are filtered by the models
any of its GPU members accepts (every member's own models are checked again where it is placed, so the
wider filter only offers more candidates, never a wrong GPU), and a region is sized by the GPUs of the
members it must hold. Its members without GPUs go with its GPU members (``hetero``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.containers import cell_holds, container_level
from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import EngineOptions
from kubecell.core.model import TopologyLevel
from kubecell.core.tenancy.config import VirtualCluster
from kubecell.core.tenancy.state import TenancyState
from kubecell.core.topology import Cell, CellForest


def gpus_to_place(spec: JobSpec, members: int) -> int:
    """GPUs the first ``members`` members of the fill order need in cells (a share or a member without GPUs
    of a homogeneous gang counts one GPU, as it always has; a heterogeneous gang's members count their
    own GPUs, a share one)."""
    if spec.heterogeneous:
        return spec.gpus_of_first(members)
    return members * max(spec.member.gpu_count, 1)


CANDIDATE_CELLS = 32
"""Free cells considered per decision for a new binding (the best ones by occupancy and buddy order)."""


@dataclass(slots=True)
class Region:
    """Where a job may go: a GPU mask and a node mask (None: no restriction), and the cells to bind first."""

    mask: BoolArray | None
    nodes: BoolArray | None = None
    binds: tuple[Cell, ...] = ()
    label: str = "cluster"
    free_gpus: int = 0


class Regions:
    def __init__(self, book: AllocationBook, forest: CellForest, tenancy: TenancyState, options: EngineOptions,
                 rack_of: IntArray) -> None:
        self.book = book
        self.forest = forest
        self.tenancy = tenancy
        self.options = options
        has_gpu = book.gpu_count > 0
        self.gpu_nodes: BoolArray = has_gpu
        self.gpu_free_nodes: BoolArray = ~has_gpu
        # Parent-less cells whose nodes carry a rack label: the labelled rack stands in for the parent.
        self._label_rack: dict[str, IntArray] = {}
        for type_name in forest.type_names():
            cells = forest.cells_of_type(type_name)
            if cells and cells[0].parent is None and cells[0].kind == "node":
                self._label_rack[type_name] = np.array([rack_of[c.nodes[0]] for c in cells], np.int64)

    # ------------------------------------------------------------------ guaranteed
    def guaranteed(self, vc: VirtualCluster, spec: JobSpec, most: int,
                   allowed: BoolArray | None = None) -> list[Region]:
        """Candidate regions for ``most`` members of a guaranteed job, best first. ``allowed``: the nodes the
        job may use (``JobSpec.nodes``); cells without such a node are no candidates, and a cell's free GPUs
        count only on them (else the best cells could all lie elsewhere and hide the ones it can use)."""
        if not spec.wants_gpu:
            if not self.options.cells:
                return [Region(None)]
            return [Region(None, self.gpu_free_nodes | self.pinned_nodes(vc), label="nodes without GPUs or "
                           f"pinned to {vc.name}")]
        if not self.options.cells:
            return [Region(None, label="cluster")]
        models = spec.gpu_models
        bound = [c for c in self.tenancy.bound_cells(vc.name) if models is None or c.chain.model in models]
        level = container_level(spec)
        regions: list[Region] = []
        if bound:
            if level == TopologyLevel.GPU:
                regions.append(Region(self.owned_mask(vc, models), label=f"{vc.name}'s bound cells"))
            else:
                regions.extend(Region(self.mask_of([cell]), label=cell.id) for cell in bound
                               if cell_holds(cell.size, cell.level, cell.chain, spec, level)
                               and (allowed is None or allowed[list(cell.nodes)].any()))
        candidates = self._bindable_candidates(vc, spec, level, models, allowed)
        regions.extend(candidates)
        if level == TopologyLevel.GPU and most > 1 and len(candidates) > 1:
            spread = self._spread_region(vc, spec, most, candidates, allowed)
            if spread is not None:
                regions.insert(len(regions) - len(candidates), spread)
        return regions

    def _spread_region(self, vc: VirtualCluster, spec: JobSpec, most: int, candidates: list[Region],
                       allowed: BoolArray | None) -> Region | None:
        """The VC's bound cells plus new cells until ``most`` members could fit, within what the VC may still
        bind and with no cell inside another."""
        need = gpus_to_place(spec, most) - self.bound_free(vc, spec, allowed)
        left = Counter(self.tenancy.remaining(vc.name))
        chosen: list[Cell] = []
        taken: set[Cell] = set()
        free_total = 0
        for candidate in candidates:
            if free_total >= need:
                break
            cell = candidate.binds[0]
            key = (cell.chain.name, cell.level)
            if left[key] <= 0 or cell in taken or any(a in taken for a in cell.ancestors()):
                continue
            left[key] -= 1
            chosen.append(cell)
            taken.update(cell.walk())
            free_total += candidate.free_gpus
        if len(chosen) < 2:
            return None
        return Region(None, binds=tuple(chosen), label="+".join(c.id for c in chosen), free_gpus=free_total)

    def _bindable_candidates(self, vc: VirtualCluster, spec: JobSpec, level: TopologyLevel,
                             models: frozenset[str] | None, allowed: BoolArray | None) -> list[Region]:
        scored: list[tuple[int, int, str, Cell, int]] = []
        for (chain_name, cell_level), count in self.tenancy.remaining(vc.name).items():
            chain = self.forest.chains[chain_name]
            if count <= 0 or (models is not None and chain.model not in models):
                continue
            if not cell_holds(chain.sizes[cell_level], cell_level, chain, spec, level):
                continue
            type_name = chain.type_name(cell_level)
            cells, flags, rows, cols, parent_free = self.tenancy.type_arrays(type_name)
            index = np.flatnonzero(flags)
            if allowed is not None:
                index = index[allowed[rows[index]].any(axis=1)]
            if index.size == 0:
                continue
            full = self.book.gpu_full[rows[index], cols[index]]
            free = (full if allowed is None else full & allowed[rows[index]]).sum(axis=1)
            split = parent_free[index].astype(np.int64)
            racks = self._label_rack.get(type_name)
            if racks is not None:
                split = self._whole_label_rack(racks, flags)[index].astype(np.int64)
            occupancy = chain.sizes[cell_level] - free
            order = np.lexsort((index, split, occupancy))[:CANDIDATE_CELLS]
            scored.extend((int(occupancy[i]), int(split[i]), cells[index[i]].id, cells[index[i]], int(free[i]))
                          for i in order)
        scored.sort(key=lambda item: item[:3])
        return [Region(None, binds=(cell,), label=cell_id, free_gpus=free)
                for _, _, cell_id, cell, free in scored[:CANDIDATE_CELLS]]

    @staticmethod
    def _whole_label_rack(racks: IntArray, flags: BoolArray) -> BoolArray:
        """Per cell: is it in a labelled rack whose every node cell is free (binding it splits the rack)?"""
        labelled = racks >= 0
        if not labelled.any():
            return np.zeros(len(racks), np.bool_)
        index = np.where(labelled, racks, 0)
        size = int(index.max()) + 1
        members = np.bincount(index, weights=labelled, minlength=size)
        free = np.bincount(index, weights=labelled & flags, minlength=size)
        whole: BoolArray = labelled & (free[index] == members[index])
        return whole

    def materialise(self, region: Region, vc: VirtualCluster, spec: JobSpec) -> BoolArray | None:
        """A candidate's GPU mask: its new cells, plus the VC's bound cells for per-member jobs."""
        if region.mask is not None or not region.binds:
            return region.mask
        mask = self.mask_of(region.binds)
        if container_level(spec) == TopologyLevel.GPU:
            mask |= self.owned_mask(vc, spec.gpu_models)
        region.mask = mask
        return mask

    def can_bind_all(self, vc: str, cells: Sequence[Cell]) -> bool:
        """Could the VC bind all these cells, one after the other, keeping every guarantee safe?"""
        if len(cells) == 1:
            return self.tenancy.can_bind(vc, cells[0])
        done: list[Cell] = []
        try:
            for cell in cells:
                if not self.tenancy.can_bind(vc, cell):
                    return False
                self.tenancy.bind(vc, cell)
                done.append(cell)
            return True
        finally:
            for cell in reversed(done):
                self.tenancy.unbind(cell)

    def bound_free(self, vc: VirtualCluster, spec: JobSpec, allowed: BoolArray | None = None) -> int:
        """Completely free GPUs in the VC's bound cells (they join a new cell for per-member jobs), on the
        ``allowed`` nodes only when given."""
        if container_level(spec) != TopologyLevel.GPU:
            return 0
        mask = self.tenancy.owner == self.tenancy.vc_index[vc.name]
        if allowed is not None:
            mask &= allowed[:, None]
        return int((self.book.gpu_full & mask).sum())

    def reach(self, vc: VirtualCluster, spec: JobSpec) -> BoolArray:
        """Nodes a guaranteed job of the VC could ever use now: its bound cells and the free cells it may
        still bind that hold the job (a starving job reserves among these)."""
        models = spec.gpu_models
        nodes: BoolArray = np.asarray(self.owned_mask(vc, models).any(axis=1), np.bool_)
        level = container_level(spec)
        for (chain_name, cell_level), count in self.tenancy.remaining(vc.name).items():
            chain = self.forest.chains[chain_name]
            if count <= 0 or (models is not None and chain.model not in models):
                continue
            if cell_holds(chain.sizes[cell_level], cell_level, chain, spec, level):
                for cell in self.tenancy.free_cells_of_type(chain.type_name(cell_level)):
                    nodes[list(cell.nodes)] = True
        return nodes

    def pinned_nodes(self, vc: VirtualCluster) -> BoolArray:
        """Nodes whose every GPU lies in cells pinned to the VC (its for good, whatever runs there)."""
        pinned = self.mask_of(cell for cell, owner in self.tenancy.pinned.items() if owner == vc.name)
        covered: BoolArray = (pinned | ~self.book.gpu_present).all(axis=1) & self.gpu_nodes
        return covered

    # ------------------------------------------------------------------ beyond the guarantee
    def scavenge(self, spec: JobSpec) -> list[Region]:
        """Borrowed and opportunistic work: capacity nobody has bound first, then any idle capacity."""
        if not self.options.cells:
            return [Region(None)]
        unowned: BoolArray = self.tenancy.owner < 0
        if not spec.wants_gpu:
            # Nodes without GPUs are guaranteed ground; on GPU nodes, prefer those nobody has bound.
            free_nodes = self.gpu_nodes & ~(self.book.gpu_present & ~unowned).any(axis=1)
            return [Region(None, free_nodes, label="GPU nodes nobody has bound"),
                    Region(None, self.gpu_nodes, label="GPU nodes")]
        return [Region(unowned, label="unbound cells"), Region(None, label="cluster")]

    # ------------------------------------------------------------------ masks
    def mask_of(self, cells: Iterable[Cell]) -> BoolArray:
        """GPU mask of some cells (built from their index lists; no per-cell cache, which would cost
        nodes x GPUs bytes per cell on large clusters)."""
        mask = np.zeros((self.book.size, self.book.max_gpus), np.bool_)
        gpus = [gpu for cell in cells for gpu in cell.gpus]
        if gpus:
            rows, cols = zip(*gpus, strict=True)
            mask[list(rows), list(cols)] = True
        return mask

    def owned_mask(self, vc: VirtualCluster, models: frozenset[str] | None) -> BoolArray:
        """GPUs of every cell bound to the VC (of the allowed models)."""
        mask: BoolArray = self.tenancy.owner == self.tenancy.vc_index[vc.name]
        if models is not None:
            allowed = np.array([name in models for name in self.book.model_names], np.bool_)
            mask &= allowed[self.book.model_id][:, None]
        return mask
