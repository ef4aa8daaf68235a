"""Gang placement through the placement framework: every member is placed by the configured policy.

Tenancy and topology speak to placement as filters: an ``allowed`` GPU mask (the VC's cells, capacity
nobody has bound) and a node mask (no reserved nodes, a rack, and always within the nodes the job may
use, ``JobSpec.nodes``: ``Session.filters`` builds every mask handed to the placer, so the PreFilter's
capacity count, the domain choice and every member's Filter see that restriction). Placing a gang then
takes three steps:

1. *PreFilter* (gang completeness): how many members each node can take now inside the filters; if the
   gang's minimum cannot fit, nothing is touched. A topology constraint picks the domain first: the
   tightest rack (or zone) that takes the whole gang, else the one that takes the most (bin-packing
   across domains, as HiveD's buddy allocation keeps whole racks free); a one-node gang keeps the nodes
   that take the most members.
2. *Filter, Score, choose GPUs*, member by member: the policy scores the feasible nodes and picks the
   GPUs, exactly as ``Placer.decide`` does for one request, so a single-member job lands where the
   packing experiment would put it.
3. *Commit*: all members are allocated, or, if any allocation fails, every member already placed is
   released and the error re-raised: a gang is never left half placed.

A member lowers the capacity of the node it lands on by exactly one member and changes no other node,
so when the minimum fits, member-by-member placement always succeeds, and a victim search may ask
``fits`` (capacity only) instead of placing. For policies whose node score depends only on the node
(``node_local``), the members of one gang are placed with a heap of node scores in which only the node
that received a member is rescored; nodes in identical states score identically, so rescoring is
memoized by node state, and a 1,000-member gang costs about one policy call per distinct node state.

A heterogeneous gang (members of several shapes, ``JobSpec.groups``) has no exact capacity count: it is
placed group by group and, for ``fits``, on trial with rollback (``hetero``). The members a gang adds
are given by its fill order (``JobSpec.fill_order``), or by growth as the members it is missing.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.capacity import BIG, empty_capacity, group_ids, member_capacity
from kubecell.core.engine.hetero import GangScope, HeteroPlacement
from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import AllocationError
from kubecell.core.model import Allocation, Request, TopologyLevel
from kubecell.core.placement.placer import Placer

__all__ = ["BIG", "GangPlacer", "GangScope", "empty_capacity", "group_ids", "member_capacity"]


class GangPlacer:
    def __init__(self, book: AllocationBook, placer: Placer, rack_of: IntArray, zone_of: IntArray) -> None:
        self.book = book
        self.placer = placer
        self.rack_of = rack_of
        self.zone_of = zone_of
        self.last_score: int | None = None
        """The policy's score of the node the first member of the last ``place`` went to (None: no score
        was computed, see ``Placer.last_score``); for operators, never read by a decision."""
        self.hetero = HeteroPlacement(self)

    # ------------------------------------------------------------------ PreFilter
    def scope(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None, most: int,
              least: int) -> GangScope | None:
        """Where ``least``..``most`` members of ``spec`` could go now, or None if fewer than ``least`` fit."""
        if most <= 0 or least > most:
            return None
        member = spec.member_request(0)
        cap = member_capacity(self.book, member, allowed, nodes)
        if int(np.minimum(cap, most).sum()) < least:
            return None
        level = spec.topology
        if most > 1 and level is not None and TopologyLevel.RACK <= level < TopologyLevel.CLUSTER:
            domain_of = self.zone_of if level == TopologyLevel.ZONE else self.rack_of
            return self._in_domain(cap, domain_of, most, least, member, allowed)
        if most > 1 and level == TopologyLevel.NODE:
            take = np.minimum(cap, most)
            best = int(take.max(initial=0))
            if best < least:
                return None
            return GangScope(np.flatnonzero(take == best), best, cap, one_node=True)
        return GangScope(np.flatnonzero(cap > 0), int(min(most, np.minimum(cap, most).sum())), cap)

    def _in_domain(self, cap: IntArray, domain_of: IntArray, most: int, least: int, member: Request,
                   allowed: BoolArray | None) -> GangScope | None:
        valid = domain_of >= 0  # nodes without a rack (zone) label belong to no rack (zone)
        if not valid.any():
            return None
        size = int(domain_of.max()) + 1
        index = np.where(valid, domain_of, 0)
        capped = np.where(valid, np.minimum(cap, most), 0)
        domain_cap = np.bincount(index, weights=capped, minlength=size)
        free = self.book.total_avail if allowed is None else np.where(allowed, self.book.gpu_avail, 0).sum(axis=1)
        domain_free = np.bincount(index, weights=np.where(valid, free, 0), minlength=size)
        whole = np.flatnonzero(domain_cap >= most)
        if whole.size:
            spare = domain_free[whole] - most * member.total_gpu_milli
            domain = int(whole[np.lexsort((whole, spare))[0]])
            want = most
        else:
            ok = np.flatnonzero(domain_cap >= least)
            if ok.size == 0:
                return None
            domain = int(ok[int(np.argmax(domain_cap[ok]))])
            want = int(domain_cap[domain])
        return GangScope(np.flatnonzero((domain_of == domain) & (cap > 0)), want, cap)

    def fits(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None, most: int,
             least: int) -> bool:
        """Would ``place`` allocate at least ``least`` members now? For one shape the capacity count is
        exact; a heterogeneous gang is placed on trial and rolled back (``HeteroPlacement.fits``)."""
        if spec.heterogeneous:
            return self.hetero.fits(spec, allowed, nodes, spec.fill_order()[:most], least)
        return self.scope(spec, allowed, nodes, most, least) is not None

    # ------------------------------------------------------------------ Filter, Score, choose GPUs, commit
    def place(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None, most: int, least: int,
              *, indices: Sequence[int] | None = None) -> list[Allocation] | None:
        """Allocate ``least``..``most`` members (as many as fit) through the policy, or nothing (None).
        ``indices``: the members to add, in order (default: the fill order; growth passes the missing ones)."""
        self.last_score = None
        order = spec.fill_order() if indices is None else indices
        if spec.heterogeneous:
            return self.hetero.place(spec, allowed, nodes, order[:most], least)
        if most == 1 and least <= 1:
            request = spec.member_request(order[0])
            placement = self.placer.decide(request, allowed, nodes)
            if placement is None:
                return None
            self.last_score = self.placer.last_score
            return [self.book.allocate(request, placement.node, placement.gpus)]
        scope = self.scope(spec, allowed, nodes, most, least)
        if scope is None:
            return None
        requests = [spec.member_request(order[i]) for i in range(scope.want)]
        done: list[Allocation] = []
        try:
            self.fill(requests, scope, allowed, done)
        except AllocationError:
            for allocation in reversed(done):
                self.book.release(allocation.name)
            raise
        return done

    def fill(self, requests: list[Request], scope: GangScope, allowed: BoolArray | None,
             done: list[Allocation]) -> None:
        """Allocate ``requests`` (one shape) inside the scope, appending to ``done``; the caller rolls back."""
        if scope.one_node:
            node = self.placer.select(requests[0], scope.nodes, allowed)
            self.last_score = self.placer.last_score
            row = allowed[node] if allowed is not None else None
            for request in requests:
                gpus = self.placer.policy.choose_gpus(self.book, request, node, self.placer.rng, row)
                done.append(self.book.allocate(request, node, gpus))
        elif self._incremental():
            self._fill_by_heap(requests, scope, allowed, done)
        else:
            candidates = np.zeros(self.book.size, np.bool_)
            candidates[scope.nodes] = True
            first = not done
            for request in requests:
                placement = self.placer.decide(request, allowed, candidates)
                if placement is None:
                    raise AllocationError(f"{request.name}: no node takes the member the capacity count promised")
                if first:
                    self.last_score = self.placer.last_score
                    first = False
                done.append(self.book.allocate(request, placement.node, placement.gpus))

    def _incremental(self) -> bool:
        policy = self.placer.policy
        return policy.node_local and not policy.normalize and not policy.random_node

    def _fill_by_heap(self, requests: list[Request], scope: GangScope, allowed: BoolArray | None,
                      done: list[Allocation]) -> None:
        """Member by member, the best node by (score, rank); only the node that took a member is rescored."""
        book, placer = self.book, self.placer
        capacity = scope.capacity.copy()
        first = requests[0]
        scores = placer.scores_within(first, scope.nodes, allowed)
        ranks = placer.tie_rank[scope.nodes]
        heap = [(-int(s), int(r), int(n), 0) for s, r, n in zip(scores, ranks, scope.nodes, strict=True)]
        heapq.heapify(heap)
        version: dict[int, int] = {}
        key_of: dict[int, tuple[object, ...]] = {}
        gpus_by_state: dict[tuple[object, ...], tuple[int, ...]] = {}
        score_by_state: dict[tuple[object, ...], int] = {}
        for request in requests:
            while True:
                negative, rank, node, stamp = heapq.heappop(heap)
                if version.get(node, 0) == stamp:
                    break
            if not done:
                self.last_score = -negative
            key = key_of.get(node) or placer.state_key(node, allowed)
            gpus = gpus_by_state.get(key)
            if gpus is None:
                row = allowed[node] if allowed is not None else None
                gpus = gpus_by_state[key] = placer.policy.choose_gpus(book, request, node, placer.rng, row)
            done.append(book.allocate(request, node, gpus))
            capacity[node] -= 1
            version[node] = version.get(node, 0) + 1
            if capacity[node] <= 0:
                continue
            key = key_of[node] = placer.state_key(node, allowed)
            score = score_by_state.get(key)
            if score is None:
                one = np.array([node], np.int64)
                if allowed is not None and (book.gpu_present[node] & ~allowed[node]).any():
                    value = placer.policy.score_within(book, first, one, allowed[one])
                else:
                    value = placer.policy.score(book, first, one)
                score = score_by_state[key] = int(value[0])
            heapq.heappush(heap, (-score, rank, node, version[node]))
