"""Heterogeneous gangs through the placement framework: members of several shapes, all or nothing.

For one shape a capacity count is exact (``capacity``), but members of different shapes compete for the
same CPU, memory and GPUs, so counting each shape alone could promise a gang that cannot be allocated.
A heterogeneous gang is therefore placed, never counted:

1. *Which members*: the first ``least`` of the members to add (the fill order, or for growth the missing
   members in fill order) are placed all or nothing; then the rest, run by run of one group, as many as
   the capacity count of that group allows, stopping at the first member that does not fit (so the
   members a gang runs are always a prefix of its order).
2. *Where*: each group goes member by member through the policy with the homogeneous machinery
   (``GangPlacer.fill``, exact for one shape), the groups whose members are hardest to place first
   (most GPUs, whole before shares, then CPU and memory), so a launcher does not take the CPU a worker
   needs. A topology constraint tries candidate domains one at a time: for a rack or zone the ones
   that could take every member first, tightest first; for one node the nodes in the policy's order of
   the hardest member. At most ``TRIALS`` domains are tried, so a decision stays bounded.
3. *Commit or roll back*: any failure releases every member already placed, so the book is unchanged.

``fits`` places on trial and rolls back, restoring the random generator, so it promises exactly what
``place`` then delivers on the same book (victim searches and region checks rely on that). A member
without GPUs in a region with a GPU mask (a guaranteed gang inside its VC's cells) is kept to the nodes
of that region and to nodes without GPUs: it rides on the gang's guarantee like a GPU member's host CPU
does, and does not sit on another VC's cells.

Approximation: greedy placement can miss an arrangement that exists (as any online scheduler's can);
the engine then says the gang does not fit now. It never places a member that does not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.capacity import empty_capacity, member_capacity
from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import AllocationError
from kubecell.core.model import Allocation, Request, TopologyLevel
from kubecell.core.placement.placer import Placer, normalize_scores


class GangPlacer(Protocol):
    """What heterogeneous placement uses of ``placement.GangPlacer``, which owns it: its book and policy, its
    domains and its one-shape filling. A protocol, so that this module needs nothing of the one that uses it."""

    book: AllocationBook
    placer: Placer
    rack_of: IntArray
    zone_of: IntArray
    last_score: int | None

    def fill(self, requests: list[Request], scope: GangScope, allowed: BoolArray | None,
             done: list[Allocation]) -> None: ...

TRIALS = 64
"""Candidate domains (nodes for a one-node gang, racks or zones) a heterogeneous placement tries at most."""


@dataclass(frozen=True, slots=True)
class GangScope:
    """What the PreFilter leaves: the candidate nodes, how many members to place, each node's capacity."""

    nodes: IntArray
    want: int
    capacity: IntArray
    one_node: bool = False


def hardness(member: Request) -> tuple[int, ...]:
    """Sort key: members that are hardest to place first (most GPUs, whole GPUs, largest share, CPU, memory)."""
    return (-member.gpu_count, -int(member.is_whole), -member.gpu_milli, -member.gpu_memory_mib, -member.cpu_milli,
            -member.memory_mib)


def runs(spec: JobSpec, indices: Sequence[int]) -> list[tuple[int, list[int]]]:
    """``indices`` cut into runs of one group: (group position, its indices), in order."""
    out: list[tuple[int, list[int]]] = []
    for index in indices:
        position = spec.group_position(index)
        if out and out[-1][0] == position:
            out[-1][1].append(index)
        else:
            out.append((position, [index]))
    return out


def by_group(spec: JobSpec, indices: Sequence[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for index in indices:
        groups.setdefault(spec.group_position(index), []).append(index)
    return groups


def could_hold(book: AllocationBook, spec: JobSpec, counts: Sequence[int], domain_of: IntArray | None,
               one_node: bool, within: BoolArray | None = None) -> bool:
    """Could empty nodes (``within``, in one node or one domain when asked) hold these members per group?

    Necessary conditions only: each group's own capacity, and the members' CPU, memory and GPUs added
    up against what the nodes have. Used to reject gangs that can never run, so it must never say no to
    a gang that could: where it says yes the gang may still never fit, and then it waits, saying why."""
    groups = spec.member_groups
    needed = [(g.member, c) for g, c in zip(groups, counts, strict=True) if c > 0]
    caps = [np.minimum(empty_capacity(book, member), count) for member, count in needed]
    if within is not None:
        caps = [np.where(within, cap, 0) for cap in caps]
    present = book.gpu_present.sum(axis=1)
    supply = [book.cpu_capacity, book.mem_capacity, present, present * 1000]
    demand = [sum(m.cpu_milli * c for m, c in needed), sum(m.memory_mib * c for m, c in needed),
              sum(m.gpu_count * c for m, c in needed if m.is_whole), sum(m.total_gpu_milli * c for m, c in needed)]
    if within is not None:
        supply = [np.where(within, s, 0) for s in supply]
    if one_node:
        ok = np.ones(book.size, np.bool_)
        for cap, (_, count) in zip(caps, needed, strict=True):
            ok &= cap >= count
        for have, want in zip(supply, demand, strict=True):
            ok &= have >= want
        return bool(ok.any())
    if domain_of is None:
        return (all(int(cap.sum()) >= count for cap, (_, count) in zip(caps, needed, strict=True))
                and all(int(have.sum()) >= want for have, want in zip(supply, demand, strict=True)))
    valid = domain_of >= 0
    if not valid.any():
        return False
    index = np.where(valid, domain_of, 0)
    size = int(index.max()) + 1
    ok = np.ones(size, np.bool_)
    for cap, (_, count) in zip(caps, needed, strict=True):
        ok &= np.bincount(index, weights=np.where(valid, cap, 0), minlength=size) >= count
    for have, want in zip(supply, demand, strict=True):
        ok &= np.bincount(index, weights=np.where(valid, have, 0), minlength=size) >= want
    return bool(ok.any())


class HeteroPlacement:
    """Placement of heterogeneous gangs for a ``GangPlacer`` (its book, policy and per-shape filling)."""

    def __init__(self, gangs: GangPlacer) -> None:
        self.gangs = gangs
        self.book = gangs.book
        self.placer = gangs.placer

    # ------------------------------------------------------------------ the entry points
    def fits(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None, indices: Sequence[int],
             least: int) -> bool:
        """Would ``place`` succeed now? Placed on trial and rolled back, random state included."""
        rng = self.placer.rng.bit_generator
        state, score, placer_score = rng.state, self.gangs.last_score, self.placer.last_score
        done = self.place(spec, allowed, nodes, indices, least)
        if done is not None:
            for allocation in reversed(done):
                self.book.release(allocation.name)
        rng.state = state
        self.gangs.last_score, self.placer.last_score = score, placer_score
        return done is not None

    def blocking_group(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None,
                       indices: Sequence[int]) -> int | None:
        """For explanations: the group (position) whose members do not fit once the harder groups among
        ``indices`` are placed (on trial, rolled back); None when they all fit."""
        rng = self.placer.rng.bit_generator
        state, score, placer_score = rng.state, self.gangs.last_score, self.placer.last_score
        done: list[Allocation] = []
        blocked: int | None = None
        try:
            required = by_group(spec, indices)
            groups = spec.member_groups
            for position in sorted(required, key=lambda p: (hardness(groups[p].member), p)):
                requests = [spec.member_request(i) for i in required[position]]
                if self._fill_shape(requests, allowed, nodes, done) < len(requests):
                    blocked = position
                    break
        finally:
            self._release(done)
            rng.state = state
            self.gangs.last_score, self.placer.last_score = score, placer_score
        return blocked

    def place(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None, indices: Sequence[int],
              least: int) -> list[Allocation] | None:
        """Allocate ``indices[:least]`` all or nothing, then as many of the rest, in order, as fit."""
        if not indices or least > len(indices):
            return None
        least = max(least, 1)
        level = spec.topology  # a gang of groups has several members: even one of them keeps to a domain
        if level is not None and TopologyLevel.RACK <= level < TopologyLevel.CLUSTER:
            domain_of = self.gangs.zone_of if level == TopologyLevel.ZONE else self.gangs.rack_of
            return self._in_domains(spec, allowed, nodes, indices, least, domain_of)
        if level == TopologyLevel.NODE:
            return self._on_one_node(spec, allowed, nodes, indices, least)
        return self._within(spec, allowed, nodes, indices, least)

    # ------------------------------------------------------------------ inside one set of nodes
    def group_nodes(self, member: Request, allowed: BoolArray | None, nodes: BoolArray | None) -> BoolArray | None:
        """Where a member of this shape may go: a member without GPUs stays on the nodes of the GPU mask's
        region and on nodes without GPUs (see the module docstring)."""
        if member.wants_gpu or allowed is None:
            return nodes
        region: BoolArray = allowed.any(axis=1) | (self.book.gpu_count == 0)
        return region if nodes is None else nodes & region

    def _capacity(self, member: Request, allowed: BoolArray | None, nodes: BoolArray | None) -> IntArray:
        return member_capacity(self.book, member, allowed, self.group_nodes(member, allowed, nodes))

    def _within(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None, indices: Sequence[int],
                least: int) -> list[Allocation] | None:
        done: list[Allocation] = []
        try:
            required = by_group(spec, indices[:least])
            groups = spec.member_groups
            for position in sorted(required, key=lambda p: (hardness(groups[p].member), p)):
                requests = [spec.member_request(i) for i in required[position]]
                if self._fill_shape(requests, allowed, nodes, done) < len(requests):
                    self._release(done)
                    return None
            for _, members in runs(spec, indices[least:]):
                requests = [spec.member_request(i) for i in members]
                if self._fill_shape(requests, allowed, nodes, done, partial=True) < len(requests):
                    break
        except AllocationError:
            self._release(done)
            raise
        return done

    def _fill_shape(self, requests: list[Request], allowed: BoolArray | None, nodes: BoolArray | None,
                    done: list[Allocation], *, partial: bool = False) -> int:
        """Place ``requests`` (one shape) through the policy: all of them, or with ``partial`` as many as
        the capacity count allows; returns how many were placed (0 and nothing placed when not all fit and
        not ``partial``)."""
        capacity = self._capacity(requests[0], allowed, nodes)
        want = min(len(requests), int(np.minimum(capacity, len(requests)).sum()))
        if (want < len(requests) and not partial) or want == 0:
            return 0
        self.gangs.fill(requests[:want], GangScope(np.flatnonzero(capacity > 0), want, capacity), allowed, done)
        return want

    def _release(self, done: list[Allocation]) -> None:
        for allocation in reversed(done):
            self.book.release(allocation.name)
        done.clear()

    # ------------------------------------------------------------------ topology: one node, one rack or zone
    @staticmethod
    def _needs(spec: JobSpec, indices: Sequence[int]) -> dict[int, tuple[Request, int]]:
        """Per group position among ``indices``: its request and how many of its members."""
        groups = spec.member_groups
        return {p: (groups[p].member, len(members)) for p, members in sorted(by_group(spec, indices).items())}

    def _on_one_node(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None,
                     indices: Sequence[int], least: int) -> list[Allocation] | None:
        """Every member on one node: the nodes that could take the required members (each shape's count,
        and their CPU and memory added up), in the policy's order for the hardest member, tried in turn."""
        book = self.book
        needs = list(self._needs(spec, indices[:least]).values())
        ok = book.node_ok.copy() if nodes is None else book.node_ok & nodes
        for member, count in needs:
            ok &= self._capacity(member, allowed, nodes) >= count
        ok &= book.cpu_free >= sum(m.cpu_milli * c for m, c in needs)
        ok &= book.mem_free >= sum(m.memory_mib * c for m, c in needs)
        candidates = np.flatnonzero(ok)
        if candidates.size == 0:
            return None
        first = min((m for m, _ in needs), key=hardness)
        scores: IntArray | None = None
        if self.placer.policy.random_node:
            order = self.placer.rng.permutation(candidates)
        else:
            scores = self.placer.scores_within(first, candidates, allowed)
            if self.placer.policy.normalize:
                scores = normalize_scores(scores)
            order = candidates[np.lexsort((self.placer.tie_rank[candidates], -scores))]
        for node in order[:TRIALS]:
            one = np.zeros(book.size, np.bool_)
            one[int(node)] = True
            done = self._within(spec, allowed, one, indices, least)
            if done is not None:
                if scores is not None:
                    self.gangs.last_score = int(scores[candidates == node][0])
                return done
        return None

    def _in_domains(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None,
                    indices: Sequence[int], least: int, domain_of: IntArray) -> list[Allocation] | None:
        """Every member in one labelled rack (zone): first the domains whose capacity counts take every
        member, tightest first (least free GPU left over, as HiveD's buddy order keeps whole racks free),
        then the ones that take the required members, roomiest first; each tried in turn."""
        valid = domain_of >= 0  # nodes without a rack (zone) label belong to no rack (zone)
        if nodes is not None:
            valid = valid & nodes
        if not valid.any():
            return None
        size = int(domain_of.max()) + 1
        index = np.where(valid, domain_of, 0)
        required = self._needs(spec, indices[:least])
        whole = np.ones(size, np.bool_)
        enough = np.ones(size, np.bool_)
        cover = np.zeros(size, np.float64)
        for position, (member, count) in self._needs(spec, indices).items():
            capped = np.where(valid, np.minimum(self._capacity(member, allowed, nodes), count), 0)
            sums = np.bincount(index, weights=capped, minlength=size)
            whole &= sums >= count
            enough &= sums >= required.get(position, (member, 0))[1]
            cover += sums
        free = self.book.total_avail if allowed is None else np.where(allowed, self.book.gpu_avail, 0).sum(axis=1)
        spare = np.bincount(index, weights=np.where(valid, free, 0), minlength=size)
        first = np.flatnonzero(whole & enough)
        then = np.flatnonzero(enough & ~whole)
        order = [*first[np.lexsort((first, spare[first]))].tolist(), *then[np.lexsort((then, -cover[then]))].tolist()]
        for domain in order[:TRIALS]:
            done = self._within(spec, allowed, valid & (domain_of == domain), indices, least)
            if done is not None:
                return done
        return None
