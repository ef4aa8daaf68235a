"""One placement decision: Filter -> Score -> select host -> choose GPUs.

The placer never changes the book; it returns a ``Placement`` that the caller commits (the simulator
at once, the Kubernetes driver after persisting the decision). Ties between equal scores go to the
node with the smallest *rank*: by default the node-name order, which is what a deterministic
kube-scheduler tie-break does; experiments pass a seeded random permutation instead.

Scores of ``node_local`` policies are cached per request shape and recomputed only for nodes whose
version changed since the shape was last scored, so a decision costs O(changed nodes) policy work
plus O(nodes) vectorized filtering. A node-local score is a function of the node's state, and states
recur (an empty 8-GPU node, a node with one 4-GPU job ...), so the few nodes rescored per decision are
first looked up by state: a hit costs a dictionary lookup instead of a policy call.

``place`` is one arrival (the policy observes it, then decides); ``decide`` is the decision alone, for
drivers that observe arrivals themselves and retry waiting requests (the engine). Both take the same
path, so a request placed by the packing experiment and by the engine lands on the same node.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.model import Request, RequestShape
from kubecell.core.placement.filters import feasible_mask
from kubecell.core.placement.policy import MAX_NODE_SCORE, Policy


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request should go: a node index and its GPU indices."""

    node: int
    gpus: tuple[int, ...]


@dataclass(slots=True)
class _ScoreCacheEntry:
    clock: int
    known: np.ndarray
    scores: IntArray
    by_state: dict[tuple[object, ...], int]


STATE_LOOKUP_MAX_NODES = 64
"""Rescore up to this many nodes by state lookup; more at once are scored in one vectorized call."""
STATE_MEMO_SIZE = 1 << 16
"""Node states remembered per request shape (forgotten all at once when full)."""


def normalize_scores(scores: IntArray) -> IntArray:
    """Min-max normalise to 0..100 with integer arithmetic (kube-scheduler plugins' NormalizeScore)."""
    highest = int(scores.max())
    lowest = int(scores.min())
    if highest == lowest:
        return np.zeros_like(scores)
    normalized: IntArray = (scores - lowest) * MAX_NODE_SCORE // (highest - lowest)
    return normalized


class Placer:
    """Places requests on a book with one policy."""

    def __init__(
        self,
        book: AllocationBook,
        policy: Policy,
        *,
        rng: np.random.Generator | None = None,
        tie_rank: IntArray | None = None,
        cache_size: int = 512,
    ) -> None:
        self.book = book
        self.policy = policy
        self.rng = rng if rng is not None else np.random.default_rng(0)
        if tie_rank is None:
            order = sorted(range(book.size), key=lambda i: book.nodes[i].name)
            tie_rank = np.empty(book.size, np.int64)
            tie_rank[np.array(order, np.int64)] = np.arange(book.size)
        if len(tie_rank) != book.size:
            raise ValueError("tie_rank must have one entry per node")
        self.tie_rank = np.asarray(tie_rank, np.int64)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[int, RequestShape], _ScoreCacheEntry] = OrderedDict()
        self._hardware: IntArray | None = None
        self.last_score: int | None = None
        """The score of the node the last ``select`` chose (what decided it, normalised where the policy
        normalises); None when no score was computed (a single candidate, a random policy). Read by the
        engine to tell operators how good a placement looked, never by any decision."""
        policy.attach(book)

    def feasible(self, request: Request, allowed: BoolArray | None = None, nodes: BoolArray | None = None) -> IntArray:
        """Indices of the nodes where ``request`` fits now (within the ``allowed`` GPUs and ``nodes``)."""
        return np.flatnonzero(feasible_mask(self.book, request, allowed, nodes))

    def scores(self, request: Request, nodes: IntArray) -> IntArray:
        """Raw policy scores for ``nodes`` (cached for node-local policies)."""
        if not self.policy.node_local:
            return self.policy.score(self.book, request, nodes)
        key = (self.policy.cache_epoch, request.shape)
        entry = self._cache.get(key)
        if entry is None:
            entry = _ScoreCacheEntry(
                self.book.clock, np.zeros(self.book.size, np.bool_), np.zeros(self.book.size, np.int64), {}
            )
            self._cache[key] = entry
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
            if self.book.clock != entry.clock:
                entry.known[self.book.changed_since(entry.clock)] = False
                entry.clock = self.book.clock
        missing = nodes[~entry.known[nodes]]
        if missing.size:
            entry.scores[missing] = self._score_changed(request, missing, entry.by_state)
            entry.known[missing] = True
        result: IntArray = entry.scores[nodes]
        return result

    def _score_changed(self, request: Request, nodes: IntArray, by_state: dict[tuple[object, ...], int]) -> IntArray:
        if nodes.size > STATE_LOOKUP_MAX_NODES:
            return self.policy.score(self.book, request, nodes)
        keys = [self.state_key(int(node)) for node in nodes]
        values = np.empty(nodes.size, np.int64)
        todo: list[int] = []
        for i, key in enumerate(keys):
            value = by_state.get(key)
            if value is None:
                todo.append(i)
            else:
                values[i] = value
        if todo:
            if len(by_state) + len(todo) > STATE_MEMO_SIZE:
                by_state.clear()
            computed = self.policy.score(self.book, request, nodes[todo])
            values[todo] = computed
            for i, value in zip(todo, computed.tolist(), strict=True):
                by_state[keys[i]] = value
        return values

    def state_key(self, node: int, allowed: BoolArray | None = None) -> tuple[object, ...]:
        """Everything a node-local policy may read about a node (and the GPUs it may use there): equal
        keys, equal scores and equal GPU choices."""
        book = self.book
        if self._hardware is None:
            rows = np.column_stack([book.model_id, book.cpu_capacity, book.mem_capacity, book.gpu_mem_capacity,
                                    book.gpu_present, book.nvlink_group, book.numa_group]).astype(np.int64)
            kinds: dict[bytes, int] = {}  # one id per distinct machine (static resources and layout)
            self._hardware = np.array([kinds.setdefault(row.tobytes(), len(kinds)) for row in rows], np.int64)
        return (int(self._hardware[node]), int(book.cpu_free[node]), int(book.mem_free[node]),
                book.gpu_milli_free[node].tobytes(), book.gpu_mem_free[node].tobytes(),
                book.gpu_healthy[node].tobytes(), bool(book.node_ok[node]), book.affinity[node].tobytes(),
                allowed[node].tobytes() if allowed is not None else None)

    def scores_within(self, request: Request, nodes: IntArray, allowed: BoolArray | None) -> IntArray:
        """Raw scores when the request may take only the ``allowed`` GPUs: cached scores where a node's
        every GPU is allowed, the policy's ``score_within`` where only some are."""
        scores = self.scores(request, nodes)
        if allowed is None or not request.wants_gpu or not nodes.size:
            return scores
        partial = (self.book.gpu_present[nodes] & ~allowed[nodes]).any(axis=1)
        if partial.any():
            rows = nodes[partial]
            scores = scores.copy()
            scores[partial] = self.policy.score_within(self.book, request, rows, allowed[rows])
        return scores

    def select(self, request: Request, nodes: IntArray, allowed: BoolArray | None = None) -> int:
        """The chosen node among the feasible ``nodes`` (non-empty)."""
        self.last_score = None
        if self.policy.random_node:
            return int(nodes[int(self.rng.integers(nodes.size))])
        if nodes.size == 1:
            return int(nodes[0])
        scores = self.scores_within(request, nodes, allowed)
        if self.policy.normalize:
            scores = normalize_scores(scores)
        top = scores.max()
        self.last_score = int(top)
        best = nodes[scores == top]
        return int(best[int(np.argmin(self.tie_rank[best]))])

    def decide(self, request: Request, allowed: BoolArray | None = None, nodes: BoolArray | None = None
               ) -> Placement | None:
        """Where ``request`` goes (within the ``allowed`` GPUs and ``nodes``), or None if it fits nowhere
        now. The policy does not observe the request here."""
        candidates = self.feasible(request, allowed, nodes)
        if candidates.size == 0:
            return None
        node = self.select(request, candidates, allowed)
        row = allowed[node] if allowed is not None else None
        gpus = self.policy.choose_gpus(self.book, request, node, self.rng, row)
        return Placement(node, gpus)

    def place(self, request: Request) -> Placement | None:
        """One arrival: the policy observes ``request``, then decides where it goes (None: nowhere now)."""
        self.policy.observe(request)
        return self.decide(request)

    def place_and_commit(self, request: Request) -> Placement | None:
        placement = self.place(request)
        if placement is not None:
            self.book.allocate(request, placement.node, placement.gpus)
        return placement
