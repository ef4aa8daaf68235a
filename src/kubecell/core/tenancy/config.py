"""Tenant configuration: virtual clusters and what each is guaranteed, validated against the cluster.

A virtual cluster (VC) is guaranteed a multiset of cells (``{cell type: count}``), optionally pinned
physical cells, and ``gpus: N`` as a shorthand that expands to whole nodes plus the largest sub-node
cells for the remainder. Beyond its guarantee a VC may borrow idle capacity, weighted by ``weight`` and
capped by ``borrowLimitGpus``; ``minRuntimeMinutes`` protects its running jobs from priority
preemption for that long. The configuration is rejected, with the VC, the cell type and the shortfall,
unless every guarantee can be met at the same time at every level of the physical cluster.

Example (YAML)::

    cellTypes:                    # optional aliases for cell type names
      dgx: V100M32x8/node
    virtualClusters:
      vision:
        cells: {dgx: 4, V100M32x8/rack: 1}
        weight: 2
        borrowLimitGpus: 64
      speech:
        gpus: 12                  # -> 1 x V100M32x8/node + 1 x V100M32x8/4gpu
        pinnedCells: [node-07]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import AMOUNT_BITS
from kubecell.core.tenancy.feasibility import shortfalls
from kubecell.core.topology import Cell, CellChain, CellForest
from kubecell.core.validation import KeyPath, Locator, explain_validation_error, plain_locator

MAX_BORROW_LIMIT_GPUS = 1 << AMOUNT_BITS
"""The largest ``borrowLimitGpus``: its milli-GPUs (x 1000) stay an integer the engine can add up. Without a
bound, a finite ``1e308`` became an infinite float and ``round`` raised ``OverflowError``."""

# Counts are strict integers: YAML's ``yes``/``true`` must not silently become 1 GPU or 1 cell.
PositiveCount = Annotated[int, Field(strict=True, ge=1)]
CellCount = Annotated[int, Field(strict=True, ge=0)]


class GpuShorthand(BaseModel):
    """``gpus: {count: 12, chain: V100M32x8}`` when the cluster has more than one chain."""

    model_config = ConfigDict(extra="forbid")
    count: PositiveCount
    chain: str | None = None


class VirtualClusterConfig(BaseModel):
    # Numbers must be finite: '.inf' as a weight or a limit is a typo, not a policy.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)
    cells: dict[str, CellCount] = Field(default_factory=dict)
    gpus: PositiveCount | GpuShorthand | None = None
    pinned_cells: list[str] = Field(default_factory=list, alias="pinnedCells")
    weight: float = Field(default=1.0, gt=0, strict=True)
    borrow_limit_gpus: float | None = Field(default=None, ge=0, le=MAX_BORROW_LIMIT_GPUS, strict=True,
                                            alias="borrowLimitGpus")
    min_runtime_minutes: float = Field(default=0.0, ge=0, strict=True, alias="minRuntimeMinutes")


class TenantConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    cell_types: dict[str, str] = Field(default_factory=dict, alias="cellTypes")
    virtual_clusters: dict[str, VirtualClusterConfig] = Field(alias="virtualClusters")


@dataclass(frozen=True, slots=True)
class VirtualCluster:
    """A validated VC: its preassigned (unpinned) cell demand per (chain, level) and its pinned cells."""

    name: str
    index: int
    demand: Mapping[tuple[str, int], int]
    pinned: tuple[str, ...]
    weight: float
    borrow_limit_milli: int | None
    min_runtime_seconds: float
    guaranteed_gpus: int

    @property
    def guaranteed_milli(self) -> int:
        return self.guaranteed_gpus * 1000


@dataclass(frozen=True)
class Tenants:
    vcs: tuple[VirtualCluster, ...]
    by_name: dict[str, VirtualCluster] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {vc.name: vc for vc in self.vcs})

    def get(self, name: str) -> VirtualCluster | None:
        return self.by_name.get(name)

    def require(self, name: str, *, location: str | None = None) -> VirtualCluster:
        vc = self.get(name)
        if vc is None:
            raise InvalidInputError(f"unknown virtual cluster {name!r}", location=location, field="vc",
                                    accepted=", ".join(v.name for v in self.vcs) or "none configured")
        return vc

    @property
    def names(self) -> list[str]:
        return [vc.name for vc in self.vcs]


ACCEPTED_TOP_KEYS = "cellTypes, virtualClusters"
ACCEPTED_VC_KEYS = "cells, gpus, pinnedCells, weight, borrowLimitGpus, minRuntimeMinutes"

FIELD_ACCEPTED = {
    "cellTypes": "a mapping of alias names to cell types, e.g. {dgx: V100M32x8/node}",
    "cellTypes.*": "a cell type such as V100M32x8/node",
    "virtualClusters": "a mapping of VC names to {cells, gpus, pinnedCells, weight, borrowLimitGpus, "
    "minRuntimeMinutes}",
    "virtualClusters.*": "a mapping with cells, gpus, pinnedCells, weight, borrowLimitGpus, minRuntimeMinutes",
    "virtualClusters.*.cells": "a mapping of cell types to counts, e.g. {V100M32x8/node: 2}",
    "virtualClusters.*.cells.*": "a whole number of cells >= 0",
    "virtualClusters.*.gpus": "a whole number of GPUs >= 1, or {count: N, chain: NAME} on a cluster with "
    "several chains",
    "virtualClusters.*.gpus.count": "a whole number of GPUs >= 1",
    "virtualClusters.*.gpus.chain": "a chain name such as V100M32x8",
    "virtualClusters.*.pinnedCells": "a list of cell ids, e.g. [node-07, rack1, n0/4gpu1]",
    "virtualClusters.*.pinnedCells.*": "a cell id such as node-07, rack1 or n0/4gpu1",
    "virtualClusters.*.weight": "a finite number > 0",
    "virtualClusters.*.borrowLimitGpus": f"a finite number of GPUs, 0..{MAX_BORROW_LIMIT_GPUS}",
    "virtualClusters.*.minRuntimeMinutes": "a finite number of minutes >= 0",
}
"""What each field accepts, by key path (``*``: any VC, alias, cell type or list position)."""


def _accepted_keys(parts: KeyPath) -> str:
    """Which keys the mapping at ``parts`` accepts (for unknown- and missing-key errors)."""
    if len(parts) == 2 and parts[0] == "virtualClusters":
        return f"{ACCEPTED_VC_KEYS} (per VC; top level: {ACCEPTED_TOP_KEYS})"
    if len(parts) == 3 and parts[-1] == "gpus":
        return "count, chain"
    return f"{ACCEPTED_TOP_KEYS} (per VC: {ACCEPTED_VC_KEYS})"


def expand_gpus(forest: CellForest, count: int, chain_name: str) -> dict[tuple[str, int], int]:
    """``gpus: N`` -> as many node cells as fit, then the largest sub-node cells for the rest."""
    chain = forest.chains[chain_name]
    cells: dict[tuple[str, int], int] = {}
    left = count
    for level in range(chain.node_level, -1, -1):
        size = chain.sizes[level]
        if left >= size:
            cells[(chain.name, level)] = left // size
            left %= size
    return cells


def _cell_type(forest: CellForest, type_name: str, where: Locator, parts: KeyPath) -> tuple[CellChain, int]:
    """``forest.parse_type`` located at the key that names the type (its error names no field: the key
    path already says where the type was written). Located only on error: a locator may read a file."""
    try:
        return forest.parse_type(type_name)
    except InvalidInputError as error:
        raise InvalidInputError(error.message, location=where(parts), accepted=error.accepted) from None


def _demand(vc: VirtualClusterConfig, aliases: Mapping[str, str], forest: CellForest, where: Locator,
            at: tuple[str, ...]) -> dict[tuple[str, int], int]:
    """The cells a VC is guaranteed, per (chain, level): its ``cells`` by type and its ``gpus`` shorthand."""
    demand: dict[tuple[str, int], int] = {}
    for type_name, count in vc.cells.items():
        chain, level = _cell_type(forest, aliases.get(type_name, type_name), where,
                                  (*at, "cells", type_name))
        if count < 0:
            raise InvalidInputError(f"negative count {count} for {type_name}",
                                    location=where((*at, "cells", type_name)), accepted="whole numbers >= 0")
        if count:
            demand[(chain.name, level)] = demand.get((chain.name, level), 0) + count
    if vc.gpus is not None:
        shorthand = vc.gpus if isinstance(vc.gpus, GpuShorthand) else GpuShorthand(count=vc.gpus)
        chain_name = shorthand.chain
        if chain_name is None:
            if len(forest.chains) != 1:
                raise InvalidInputError("gpus: N is ambiguous on a cluster with several chains",
                                        location=where((*at, "gpus")),
                                        accepted="gpus: {count: N, chain: one of " + ", ".join(forest.chains) + "}")
            chain_name = next(iter(forest.chains))
        if chain_name not in forest.chains:
            raise InvalidInputError(f"unknown chain {chain_name!r}", location=where((*at, "gpus", "chain")),
                                    accepted=", ".join(forest.chains))
        for key, n in expand_gpus(forest, shorthand.count, chain_name).items():
            demand[key] = demand.get(key, 0) + n
    return demand


def _pinned(vc: VirtualClusterConfig, name: str, forest: CellForest, where: Locator, at: tuple[str, ...],
            pinned_owner: dict[str, tuple[str, int]]) -> list[Cell]:
    """A VC's pinned cells, each pinned by one VC once (``pinned_owner``: cell id -> (VC, index), filled)."""
    pinned: list[Cell] = []
    for position, cell_id in enumerate(vc.pinned_cells):
        try:
            cell = forest.cell(cell_id)
        except InvalidInputError as error:
            raise InvalidInputError(error.message, location=where((*at, "pinnedCells", position)),
                                    accepted=error.accepted) from None
        if cell_id in pinned_owner:
            owner = pinned_owner[cell_id][0]
            message = (f"cell {cell_id!r} is pinned twice by {name!r}" if owner == name
                       else f"cell {cell_id!r} is pinned by both {owner!r} and {name!r}")
            raise InvalidInputError(message, location=where((*at, "pinnedCells", position)),
                                    accepted="each cell pinned by one VC, once")
        pinned_owner[cell_id] = (name, position)
        pinned.append(cell)
    return pinned


def _check_disjoint_pins(forest: CellForest, pinned_owner: Mapping[str, tuple[str, int]],
                         where: Locator) -> list[Cell]:
    """Every pinned cell, none inside another (two VCs cannot both own one GPU). Each pin looks up its own
    ancestors among the pins, so the check is linear in the pins: the whole-cluster default pins every node of
    a cluster without racks, thousands of them, at every rebuild."""
    all_pinned = [forest.by_id[c] for c in pinned_owner]
    order = {cell: position for position, cell in enumerate(all_pinned)}
    for cell in all_pinned:
        around = [ancestor for ancestor in cell.ancestors() if ancestor in order]
        if around:
            other = min(around, key=order.__getitem__)  # the first listed, as the message always named
            owner, position = pinned_owner[cell.id]
            raise InvalidInputError(
                f"pinned cell {cell.id!r} ({owner}) lies inside pinned cell {other.id!r} "
                f"({pinned_owner[other.id][0]})", accepted="disjoint pinned cells",
                location=where(("virtualClusters", owner, "pinnedCells", position)))
    return all_pinned


def resolve_tenants(raw: Any, forest: CellForest, *, source: str = "tenants",
                    locate: Locator | None = None) -> Tenants:
    """Validate a parsed YAML document against the physical cluster and return the tenants.

    Errors are located by ``locate(key path)`` (a YAML reader passes one that knows file and line, so
    every error reads ``tenants.yaml:14: virtualClusters.vision.gpus: ...``); without it, by ``source``
    and the key path.
    """
    where = locate or plain_locator(source)
    if not isinstance(raw, Mapping):
        raise InvalidInputError("expected a mapping with 'virtualClusters'", location=where(()),
                                accepted="virtualClusters: {name: {cells: {...}, gpus: N, ...}}")
    try:
        config = TenantConfigFile.model_validate(raw)
    except ValidationError as error:
        raise explain_validation_error(error, raw, where, accepted=FIELD_ACCEPTED, keys=_accepted_keys) from None
    aliases = dict(config.cell_types)
    for alias, target in aliases.items():
        _cell_type(forest, target, where, ("cellTypes", alias))
    pinned_owner: dict[str, tuple[str, int]] = {}  # cell id -> (VC, index in its pinnedCells)
    vcs: list[VirtualCluster] = []
    for index, (name, vc) in enumerate(config.virtual_clusters.items()):
        at: tuple[str, ...] = ("virtualClusters", name)
        demand = _demand(vc, aliases, forest, where, at)
        pinned = _pinned(vc, name, forest, where, at, pinned_owner)
        gpus = sum(forest.chains[c].sizes[level] * n for (c, level), n in demand.items())
        gpus += sum(cell.size for cell in pinned)
        if gpus == 0:
            raise InvalidInputError("guarantees nothing", location=where(at),
                                    accepted="cells: {type: count}, gpus: N or pinnedCells")
        limit = None if vc.borrow_limit_gpus is None else round(vc.borrow_limit_gpus * 1000)
        vcs.append(VirtualCluster(name, index, demand, tuple(vc.pinned_cells), vc.weight, limit,
                                  vc.min_runtime_minutes * 60.0, gpus))
    all_pinned = _check_disjoint_pins(forest, pinned_owner, where)
    problems = shortfalls(forest, {vc.name: vc.demand for vc in vcs}, blocked=all_pinned)
    if problems:
        raise InvalidInputError(
            "guarantees cannot all be met at once: " + "; ".join(p.describe() for p in problems),
            location=where(("virtualClusters",)),
            accepted="guarantees that fit the physical cluster together at every level",
        )
    return Tenants(tuple(vcs))
