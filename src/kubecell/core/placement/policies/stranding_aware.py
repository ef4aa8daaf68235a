"""kubecell's placement policy: fragmentation gradient descent on a host-aware measure, online.

Same step as FGD (score each candidate node, and each GPU for a share, by how much the expected
fragment shrinks, ``int(100 x sigmoid(delta / 1000))``, ties to the node rank), with three changes:

1. the measure (``stranding.HostAwareMeasure``) counts GPUs that the node's free CPU and memory cannot
   feed, and weights request types by the scarcity of the GPU models they may use;
2. the request-type distribution is learned online from the arrivals so far (``demand.DemandModel``),
   never read from the workload in advance;
3. the learned distribution replaces the one in use only when it has moved by more than
   ``refresh_distance`` (total variation), checked after 1, 2, 4, ... arrivals and then every
   ``check_every`` arrivals, because a new distribution invalidates every cached node score (on the
   Alibaba trace, with hundreds of distinct request shapes, a refresh costs about as much as a few
   hundred decisions).

Per decision the work is FGD's plus two broadcasts of host arrays, and the cache of node scores per
request shape stays valid between refreshes, so the cost stays within a small factor of FGD's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.core.placement.demand import DemandModel, DemandType, total_variation
from kubecell.core.placement.gpu_choice import whole_gpus
from kubecell.core.placement.policies.fgd import sigmoid_score
from kubecell.core.placement.policy import IntArray, Policy, score_cpu_milli
from kubecell.core.placement.stranding import HostAwareMeasure


class StrandingAwareFGD(Policy):
    """Host- and scarcity-aware FGD with an online demand estimate (the ``kubecell`` policy)."""

    name = "kubecell"
    summary = "FGD on a host-aware (CPU, memory, GPU-model scarcity) measure learned online"

    def __init__(
        self,
        demand: Sequence[DemandType] | None = None,
        *,
        stranding_weight: float = 0.5,
        half_life: float | None = 10_000.0,
        refresh_distance: float = 0.2,
        check_every: int = 1024,
        coverage: float = 0.95,
    ) -> None:
        """``demand=None`` learns the distribution online; a list fixes it (for experiments)."""
        super().__init__()
        if not 0 <= refresh_distance <= 1:
            raise InvalidInputError(
                f"refresh distance {refresh_distance} out of range", field="refresh_distance", accepted="0..1"
            )
        if check_every < 1:
            raise InvalidInputError(
                f"check interval {check_every} is not positive", field="check_every", accepted="an integer >= 1"
            )
        self.stranding_weight = stranding_weight
        self.refresh_distance = refresh_distance
        self.check_every = check_every
        self.model: DemandModel | None = None if demand is not None else DemandModel(
            half_life=half_life, coverage=coverage
        )
        self.demand: list[DemandType] = list(demand or ())
        self.refreshes = 0
        self._book: AllocationBook | None = None
        self.measure: HostAwareMeasure | None = None

    def attach(self, book: AllocationBook) -> None:
        self._book = book
        self._rebuild()

    def _rebuild(self) -> None:
        book = self._book
        if book is None:
            return
        model_gpus = [int(book.gpu_present[book.model_id == m].sum()) for m in range(len(book.model_names))]
        self.measure = HostAwareMeasure(
            self.demand, book.model_names, model_gpus, stranding_weight=self.stranding_weight
        )
        self.cache_epoch += 1

    def observe(self, request: Request) -> None:
        if self.model is None:
            return
        self.model.observe(request)
        n = self.model.arrivals
        # Check often while the estimate is young (powers of two), then at a fixed interval.
        if n & (n - 1) and n % self.check_every:
            return
        estimate = self.model.typical()
        if not self.demand or total_variation(estimate, self.demand) > self.refresh_distance:
            self.demand = estimate
            self.refreshes += 1
            self._rebuild()

    def _measure(self, book: AllocationBook) -> HostAwareMeasure:
        if self.measure is None or self._book is not book:
            self.attach(book)
        assert self.measure is not None
        return self.measure

    def gpu_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        """For a share request: score per (node, GPU slot); -1 where the GPU cannot take it."""
        measure = self._measure(book)
        fits = (book.gpu_avail[nodes] >= max(request.gpu_milli, 1)) & (
            book.gpu_mem_free[nodes] >= request.gpu_memory_mib
        )
        fits &= book.gpu_present[nodes] & book.gpu_healthy[nodes]
        if not measure.size:
            return np.where(fits, 50, -1).astype(np.int64)
        cpu = book.cpu_free[nodes]
        mem = book.mem_free[nodes]
        avail = book.gpu_avail[nodes]
        model = book.model_id[nodes]
        fit_count, small, total = measure.summary(avail)
        before = measure.fragment(*measure.host(cpu, mem, model), fit_count, small, total)
        ok_after, feeds_after = measure.host(cpu - score_cpu_milli(request), mem - request.memory_mib, model)
        cut = measure.milli
        after_avail = avail - request.gpu_milli
        was_fit = avail[:, :, None] >= cut
        now_fit = after_avail[:, :, None] >= cut
        fit_after = fit_count[:, None, :] - was_fit + now_fit
        small_after = (
            small[:, None, :]
            - np.where(was_fit, 0, avail[:, :, None])
            + np.where(now_fit, 0, after_avail[:, :, None])
        )
        after = measure.fragment(
            ok_after[:, None, :],
            feeds_after[:, None, :],
            fit_after,
            small_after,
            (total - request.gpu_milli)[:, None],
        )
        delta = (before[:, None, :] - after) @ measure.weight
        result: IntArray = np.where(fits, sigmoid_score(delta), -1)
        return result

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        if request.is_share:
            best: IntArray = self.gpu_scores(book, request, nodes).max(axis=1)
            return best
        measure = self._measure(book)
        if not measure.size:
            return np.full(len(nodes), 50, np.int64)
        cpu = book.cpu_free[nodes]
        mem = book.mem_free[nodes]
        model = book.model_id[nodes]
        fit_count, small, total = measure.summary(book.gpu_avail[nodes])
        before = measure.fragment(*measure.host(cpu, mem, model), fit_count, small, total)
        taken = request.gpu_count if request.is_whole else 0
        # Whole GPUs are taken from the fully free ones, which fit every type.
        after = measure.fragment(
            *measure.host(cpu - score_cpu_milli(request), mem - request.memory_mib, model),
            fit_count - taken * (measure.milli <= MILLI_PER_GPU),
            small,
            total - taken * MILLI_PER_GPU,
        )
        return sigmoid_score((before - after) @ measure.weight)

    def choose_gpus(
        self, book: AllocationBook, request: Request, node: int, rng: np.random.Generator
    ) -> tuple[int, ...]:
        if not request.wants_gpu:
            return ()
        if request.is_whole:
            return whole_gpus(book, request, node)
        scores = self.gpu_scores(book, request, np.array([node], np.int64))[0]
        return (int(np.argmax(scores)),)
