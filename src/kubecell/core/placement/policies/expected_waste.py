"""kubecell's placement policy: place where the expected never-allocated GPU share grows least.

The step is FGD's (Weng et al., ATC'23): score each candidate node, and each GPU of it for a share,
by how much a measure of lost capacity shrinks, ``int(100 x sigmoid(delta / 1000))``, ties to the node
rank. The measure is ``waste.ExpectedWaste``; everything it needs is learned online:

1. the request-type distribution from the arrivals so far (``demand.DemandModel``), never read from
   the workload in advance; it replaces the one in use only when it has moved by more than
   ``refresh_distance`` (total variation), checked after 1, 2, 4, ... arrivals and then every
   ``check_every``, because a new distribution invalidates every cached node score;
2. what becomes of each free GPU share (``gap_fate.GapFateModel``) from the fills the cluster has
   seen, re-solved every ``relearn_every`` arrivals (also a cache invalidation).

Per decision the work is FGD's (a few array operations over the candidate nodes, GPUs and request
types) plus the host terms; the placer's cache of node scores per request shape stays valid between
refreshes, so the cost stays within a small factor of FGD's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.core.placement.demand import DemandModel, DemandType, total_variation
from kubecell.core.placement.gap_fate import GapFateModel, static_waste_table
from kubecell.core.placement.policies.fgd import sigmoid_score
from kubecell.core.placement.policy import FloatArray, GpuScoringPolicy, IntArray, score_cpu_milli
from kubecell.core.placement.waste import ExpectedWaste


def prior_chain(demand: Sequence[DemandType]) -> tuple[list[int], list[float]]:
    """Sizes and arrival rates of the GPU request types, as the prior chain sees them: a share fills
    its milli, a request of k whole GPUs fills k fully free GPUs (size 1000, k times the rate)."""
    sizes: list[int] = []
    rates: list[float] = []
    for t in demand:
        if t.shape.gpu_count == 0:
            continue
        sizes.append(t.shape.gpu_milli if t.shape.gpu_count == 1 else MILLI_PER_GPU)
        rates.append(t.share * t.shape.gpu_count)
    total = sum(rates)
    return sizes, [r / total for r in rates] if total > 0 else rates


class ExpectedWastePolicy(GpuScoringPolicy):
    """The ``kubecell`` policy; see the module docstring."""

    name = "kubecell"
    summary = "least growth of expected never-allocated GPU share (learned gap fates, host stranding), online"

    def __init__(
        self,
        demand: Sequence[DemandType] | None = None,
        *,
        half_life: float | None = 10_000.0,
        refresh_distance: float = 0.2,
        check_every: int = 1024,
        coverage: float = 0.95,
        learn_fates: bool = True,
        fate_half_life: float | None = 10_000.0,
        prior_strength: float = 50.0,
        prior_hazard: float = 0.01,
        relearn_every: int = 1024,
        host_blend: float = 0.5,
    ) -> None:
        """``demand=None`` learns the distribution online; a list fixes it (for experiments and tests).
        ``learn_fates=False`` keeps the prior waste table (no learning from the cluster)."""
        super().__init__()
        if not 0 <= refresh_distance <= 1:
            raise InvalidInputError(
                f"refresh distance {refresh_distance} out of range", field="refresh_distance", accepted="0..1"
            )
        for value, field in ((check_every, "check_every"), (relearn_every, "relearn_every")):
            if value < 1:
                raise InvalidInputError(
                    f"{field.replace('_', ' ')} {value} is not positive", field=field, accepted="an integer >= 1"
                )
        if not prior_hazard > 0:
            raise InvalidInputError(
                f"prior hazard {prior_hazard} is not positive", field="prior_hazard", accepted="a number > 0"
            )
        if not 0 <= host_blend <= 1:
            raise InvalidInputError(f"host blend {host_blend} out of range", field="host_blend", accepted="0..1")
        self.refresh_distance = refresh_distance
        self.check_every = check_every
        self.relearn_every = relearn_every
        self.prior_hazard = prior_hazard
        self.host_blend = host_blend
        self.demand_model: DemandModel | None = None if demand is not None else DemandModel(
            half_life=half_life, coverage=coverage
        )
        self.demand: list[DemandType] = list(demand or ())
        self.fates: GapFateModel | None = (
            GapFateModel(half_life=fate_half_life, prior_strength=prior_strength) if learn_fates else None
        )
        self.refreshes = 0
        self.relearns = 0
        self.table: FloatArray = np.arange(MILLI_PER_GPU + 1, dtype=np.float64)
        self.measure: ExpectedWaste | None = None
        self._book: AllocationBook | None = None
        self._prior_sizes: list[int] = []
        self._prior_rates: list[float] = []
        self._prior_table: FloatArray = self.table

    # ------------------------------------------------------------------ learning
    def attach(self, book: AllocationBook) -> None:
        self._book = book
        self._rebuild()

    def _rebuild(self) -> None:
        """New demand estimate: new prior, new table, new measure."""
        self._prior_sizes, self._prior_rates = prior_chain(self.demand)
        self._prior_table = static_waste_table(self._prior_sizes, self._prior_rates, self.prior_hazard)
        self._relearn()

    def _relearn(self) -> None:
        book = self._book
        if book is None:
            return
        if self.fates is not None and self.fates.arrivals:
            self.table = self.fates.table(
                self._prior_sizes, self._prior_rates, self.prior_hazard, self._horizon(book),
                float(self._prior_table[MILLI_PER_GPU]),
            )
            self.relearns += 1
        else:
            self.table = self._prior_table
        model_gpus = [int(book.gpu_present[book.model_id == m].sum()) for m in range(len(book.model_names))]
        self.measure = ExpectedWaste(self.demand, book.model_names, model_gpus, self.table, host_blend=self.host_blend)
        self.cache_epoch += 1

    def _horizon(self, book: AllocationBook) -> float:
        """Arrivals the free capacity can still absorb at the demand's mean GPU request per arrival."""
        mean = sum(t.share * t.shape.gpu_milli * t.shape.gpu_count for t in self.demand)
        free = float(book.gpu_avail.sum())
        return free / mean if mean > 0 else 1.0

    def observe(self, request: Request, count: int = 1) -> None:
        """``count`` arrivals of ``request`` at once (a gang's members). The book cannot change and no
        decision is made between them, so they are counted together and the estimate is checked once,
        after them, if a check fell due among them (for one arrival: exactly the one-by-one schedule)."""
        if count <= 0:
            return
        attached = self.fates is not None and self._book is not None
        demand_due, relearn_due = self._checks_due(count, attached)
        if self.fates is not None and self._book is not None:
            self.fates.sync(self._book)
            self.fates.tick(count)
        if self.demand_model is not None:
            self.demand_model.observe(request, count)
        refreshed = False
        if demand_due:
            estimate = self.demand_model.typical() if self.demand_model is not None else []
            if not self.demand or total_variation(estimate, self.demand) > self.refresh_distance:
                self.demand = estimate
                self.refreshes += 1
                self._rebuild()
                refreshed = True
        if relearn_due and not refreshed:
            self._relearn()

    def _checks_due(self, count: int, attached: bool) -> tuple[bool, bool]:
        """Do a demand check and a fate relearn fall due within the next ``count`` arrivals? The demand is
        checked often while the estimate is young (after 1, 2, 4, ... arrivals), then every
        ``check_every``; the fates are relearned every ``relearn_every`` arrivals they count."""
        demand_due = relearn_due = False
        if self.demand_model is not None:
            n = self.demand_model.arrivals
            power = 1 << n.bit_length()  # the next power of two above n
            multiple = (n // self.check_every + 1) * self.check_every
            demand_due = min(power, multiple) <= n + count
        if self.fates is not None:
            n = self.fates.arrivals
            if attached:
                relearn_due = (n // self.relearn_every + 1) * self.relearn_every <= n + count
            else:
                relearn_due = n % self.relearn_every == 0  # without a book the count does not move
        return demand_due, relearn_due

    def _measure(self, book: AllocationBook) -> ExpectedWaste:
        if self.measure is None or self._book is not book:
            self.attach(book)
        assert self.measure is not None
        return self.measure

    # ------------------------------------------------------------------ scoring
    def gpu_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        """For a share request: score per (node, GPU slot); -1 where the GPU cannot take it."""
        measure = self._measure(book)
        fits = book.gpu_fits(nodes, request)
        if not measure.size:
            return np.where(fits, 50, -1).astype(np.int64)
        cpu, memory, model = book.cpu_free[nodes], book.mem_free[nodes], book.model_id[nodes]
        avail = book.gpu_avail[nodes]
        per_gpu = measure.gap_waste(avail)
        gap, total, fit_count = per_gpu.sum(axis=1), avail.sum(axis=1), measure.fit_count(avail)
        before = measure.waste(cpu, memory, model, fit_count, gap, total)
        # After the share lands on one GPU only that GPU's free amount changes; evaluate the (node, GPU)
        # pairs that can take it, which on a busy cluster are a small part of all slots.
        row, slot = np.nonzero(fits)
        free_before = avail[row, slot]
        free_after = free_before - request.gpu_milli
        after = measure.waste(
            cpu[row] - score_cpu_milli(request),
            memory[row] - request.memory_mib,
            model[row],
            fit_count[row] - (free_before[:, None] >= measure.milli) + (free_after[:, None] >= measure.milli),
            gap[row] - per_gpu[row, slot] + measure.gap_waste(free_after),
            total[row] - request.gpu_milli,
        )
        result: IntArray = np.full(avail.shape, -1, np.int64)
        result[row, slot] = sigmoid_score(before[row] - after)
        return result

    def node_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        measure = self._measure(book)
        if not measure.size:
            return np.full(len(nodes), 50, np.int64)
        cpu, memory, model = book.cpu_free[nodes], book.mem_free[nodes], book.model_id[nodes]
        avail = book.gpu_avail[nodes]
        gap, total, fit_count = measure.gap_waste(avail).sum(axis=1), avail.sum(axis=1), measure.fit_count(avail)
        before = measure.waste(cpu, memory, model, fit_count, gap, total)
        # Whole GPUs come from the fully free ones, which fit every type and have W(1000) expected waste.
        taken = request.gpu_count if request.is_whole else 0
        after = measure.waste(
            cpu - score_cpu_milli(request),
            memory - request.memory_mib,
            model,
            fit_count - taken * (measure.milli <= MILLI_PER_GPU),
            gap - taken * measure.table[MILLI_PER_GPU],
            total - taken * MILLI_PER_GPU,
        )
        return sigmoid_score(before - after)
