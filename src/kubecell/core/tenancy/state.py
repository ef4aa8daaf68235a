"""Runtime tenancy: which physical cells are bound to which virtual cluster, and what is left to bind.

A VC's preassigned cells are bound to physical cells of the same type when first needed and unbound
when its guaranteed jobs leave them (HiveD's dynamic binding), so an idle guarantee does not pin
machines and fragmentation stays low. Pinned cells are bound for good. A free cell may be bound only if
every VC's remaining guarantee can still be met afterwards (the safe-split rule). Bad hardware is
handled with HiveD's doomed-bad-cell rule: when healthy free cells cannot cover the unbound guarantees
at some level, that shortfall is charged to VCs as *doomed* cells, visible in their status and never
bound, until the hardware recovers. The VC whose bound cell held the failed GPUs bears the doom first:
a tenant that lost nothing keeps its guarantee wherever the failed tenant's own demand can absorb it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from kubecell.core.book import AllocationBook, IntArray
from kubecell.core.tenancy.config import Tenants, VirtualCluster
from kubecell.core.tenancy.feasibility import Shortfall, shortfalls_from_counts
from kubecell.core.topology import Cell, CellForest


class TenancyState:
    """Bindings of VCs to physical cells, kept consistent with the book's GPU health."""

    def __init__(self, forest: CellForest, tenants: Tenants, book: AllocationBook) -> None:
        self.forest = forest
        self.book = book
        self.tenants = tenants
        self.owner: IntArray = np.full((book.size, book.max_gpus), -1, np.int64)
        self.binding: dict[Cell, str] = {}
        self.pinned: dict[Cell, str] = {}
        self.bad: set[Cell] = set()
        self.doomed: dict[str, Counter[tuple[str, int]]] = {}
        self._failed_under: dict[Cell, str] = {}  # bad GPU cell -> VC whose bound cell held it when it failed
        self._blocked_below: Counter[Cell] = Counter()  # blocked cells in each cell's subtree
        self._direct: Counter[Cell] = Counter()  # cells blocked themselves (bound and/or bad)
        self.version = 0  # bumped on every binding or health change
        # Free cells per type, maintained incrementally: a binding touches only its subtree and ancestors.
        self._free: dict[str, set[Cell]] = {t: set(forest.cells_of_type(t)) for t in forest.type_names()}
        # The same as arrays in each type's fixed cell order, for vectorized scoring of free cells.
        self._position: dict[Cell, int] = {
            c: i for t in forest.type_names() for i, c in enumerate(forest.cells_of_type(t))}
        self._flags: dict[str, np.ndarray] = {t: np.ones(len(forest.cells_of_type(t)), np.bool_)
                                              for t in forest.type_names()}
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._type_version: Counter[str] = Counter()
        self._free_cache: dict[str, tuple[int, list[Cell]]] = {}
        self._index_cache: dict[str, tuple[int, list[Cell], np.ndarray, np.ndarray]] = {}
        self._configure(tenants)

    # ------------------------------------------------------------------ configuration
    def _configure(self, tenants: Tenants) -> None:
        self.tenants = tenants
        self.vc_index = {vc.name: vc.index for vc in tenants.vcs}
        self.unbound: dict[str, Counter[tuple[str, int]]] = {vc.name: Counter(vc.demand) for vc in tenants.vcs}
        for vc in tenants.vcs:
            for cell_id in vc.pinned:
                cell = self.forest.by_id[cell_id]
                self.pinned[cell] = vc.name
                self._bind(vc.name, cell)
        self.refresh_health()

    def reconfigure(self, tenants: Tenants) -> None:
        """Drop every binding and adopt a new configuration (callers re-bind running work)."""
        for cell in list(self.binding):
            self._unbind(cell)
        self.pinned.clear()
        self._configure(tenants)

    # ------------------------------------------------------------------ blocked / free cells
    def _block(self, cell: Cell, delta: int) -> None:
        self.version += 1
        self._direct[cell] += delta
        self._blocked_below[cell] += delta
        ancestors = list(cell.ancestors())
        for ancestor in ancestors:
            self._blocked_below[ancestor] += delta
        for touched in (*ancestors, *cell.walk()):
            free = self._compute_free(touched)
            members = self._free[touched.type_name]
            if free != (touched in members):
                if free:
                    members.add(touched)
                else:
                    members.discard(touched)
                self._flags[touched.type_name][self._position[touched]] = free
                self._type_version[touched.type_name] += 1

    def _compute_free(self, cell: Cell) -> bool:
        if self._blocked_below[cell]:
            return False
        return not any(self._direct[a] for a in cell.ancestors())

    def is_free(self, cell: Cell) -> bool:
        """Nothing bound or bad inside the cell or above it."""
        return cell in self._free[cell.type_name]

    def free_counts(self) -> dict[tuple[str, int], int]:
        """Number of free cells per (chain, level)."""
        counts: dict[tuple[str, int], int] = {}
        for chain in self.forest.chains.values():
            for level in range(len(chain.kinds)):
                counts[(chain.name, level)] = len(self._free[chain.type_name(level)])
        return counts

    def vc_for(self, name: str) -> VirtualCluster:
        return self.tenants.require(name)

    # ------------------------------------------------------------------ bindings
    def _bind(self, vc: str, cell: Cell) -> None:
        self.binding[cell] = vc
        self._block(cell, 1)
        for node, gpu in cell.gpus:
            self.owner[node, gpu] = self.vc_index[vc]

    def _unbind(self, cell: Cell) -> None:
        del self.binding[cell]
        self._block(cell, -1)
        for node, gpu in cell.gpus:
            self.owner[node, gpu] = -1

    def remaining(self, vc: str) -> Counter[tuple[str, int]]:
        """Cells the VC may still bind (unbound and not doomed)."""
        left = Counter(self.unbound[vc])
        left.subtract(self.doomed.get(vc, Counter()))
        return +left

    def can_bind(self, vc: str, cell: Cell) -> bool:
        """Is ``cell`` free, does the VC have an unbound cell of its type, and is the split safe?"""
        key = (cell.chain.name, cell.level)
        if self.remaining(vc)[key] <= 0 or not self.is_free(cell):
            return False
        if cell.parent is None or not self.is_free(cell.parent):
            return True  # no free parent is split, so no other level loses availability
        demand = {name: self.remaining(name) for name in self.unbound}
        demand[vc] = Counter(demand[vc])
        demand[vc][key] -= 1
        self._block(cell, 1)  # try the binding, count, undo: O(subtree), not O(cluster)
        try:
            return not shortfalls_from_counts(self.forest, demand, self.free_counts())
        finally:
            self._block(cell, -1)

    def adopt(self, vc: str, cell: Cell) -> bool:
        """Bind ``cell`` to ``vc`` for guaranteed work already running in it, where it is not free only because
        some of its hardware is bad or closed (a cordoned node: the work keeps running there). Bound to no one
        inside or above, the VC has a cell of its type to bind, and the split stays safe for every other VC.
        Before, such a cell could not be bound again: a reload, a restart or a failed preemption demoted the
        work on it to borrowed, and it was reclaimed once the node reopened. True when bound."""
        key = (cell.chain.name, cell.level)
        if self.unbound[vc][key] <= 0 or self.cell_bound_above(cell) is not None:  # (not ``remaining``: the doom
            return False  # charged for bad hardware is the guarantee this cell, bad hardware and all, meets)
        if any(below in self.binding for below in cell.walk()):
            return False
        demand = {name: self.remaining(name) for name in self.unbound}
        demand[vc] = Counter(self.unbound[vc])
        before = _missing(shortfalls_from_counts(self.forest, demand, self.free_counts()))
        demand[vc] = Counter(demand[vc])
        demand[vc][key] -= 1
        self._block(cell, 1)
        try:
            after = _missing(shortfalls_from_counts(self.forest, demand, self.free_counts()))
        finally:
            self._block(cell, -1)
        if any(count > before[where] for where, count in after.items()):
            return False  # it would take healthy free cells another VC's guarantee needs (a shortfall that bad
            # hardware already causes is no reason to refuse: binding a cell nobody else could use changes nothing)
        self.unbound[vc][key] -= 1
        self._bind(vc, cell)
        if self.bad:
            self._charge_doomed()  # its own demand met: doom charged for it goes
        return True

    def bind(self, vc: str, cell: Cell) -> None:
        key = (cell.chain.name, cell.level)
        if not self.can_bind(vc, cell):
            raise ValueError(f"cannot bind {cell.id} to {vc}")
        self.unbound[vc][key] -= 1
        self._bind(vc, cell)

    def unbind(self, cell: Cell) -> None:
        """Return a preassigned (not pinned) cell to the free pool. While any hardware is bad the doomed
        charge is recomputed (O(levels x VCs)): a released cell holding bad GPUs puts back a guarantee
        only bad hardware could meet (more doom), and a released healthy cell may free a parent that
        covers a doomed guarantee again (less doom; otherwise that VC could not use it until the bad
        hardware recovers). A bind needs no recomputation: it is only allowed when every remaining
        guarantee still fits, and it never adds healthy free cells."""
        if cell in self.pinned:
            return
        vc = self.binding[cell]
        self.unbound[vc][(cell.chain.name, cell.level)] += 1
        self._unbind(cell)
        if self.bad:
            self._charge_doomed()

    def free_cells_of_type(self, type_name: str) -> list[Cell]:
        """Free cells of one type, in name order (cached until cells of that type change)."""
        version = self._type_version[type_name]
        cached = self._free_cache.get(type_name)
        if cached is not None and cached[0] == version:
            return cached[1]
        cells = sorted(self._free.get(type_name, ()), key=lambda cell: cell.id)
        self._free_cache[type_name] = (version, cells)
        return cells

    def type_arrays(self, type_name: str) -> tuple[list[Cell], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For one cell type, in fixed order: the cells, their free flags, their GPUs as (cells x size)
        node-row and GPU-column arrays, and whether each cell's parent is free (False at the top level).
        Scoring every free cell of a type is then a handful of array operations."""
        cells = self.forest.cells_of_type(type_name)
        arrays = self._arrays.get(type_name)
        if arrays is None:
            rows = np.array([[node for node, _ in cell.gpus] for cell in cells], np.int64)
            cols = np.array([[gpu for _, gpu in cell.gpus] for cell in cells], np.int64)
            parents = np.array([self._position[c.parent] if c.parent is not None else -1 for c in cells], np.int64)
            arrays = self._arrays[type_name] = (rows, cols, parents)
        rows, cols, parents = arrays
        if cells and cells[0].parent is not None:
            parent_flags = self._flags[cells[0].parent.type_name][parents]
        else:
            parent_flags = np.zeros(len(cells), np.bool_)
        return cells, self._flags[type_name], rows, cols, parent_flags

    def bindable(self, vc: str) -> list[Cell]:
        """Free physical cells of every type the VC may still bind."""
        cells: list[Cell] = []
        for (chain_name, level), count in self.remaining(vc).items():
            if count > 0:
                cells.extend(self.free_cells_of_type(self.forest.chains[chain_name].type_name(level)))
        return cells

    def bound_cells(self, vc: str) -> list[Cell]:
        return [cell for cell, owner in self.binding.items() if owner == vc]

    def cell_bound_above(self, cell: Cell) -> Cell | None:
        """The bound cell containing ``cell`` (itself included), if any."""
        if cell in self.binding:
            return cell
        return next((a for a in cell.ancestors() if a in self.binding), None)

    # ------------------------------------------------------------------ health
    def refresh_health(self) -> None:
        """Recompute bad cells from GPU health and charge unmet guarantees as doomed cells. A GPU of a node
        closed to new work (a cordoned or NotReady Kubernetes node) is bad too, as in HiveD: a guarantee no
        job could use there is charged as doomed, never promised."""
        bad: set[Cell] = set()
        healthy = self.book.gpu_healthy & self.book.node_ok[:, None]
        for (node, gpu), cell in self.forest.gpu_cell.items():
            if not healthy[node, gpu]:
                bad.add(cell)
        for cell in self.bad - bad:
            self._block(cell, -1)
            self._failed_under.pop(cell, None)
        for cell in bad - self.bad:
            holder = self.cell_bound_above(cell)
            if holder is not None:
                self._failed_under[cell] = self.binding[holder]
            self._block(cell, 1)
        self.bad = bad
        self._charge_doomed()

    def _charge_doomed(self) -> None:
        """HiveD's rule, with the failed tenant first: charge what healthy free cells cannot cover to the
        VCs whose bound cells held the failed GPUs (of that chain), then to VCs already charged for the
        cell type (a recomputation does not move the doom from one tenant to another while nothing about
        the hardware changed for them), then to the VCs asking for most."""
        previous = self.doomed
        self.doomed = {}
        if not self.bad:
            return
        failed = Counter((vc, cell.chain.name) for cell, vc in self._failed_under.items())
        problems = shortfalls_from_counts(self.forest, {name: +c for name, c in self.unbound.items()},
                                          self.free_counts())
        for problem in problems:
            key = (problem.chain.name, problem.level)
            missing = problem.needed - problem.available
            ranked = sorted((failed[(vc, problem.chain.name)] == 0, -previous.get(vc, Counter())[key], -asked, vc)
                            for vc, asked in problem.askers)
            for *_, vc in ranked:
                if missing <= 0:
                    break
                take = min(missing, self.unbound[vc][key])
                if take > 0:
                    self.doomed.setdefault(vc, Counter())[key] += take
                    missing -= take

    def doomed_gpus(self, vc: str) -> int:
        return sum(self.forest.chains[c].sizes[level] * n for (c, level), n in self.doomed.get(vc, Counter()).items())

    def cells_touching(self, gpus: Iterable[tuple[int, int]]) -> set[Cell]:
        """Bound cells that contain any of these GPUs."""
        found: set[Cell] = set()
        for node, gpu in gpus:
            leaf = self.forest.gpu_cell.get((node, gpu))
            if leaf is not None and (bound := self.cell_bound_above(leaf)) is not None:
                found.add(bound)
        return found


def _missing(problems: Iterable[Shortfall]) -> Counter[tuple[str, int]]:
    """Cells missing per (chain, level) in ``problems``."""
    return Counter({(problem.chain.name, problem.level): problem.needed - problem.available for problem in problems})
