"""Can every virtual cluster's guarantee be met at once? HiveD's per-level cell accounting.

Per chain, walk the levels from the top: the cells available at a level are the free cells there
whose parent is not free, plus every child of the free cells left over one level up after that level's
demand was served. If the available cells at any level are fewer than the demand at that level, the
guarantees are unsatisfiable together (and which VCs ask for what says where to cut). The same check
guards runtime bindings: binding a cell that splits a free parent is allowed only if the remaining
demand still fits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kubecell.core.topology import Cell, CellChain, CellForest

CellDemand = Mapping[str, Mapping[tuple[str, int], int]]
"""VC name -> (chain name, level) -> number of cells still to be provided."""


@dataclass(frozen=True, slots=True)
class Shortfall:
    chain: CellChain
    level: int
    needed: int
    available: int
    askers: tuple[tuple[str, int], ...]  # (VC, cells it asks for at this level)

    @property
    def type_name(self) -> str:
        return self.chain.type_name(self.level)

    def describe(self) -> str:
        who = ", ".join(f"{vc} asks for {n}" for vc, n in self.askers)
        return (
            f"cell type {self.type_name}: {who}; only {self.available} such cells can be provided "
            f"once larger guaranteed cells are taken (short by {self.needed - self.available})"
        )


def free_cells(forest: CellForest, blocked: Collection[Cell]) -> set[Cell]:
    """Cells with nothing blocked in their subtree nor above them."""
    dirty: set[Cell] = set()
    for cell in blocked:
        dirty.add(cell)
        dirty.update(cell.ancestors())
        dirty.update(cell.walk())
    return {cell for root in forest.roots for cell in root.walk() if cell not in dirty}


def shortfalls(forest: CellForest, demand: CellDemand, blocked: Collection[Cell] = ()) -> list[Shortfall]:
    """Every (chain, level) whose demand the free cells cannot meet; empty when all guarantees fit."""
    counts: dict[tuple[str, int], int] = {}
    for cell in free_cells(forest, blocked):
        key = (cell.chain.name, cell.level)
        counts[key] = counts.get(key, 0) + 1
    return shortfalls_from_counts(forest, demand, counts)


def shortfalls_from_counts(forest: CellForest, demand: CellDemand,
                           free_count: Mapping[tuple[str, int], int]) -> list[Shortfall]:
    """The same check from the number of free cells per (chain, level). Every child of a free cell is
    free, so the free cells at a level whose parent is not free number
    ``free(L) - fanout(L + 1) x free(L + 1)``: the check costs O(levels), not O(cells)."""
    problems: list[Shortfall] = []
    for chain in forest.chains.values():
        carry = 0
        for level in range(chain.top_level, -1, -1):
            here = free_count.get((chain.name, level), 0)
            if level < chain.top_level:
                here -= chain.fanout(level + 1) * free_count.get((chain.name, level + 1), 0)
            available = carry + here
            askers = tuple(sorted((vc, n) for vc, cells in demand.items()
                                  if (n := cells.get((chain.name, level), 0)) > 0))
            needed = sum(n for _, n in askers)
            if needed > available:
                problems.append(Shortfall(chain, level, needed, available, askers))
            left = max(available - needed, 0)
            carry = left * chain.fanout(level) if level > 0 else 0
    return problems
