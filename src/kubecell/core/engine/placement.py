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
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import AllocationError
from kubecell.core.model import MILLI_PER_GPU, Allocation, Request, TopologyLevel
from kubecell.core.placement.filters import model_mask
from kubecell.core.placement.placer import Placer

BIG = 1 << 40


def group_ids(book: AllocationBook, level: TopologyLevel | None) -> IntArray | None:
    """Per GPU slot, its NVLink group or NUMA node for a member confined to one (None: no such level)."""
    if level == TopologyLevel.NVLINK:
        return book.nvlink_group
    if level == TopologyLevel.NUMA:
        return book.numa_group
    return None


def member_capacity(book: AllocationBook, member: Request, allowed: BoolArray | None,
                    nodes: BoolArray | None = None) -> IntArray:
    """Members each node can take now, within ``allowed`` GPUs and ``nodes`` (None: no restriction)."""
    cap: IntArray = np.where(book.node_ok, BIG, 0).astype(np.int64)
    if nodes is not None:
        cap = np.where(nodes, cap, 0)
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
        groups = group_ids(book, member.topology)
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


def empty_capacity(book: AllocationBook, member: Request) -> IntArray:
    """Members each node could take if it were empty (its capacity, whatever runs there now)."""
    cap: IntArray = np.full(book.size, BIG, np.int64)
    if member.cpu_milli:
        cap = np.minimum(cap, book.cpu_capacity // member.cpu_milli)
    if member.memory_mib:
        cap = np.minimum(cap, book.mem_capacity // member.memory_mib)
    if member.wants_gpu:
        present = book.gpu_present.sum(axis=1)
        per_gpu = 1 if member.is_whole else MILLI_PER_GPU // max(member.gpu_milli, 1)
        cap = np.minimum(cap, present // member.gpu_count * per_gpu)
        if member.gpu_models is not None:
            cap = np.where(model_mask(book, member), cap, 0)
    return cap


@dataclass(frozen=True, slots=True)
class GangScope:
    """What the PreFilter leaves: the candidate nodes, how many members to place, each node's capacity."""

    nodes: IntArray
    want: int
    capacity: IntArray
    one_node: bool = False


class GangPlacer:
    def __init__(self, book: AllocationBook, placer: Placer, rack_of: IntArray, zone_of: IntArray) -> None:
        self.book = book
        self.placer = placer
        self.rack_of = rack_of
        self.zone_of = zone_of
        self.last_score: int | None = None
        """The policy's score of the node the first member of the last ``place`` went to (None: no score
        was computed, see ``Placer.last_score``); for operators, never read by a decision."""

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
        return self.scope(spec, allowed, nodes, most, least) is not None

    # ------------------------------------------------------------------ Filter, Score, choose GPUs, commit
    def place(self, spec: JobSpec, allowed: BoolArray | None, nodes: BoolArray | None, most: int, least: int,
              *, first_index: int = 0) -> list[Allocation] | None:
        """Allocate ``least``..``most`` members (as many as fit) through the policy, or nothing (None)."""
        self.last_score = None
        if most == 1 and least <= 1:
            request = spec.member_request(first_index)
            placement = self.placer.decide(request, allowed, nodes)
            if placement is None:
                return None
            self.last_score = self.placer.last_score
            return [self.book.allocate(request, placement.node, placement.gpus)]
        scope = self.scope(spec, allowed, nodes, most, least)
        if scope is None:
            return None
        requests = [spec.member_request(first_index + i) for i in range(scope.want)]
        done: list[Allocation] = []
        try:
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
                for request in requests:
                    placement = self.placer.decide(request, allowed, candidates)
                    if placement is None:
                        raise AllocationError(f"{request.name}: no node takes the member the capacity count promised")
                    if not done:
                        self.last_score = self.placer.last_score
                    done.append(self.book.allocate(request, placement.node, placement.gpus))
        except AllocationError:
            for allocation in reversed(done):
                self.book.release(allocation.name)
            raise
        return done

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
