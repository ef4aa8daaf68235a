"""What sharing a GPU did to jobs that ran before, and the admission rule that asks it first.

Why: a prediction from solo profiles ranks pairs of models it was never calibrated on no better than summed
utilization does (docs/profiler.md), yet clusters run the same job families again and again. Once a family has
shared a GPU with another, how fast each ran is known, not predicted: some pairs lose nothing (a few even run
faster together, one job's host work filling the other's GPU gaps), others lose a third. ``PairHistory`` keeps,
per ordered pair of job keys (the job's, then its partner's), the time-weighted mean speed observed while the
two shared a GPU alone; ``HistoryInformed`` admits a pair the history knows in both directions by what it
observed, and leaves every other case (a pair never seen together, three sharers, a job alone) to the rule it
wraps. Learning needs no exploration of its own: whatever the wrapped rule lets share is observed, and the
busy rule of ``PressureAdaptive`` lets more pairs share than the idle one.

Untrusted input: an observation is a measurement a driver derived from what jobs did; one that is not a speed
(not finite, not above 0, above ``MAX_SPEED``) or covers no time is refused and changes nothing. The history
is bounded (``max_pairs``, the pair observed least recently is forgotten first).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference.admission import AdmissionRule, PressureAdaptive, memory_fits
from kubecell.core.interference.profile import JobKey, SoloProfile

MAX_SPEED = 2.0
"""No job runs twice as fast beside another as alone: a larger ratio is a broken measurement."""
MEASURED_FLOOR = 0.95
"""The floor for a history a cluster measured (``kubecell.profiler.pairs``: utilization under time-slicing,
capped at 1): below 1, since a pair that lost nothing still reads a little under it when sampling and a job's
phases move its busy fraction (the simulator's ``history, as measured`` rule checks the choice)."""


class PairHistory:
    """Time-weighted mean speeds (over solo) observed per ordered pair of job keys (see the module)."""

    def __init__(self, max_pairs: int = 100_000) -> None:
        if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1:
            raise InvalidInputError(f"max_pairs {max_pairs!r} is not a positive integer", field="max_pairs")
        self.max_pairs = max_pairs
        self._seen: OrderedDict[tuple[JobKey, JobKey], tuple[float, float]] = OrderedDict()
        """(own, partner) -> (seconds observed, speed-seconds), most recently observed last."""

    def observe(self, own: JobKey, partner: JobKey, speed: float, seconds: float) -> bool:
        """Fold in ``seconds`` of ``own`` running at ``speed`` beside ``partner`` alone on a GPU; False (and
        nothing learned) for what is not such a measurement."""
        try:
            speed, seconds = float(speed), float(seconds)
        except (TypeError, ValueError):
            return False
        if not (math.isfinite(speed) and 0.0 < speed <= MAX_SPEED and math.isfinite(seconds) and seconds > 0.0):
            return False
        key = (own, partner)
        total, weighted = self._seen.pop(key, (0.0, 0.0))
        self._seen[key] = (total + seconds, weighted + speed * seconds)
        while len(self._seen) > self.max_pairs:
            self._seen.popitem(last=False)
        return True

    def speed(self, own: JobKey, partner: JobKey) -> float | None:
        """The mean speed ``own`` ran at beside ``partner`` (None: never observed)."""
        seen = self._seen.get((own, partner))
        return None if seen is None else seen[1] / seen[0]

    def seconds(self, own: JobKey, partner: JobKey) -> float:
        """How long ``own`` was observed beside ``partner``."""
        seen = self._seen.get((own, partner))
        return 0.0 if seen is None else seen[0]

    def __len__(self) -> int:
        return len(self._seen)


class KnownPairs(Protocol):
    """What ``HistoryInformed`` asks: a ``PairHistory``, or a driver's view of one kept elsewhere (the
    profiler's job history, refreshed while the scheduler runs)."""

    def speed(self, own: JobKey, partner: JobKey) -> float | None: ...


@dataclass(frozen=True, eq=False)
class HistoryInformed:
    """Two sharers the history knows in both directions share if each ran at ``floor`` or faster beside the
    other; everything else is ``rule``'s to decide (see the module)."""

    rule: AdmissionRule
    history: KnownPairs
    floor: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.floor) or not 0 < self.floor <= MAX_SPEED:
            raise InvalidInputError(f"must be a speed in (0, {MAX_SPEED:g}], got {self.floor}", field="floor",
                                    accepted="a fraction of solo speed, e.g. 1.0: pairs that lost nothing")

    @property
    def name(self) -> str:
        return f"{self.rule.name}, or history (both >= {self.floor:g}x) where the pair ran together"

    def admits(self, sharers: Sequence[SoloProfile], gpu_memory_mib: float) -> bool:
        if len(sharers) == 2 and memory_fits(sharers, gpu_memory_mib):
            first, second = sharers[0].key, sharers[1].key
            one, other = self.history.speed(first, second), self.history.speed(second, first)
            if one is not None and other is not None:
                return min(one, other) >= self.floor
        return self.rule.admits(sharers, gpu_memory_mib)


def informed_by_pairs(rule: AdmissionRule, history: KnownPairs, floor: float) -> AdmissionRule:
    """``rule`` with ``history`` asked first: for a pressure-adaptive rule, its idle part only (while jobs
    queue, a pair that loses a little still beats a GPU left to one job, and the busy rule knows that); for any
    other rule, the whole of it."""
    if isinstance(rule, PressureAdaptive):
        return PressureAdaptive(HistoryInformed(rule.idle, history, floor), rule.busy)
    return HistoryInformed(rule, history, floor)
