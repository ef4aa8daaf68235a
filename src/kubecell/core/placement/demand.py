"""An online estimate of what will arrive next, learned from what has arrived so far.

FGD weighs fragmentation by a typical-pod distribution computed from the whole workload in advance,
which a scheduler never has. The demand model counts the request shapes it has seen, forgets old
ones with an exponential half-life (so a workload that changes over the day moves the estimate), and
reports the most frequent shapes covering 95 % of the recent arrivals, the same rule FGD uses for its
offline list. Host memory is not part of a shape (it varies too finely to group by), but each shape
carries the mean memory of its arrivals, so that policies can reason about memory stranding.

Decay is applied lazily: instead of multiplying every count at each arrival, the increment grows by
``2 ** (1 / half_life)`` and all weights are rescaled when the increment gets large. An arrival thus
costs O(1); building the typical list costs O(shapes log shapes) and happens only when asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request
from kubecell.core.placement.frag import PodShape

_RESCALE_AT = 1e100
LOOPED_ARRIVALS = 1024
"""Arrivals of one shape at once added step by step (as always); more are added in closed form."""


@dataclass(frozen=True, slots=True)
class DemandType:
    """A request shape, its share of recent arrivals (shares over a list sum to 1) and the mean host
    memory its arrivals asked for."""

    shape: PodShape
    share: float
    memory_mib: int


def shape_of(request: Request) -> PodShape:
    """The shape a request counts under: a missing CPU request counts as 100m (kube-scheduler's
    scoring default), the allowed models as a sorted ``A|B`` label."""
    label = "|".join(sorted(request.gpu_models)) if request.gpu_models else ""
    return PodShape(request.cpu_milli or 100, request.gpu_milli, request.gpu_count, label)


class DemandModel:
    """Decayed counts of arrived request shapes."""

    def __init__(self, *, half_life: float | None = 10_000.0, coverage: float = 0.95) -> None:
        if half_life is not None and not half_life > 0:
            raise InvalidInputError(
                f"half-life {half_life} is not positive",
                field="half_life",
                accepted="a number of arrivals > 0, or none",
            )
        if not 0 < coverage <= 1:
            raise InvalidInputError(f"coverage {coverage} out of range", field="coverage", accepted="0 < coverage <= 1")
        self.half_life = half_life
        self.coverage = coverage
        self._growth = 2.0 ** (1.0 / half_life) if half_life is not None else 1.0
        self._increment = 1.0
        self._weight: dict[PodShape, float] = {}
        self._memory: dict[PodShape, float] = {}
        """Weighted sum of memory per shape; divided by the weight it gives the mean."""
        self.arrivals = 0

    def observe(self, request: Request, count: int = 1) -> None:
        """``count`` arrivals of ``request``'s shape (a gang's identical members arrive together). Past
        ``LOOPED_ARRIVALS`` they are added in closed form (``_observe_many``): a pod can state a headcount of
        millions, and each cost a loop step (0.8 s of the scheduling thread for 4,194,304)."""
        if count > LOOPED_ARRIVALS:
            self._observe_many(request, count)
            return
        shape = shape_of(request)
        weight = self._weight.get(shape, 0.0)
        memory = self._memory.get(shape, 0.0)
        for _ in range(count):
            self._increment *= self._growth
            if self._increment > _RESCALE_AT:
                factor = 1.0 / self._increment
                self._weight[shape], self._memory[shape] = weight, memory
                self._rescale(factor)
                weight, memory = self._weight[shape], self._memory[shape]
            weight += self._increment
            memory += self._increment * request.memory_mib
        self._weight[shape] = weight
        self._memory[shape] = memory
        self.arrivals += count

    def _observe_many(self, request: Request, count: int) -> None:
        """What ``count`` steps of ``observe``'s loop add, a geometric sum per stretch between rescales. Past 64
        half-lives every earlier weight is below 2**-64 of the newest, so later arrivals change no share."""
        shape = shape_of(request)
        self.arrivals += count
        growth = self._growth
        left = count if self.half_life is None else min(count, math.ceil(64 * self.half_life))
        while left > 0:
            room = left if growth == 1.0 else max(1, int(math.log(_RESCALE_AT / self._increment, growth)))
            step = min(left, room)
            factor = growth ** step
            added = self._increment * step if growth == 1.0 else self._increment * growth * (factor - 1) / (growth - 1)
            self._increment *= factor
            self._weight[shape] = self._weight.get(shape, 0.0) + added
            self._memory[shape] = self._memory.get(shape, 0.0) + added * request.memory_mib
            left -= step
            if self._increment > _RESCALE_AT:
                self._rescale(1.0 / self._increment)

    def _rescale(self, factor: float) -> None:
        self._increment *= factor
        for shape in self._weight:
            self._weight[shape] *= factor
            self._memory[shape] *= factor

    def typical(self) -> list[DemandType]:
        """The most frequent recent shapes, most frequent first, covering ``coverage`` of the weight.

        Ties go to the larger shape, as in ``frag.typical_pods``; shares are renormalised over the
        kept shapes."""
        total = sum(self._weight.values())
        if total <= 0:
            return []
        ordered = sorted(self._weight.items(), key=lambda item: (item[1], item[0]), reverse=True)
        kept: list[tuple[PodShape, float]] = []
        covered = 0.0
        for shape, weight in ordered:
            if covered >= self.coverage * total:
                break
            kept.append((shape, weight))
            covered += weight
        return [
            DemandType(shape, weight / covered, round(self._memory[shape] / weight)) for shape, weight in kept
        ]


def total_variation(a: list[DemandType], b: list[DemandType]) -> float:
    """Half the L1 distance between two share vectors (0 = same, 1 = disjoint)."""
    shares: dict[PodShape, float] = {t.shape: t.share for t in a}
    for t in b:
        shares[t.shape] = shares.get(t.shape, 0.0) - t.share
    return 0.5 * sum(abs(v) for v in shares.values())
