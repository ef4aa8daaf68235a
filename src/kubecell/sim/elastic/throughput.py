"""Seconds per iteration of one application on one GPU type at any placement and per-replica batch size.

This is Sia's ``Application.get_throughput`` (``sia-simulator/applications.py``), re-derived:

1. A placement is a tuple of replicas per node. Zeros are dropped and it is turned into the
   lexicographically smallest rotation (``(4, 2, 4)`` -> ``"244"``), the form the tables are keyed by.
2. A placement measured in ``placements-<gpu>.csv``: linear in the batch size between measured sizes
   (``interp1d``); outside them, unknown.
3. Any other placement: interpolated over (nodes, replicas, batch size) from the per-(nodes, replicas) means of
   the placement rows plus the scalability rows, with the node count capped at 16 (Sia's cap).

Step 3 departs in method, not in data: Sia uses scipy's ``LinearNDInterpolator`` (linear on a Delaunay
tetrahedralisation of the scattered 3-D points, whose shape depends on the axes' very different scales). Here
the points are interpolated along three axes in turn: the batch size at each measured (nodes, replicas) point,
then the replica count at a fixed number of replicas per node inside each measured node count, then the node
count between the nearest measured node counts on either side. Measured points are reproduced exactly either
way; in between the two schemes can differ by a few percent. A point outside the measured range (say 40 T4
nodes) is unknown (``None``), as it is in Sia.

Sia's ``get_max_local_bsz`` (the largest per-replica batch that fits) comes with it: the largest measured
batch of a measured placement, else of any scalability row at least as large in nodes and replicas.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from kubecell.sim.elastic.profiles import Curve, GpuTables

MAX_INTERPOLATED_NODES = 16
"""Sia caps the node count at 16 before interpolating (its profiles go no further)."""


def canonical(placement: Sequence[int]) -> tuple[int, ...]:
    """Zeros dropped, then the lexicographically smallest rotation (Sia's table key)."""
    counts = tuple(count for count in placement if count)
    if not counts:
        return ()
    return min(counts[i:] + counts[:i] for i in range(len(counts)))


def placement_id(placement: Sequence[int]) -> str:
    """The table key of a placement: ``(4, 2, 4)`` -> ``"244"``."""
    return "".join(str(count) for count in canonical(placement))


class _Level:
    """All measured points with one node count: replica counts, each with its batch-size curve."""

    def __init__(self, nodes: int, points: Mapping[int, Curve]) -> None:
        self.nodes = nodes
        self.replicas = sorted(points)
        self.curves = [points[r] for r in self.replicas]

    def covers(self, per_node: float) -> bool:
        replicas = per_node * self.nodes
        return self.replicas[0] - 1e-9 <= replicas <= self.replicas[-1] + 1e-9

    def at(self, per_node: float, local_bsz: float) -> tuple[float, float]:
        """Linear in the replica count between the measured counts around ``per_node * nodes``."""
        replicas = per_node * self.nodes
        index = bisect.bisect_left(self.replicas, replicas - 1e-9)
        if index < len(self.replicas) and abs(self.replicas[index] - replicas) <= 1e-9:
            return _clamped(self.curves[index], local_bsz)
        low, high = self.replicas[index - 1], self.replicas[index]
        weight = (replicas - low) / (high - low)
        a = _clamped(self.curves[index - 1], local_bsz)
        b = _clamped(self.curves[index], local_bsz)
        return (a[0] + weight * (b[0] - a[0]), a[1] + weight * (b[1] - a[1]))


def _clamped(curve: Curve, local_bsz: float) -> tuple[float, float]:
    """A point's curve at ``local_bsz``, held at its last measured value beyond its measured range (the caller
    has already capped the batch to what fits at the queried placement; neighbouring points may have been
    measured over a slightly different range)."""
    return curve.at(min(max(local_bsz, curve.min_bsz), curve.max_bsz))


def _mean_curves(curves: Sequence[Curve]) -> Curve:
    """One curve from several measured at the same point: the mean at each batch size any of them has."""
    by_bsz: dict[float, list[tuple[float, float]]] = defaultdict(list)
    for curve in curves:
        for bsz, step, sync in zip(curve.local_bsz, curve.step_time, curve.sync_time, strict=True):
            by_bsz[float(bsz)].append((float(step), float(sync)))
    sizes = sorted(by_bsz)
    return Curve(np.array(sizes), np.array([np.mean([s for s, _ in by_bsz[b]]) for b in sizes]),
                 np.array([np.mean([y for _, y in by_bsz[b]]) for b in sizes]))


class ThroughputModel:
    """Step and sync time of one application on one GPU type (Sia's ``get_throughput``, see the module)."""

    def __init__(self, tables: GpuTables) -> None:
        self.placements = dict(tables.placements)
        self.scalability = dict(tables.scalability)
        grouped: dict[tuple[int, int], list[Curve]] = defaultdict(list)
        for key, curve in self.placements.items():
            grouped[(len(key), sum(int(digit) for digit in key))].append(curve)
        for point, curve in self.scalability.items():
            grouped[point].append(curve)
        by_nodes: dict[int, dict[int, Curve]] = defaultdict(dict)
        for (nodes, replicas), curves in grouped.items():
            by_nodes[nodes][replicas] = _mean_curves(curves)
        self.levels = [_Level(nodes, by_nodes[nodes]) for nodes in sorted(by_nodes)]
        self.min_local_bsz = min(curve.min_bsz for curve in self.placements.values())
        self.max_local_bsz = max(curve.max_bsz for curve in self.placements.values())
        self._by_replicas: dict[int, int] = {}
        for key, curve in self.placements.items():
            replicas = sum(int(digit) for digit in key)
            self._by_replicas[replicas] = max(self._by_replicas.get(replicas, 0), curve.max_bsz)
        self.times = lru_cache(maxsize=65536)(self._times)

    def measured(self, placement: Sequence[int]) -> bool:
        """Whether the placement itself is in the placements table."""
        return placement_id(placement) in self.placements

    def _times(self, placement: tuple[int, ...], local_bsz: int) -> tuple[float, float] | None:
        key = placement_id(placement)
        if not key:
            return None
        curve = self.placements.get(key)
        if curve is not None:
            if not curve.min_bsz <= local_bsz <= curve.max_bsz:
                return None
            return curve.at(local_bsz)
        nodes, replicas = min(len(key), MAX_INTERPOLATED_NODES), sum(int(digit) for digit in key)
        return self._interpolate(nodes, replicas / nodes, local_bsz)

    def _interpolate(self, nodes: int, per_node: float, local_bsz: int) -> tuple[float, float] | None:
        below = [level for level in self.levels if level.nodes <= nodes and level.covers(per_node)]
        above = [level for level in self.levels if level.nodes >= nodes and level.covers(per_node)]
        if not below or not above:
            return None
        low, high = below[-1], above[0]
        a = low.at(per_node, local_bsz)
        if low is high:
            return a
        b = high.at(per_node, local_bsz)
        weight = (nodes - low.nodes) / (high.nodes - low.nodes)
        return (a[0] + weight * (b[0] - a[0]), a[1] + weight * (b[1] - a[1]))

    def max_local_bsz_at(self, placement: Sequence[int]) -> int:
        """The largest per-replica batch measured at this placement (Sia's ``get_max_local_bsz``)."""
        key = placement_id(placement)
        curve = self.placements.get(key)
        if curve is not None:
            return curve.max_bsz
        nodes, replicas = len(key), sum(int(digit) for digit in key)
        larger = [curve.max_bsz for (n, r), curve in self.scalability.items() if n >= nodes and r >= replicas]
        return max(larger) if larger else self.max_local_bsz

    def max_local_bsz_for_replicas(self, replicas: int) -> int | None:
        """The largest per-replica batch of any measured placement with this many replicas (Sia's memory
        correction in ``update_local_bsz``), None when no placement of that size was measured."""
        return self._by_replicas.get(replicas)
