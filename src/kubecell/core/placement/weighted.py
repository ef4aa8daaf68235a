"""Several node scores combined with weights, and one GPU choice: the Score and choose-GPU extension points
used together, as kube-scheduler's framework sums its score plugins' normalised scores times their weights.

Why: one packing score cannot say everything a placement should weigh. Fragmentation (``kubecell``, FGD)
and a second concern (spread for failure domains, or a measured cost such as the interference of sharers)
pull in different directions, and an operator has to be able to say how much each counts without writing a
new policy. A part that normalises its scores (kube-scheduler's ``NormalizeScore``: min-max over the
candidates) is normalised before it is weighed, so each part speaks on the same 0..100 scale.

GPU choice: a share goes to one GPU of the chosen node. Where every part scores GPUs
(:class:`~kubecell.core.placement.policy.GpuScoringPolicy`), the GPU is the one with the best weighted sum of
the parts' GPU scores (a GPU any part refuses is refused), so node choice and GPU choice follow one measure as
they do inside each part. Otherwise the first part chooses, as it would alone.

A random part has no score to weigh and is refused, as are weights that are not finite numbers above zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request
from kubecell.core.placement.placer import normalize_scores
from kubecell.core.placement.policy import FloatArray, GpuScoringPolicy, IntArray, Policy, truncate


class WeightedPolicy(Policy):
    """The weighted mean of its parts' node scores; GPUs chosen by the weighted GPU scores (see the module)."""

    summary = "weighted mean of several policies' node scores (kube-scheduler's score plugins with weights)"

    def __init__(self, parts: Sequence[tuple[Policy, float]], name: str = "weighted") -> None:
        super().__init__()
        if not parts:
            raise InvalidInputError("a weighted policy needs at least one part", field="policy",
                                    accepted="NAME:WEIGHT+NAME:WEIGHT...")
        for policy, weight in parts:
            if policy.random_node:
                raise InvalidInputError(f"{policy.name!r} picks a node at random and has no score to weigh",
                                        field="policy", accepted="a scoring policy")
            if not (isinstance(weight, int | float) and math.isfinite(weight) and weight > 0):
                raise InvalidInputError(f"weight {weight!r} of {policy.name!r}", field="policy",
                                        accepted="a finite number above 0")
        self.parts = [(policy, float(weight)) for policy, weight in parts]
        self.total = sum(weight for _, weight in self.parts)
        self.name = name  # type: ignore[misc]  # an instance's own name: the spec it was built from
        # A normalised part's score depends on the other candidates, so no score of the mix is node-local then.
        self.node_local = all(p.node_local and not p.normalize for p, _ in self.parts)  # type: ignore[misc]
        self.gpu_scored = all(isinstance(p, GpuScoringPolicy) for p, _ in self.parts)

    @property
    def cache_epoch(self) -> int:
        """Changes when any part's parameters change (a part that learns online), so cached mixes are dropped."""
        return sum(p.cache_epoch for p, _ in self.parts)

    @cache_epoch.setter
    def cache_epoch(self, value: int) -> None:
        """``Policy.__init__`` sets it; the mix has no parameters of its own."""

    def attach(self, book: AllocationBook) -> None:
        for policy, _ in self.parts:
            policy.attach(book)

    def observe(self, request: Request, count: int = 1) -> None:
        for policy, _ in self.parts:
            policy.observe(request, count)

    def _mix(self, each: Sequence[IntArray]) -> IntArray:
        total: FloatArray = np.zeros(each[0].shape, np.float64)
        for (policy, weight), scores in zip(self.parts, each, strict=True):
            total += weight * (normalize_scores(scores) if policy.normalize and scores.size else scores)
        return truncate(total / self.total)

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        return self._mix([policy.score(book, request, nodes) for policy, _ in self.parts])

    def score_within(self, book: AllocationBook, request: Request, nodes: IntArray, allowed: BoolArray) -> IntArray:
        return self._mix([policy.score_within(book, request, nodes, allowed) for policy, _ in self.parts])

    def choose_gpus(
        self, book: AllocationBook, request: Request, node: int, rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> tuple[int, ...]:
        if not (self.gpu_scored and request.wants_gpu and request.is_share):
            return self.parts[0][0].choose_gpus(book, request, node, rng, allowed)
        row = np.array([node], np.int64)
        each = [policy.gpu_scores(book, request, row)[0] for policy, _ in self.parts
                if isinstance(policy, GpuScoringPolicy)]
        refused = np.any([scores < 0 for scores in each], axis=0)
        if allowed is not None:
            refused |= ~allowed
        mixed: FloatArray = sum((weight * scores for (_, weight), scores in zip(self.parts, each, strict=True)),
                                np.zeros(each[0].shape, np.float64))
        return (int(np.argmax(np.where(refused, -1.0, mixed))),)
