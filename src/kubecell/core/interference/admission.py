"""Rules that decide whether jobs may share one GPU, and the tuning of a rule's single threshold.

All rules answer the same question through one interface (``admits(sharers, gpu_memory_mib)``) so a
scheduler or a benchmark can swap them. Every sharing rule first requires that the sharers' solo memory
fits the GPU: time-slicing shares compute, never device memory, and an out-of-memory error is worse than
any slowdown.

Tuning (``tune_limit``) is defined on a calibration set of measured runs, each with a score (lower = safer:
the summed solo GPU utilization, or minus the predicted worst speed) and a verdict ``bad`` (some job of the
run fell below the speed floor, e.g. 0.8x of solo). Admitting every run whose score is <= ``limit`` admits a
set whose *bad rate* is (bad runs admitted) / (runs admitted). The tuned limit is the largest score of a
calibration run at which that rate is <= ``target_rate``. Runs with equal scores are admitted or refused
together, so only limits at the end of a group of ties count. The limit is the score of the last admitted
run, not the gap above it: no calibration run says anything about scores in the gap. The same procedure
tunes the threshold rule and the predictor's floor, so the two are compared at the same allowed bad rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference.predictor import InterferenceParams, InterferencePredictor
from kubecell.core.interference.profile import SoloProfile


class AdmissionRule(Protocol):
    """Decides whether ``sharers`` (the jobs already on a GPU plus the candidate) may share it."""

    @property
    def name(self) -> str: ...

    def admits(self, sharers: Sequence[SoloProfile], gpu_memory_mib: float) -> bool: ...


def memory_fits(sharers: Sequence[SoloProfile], gpu_memory_mib: float) -> bool:
    return sum(profile.memory_mib for profile in sharers) <= gpu_memory_mib


@dataclass(frozen=True)
class NoSharing:
    """One job per GPU: the baseline with no interference and no packing."""

    @property
    def name(self) -> str:
        return "no sharing"

    def admits(self, sharers: Sequence[SoloProfile], gpu_memory_mib: float) -> bool:
        return len(sharers) <= 1 and memory_fits(sharers, gpu_memory_mib)


@dataclass(frozen=True)
class BlindSharing:
    """Any jobs whose memory fits: the most packing, with no regard for slowdown."""

    @property
    def name(self) -> str:
        return "blind sharing"

    def admits(self, sharers: Sequence[SoloProfile], gpu_memory_mib: float) -> bool:
        return memory_fits(sharers, gpu_memory_mib)


@dataclass(frozen=True)
class SummedUtilThreshold:
    """Admit while the sharers' solo GPU utilizations sum to at most ``limit`` percent (Alnair: 70)."""

    limit: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.limit) or self.limit < 0:
            raise InvalidInputError(f"must be a finite number >= 0, got {self.limit}", field="limit")

    @property
    def name(self) -> str:
        return f"summed util <= {self.limit:g} %"

    def admits(self, sharers: Sequence[SoloProfile], gpu_memory_mib: float) -> bool:
        return memory_fits(sharers, gpu_memory_mib) and summed_util(sharers) <= self.limit


@dataclass(frozen=True)
class PredictedSlowdown:
    """Admit when every sharer's predicted speed is at least ``floor`` (a fraction of its solo speed)."""

    predictor: InterferencePredictor
    floor: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.floor) or not 0 <= self.floor <= 1:
            raise InvalidInputError(f"must be between 0 and 1, got {self.floor}", field="floor",
                                    accepted="a fraction of solo speed, e.g. 0.8")

    @property
    def name(self) -> str:
        return f"predicted worst speed >= {self.floor:.3f}"

    def admits(self, sharers: Sequence[SoloProfile], gpu_memory_mib: float) -> bool:
        return memory_fits(sharers, gpu_memory_mib) and self.predictor.worst_speed(sharers) >= self.floor


@dataclass(frozen=True)
class PressureAdaptive:
    """One rule while no other job waits for capacity, another while jobs queue.

    Why: what sharing is worth depends on the load. With GPUs to spare a slowed job gains nothing from sharing,
    so only pairs that lose (almost) nothing should share; with a queue, a pair that runs at 0.8x each still
    does 1.6 jobs' work on one GPU while the waiting job would otherwise do none. The engine says which holds at
    each decision (``placement.colocation``: another job than the one being placed is waiting)."""

    idle: AdmissionRule
    busy: AdmissionRule

    @property
    def name(self) -> str:
        return f"{self.idle.name} while nothing waits, {self.busy.name} while jobs queue"

    def under(self, queued: bool) -> AdmissionRule:
        return self.busy if queued else self.idle

    def admits(self, sharers: Sequence[SoloProfile], gpu_memory_mib: float) -> bool:
        """Without knowing the queue: the stricter answer (both rules must admit)."""
        return self.idle.admits(sharers, gpu_memory_mib) and self.busy.admits(sharers, gpu_memory_mib)


def summed_util(sharers: Sequence[SoloProfile]) -> float:
    return sum(profile.gpu_util for profile in sharers)


def tune_limit(scores: Sequence[float], bad: Sequence[bool], target_rate: float) -> float | None:
    """The largest calibration score whose admitted set has a bad rate <= ``target_rate`` (module docstring).

    None when even the safest group of tied runs is above the target: then nothing should be admitted.
    """
    if len(scores) != len(bad):
        raise InvalidInputError(f"{len(scores)} scores but {len(bad)} verdicts", field="bad")
    if not 0 <= target_rate <= 1:
        raise InvalidInputError(f"must be between 0 and 1, got {target_rate}", field="target_rate")
    order = sorted(range(len(scores)), key=lambda index: scores[index])
    bad_admitted = 0
    best: float | None = None
    for position, index in enumerate(order):
        bad_admitted += bool(bad[index])
        last_of_ties = position + 1 == len(order) or scores[order[position + 1]] > scores[index]
        if last_of_ties and bad_admitted <= target_rate * (position + 1):
            best = scores[index]
    return best


def tune_summed_util(runs: Sequence[Sequence[SoloProfile]], worst_speeds: Sequence[float], *, floor: float,
                     target_rate: float) -> SummedUtilThreshold | None:
    """The summed-utilization rule with the largest limit meeting ``target_rate`` on the calibration runs."""
    limit = tune_limit([summed_util(run) for run in runs], [speed < floor for speed in worst_speeds], target_rate)
    return None if limit is None else SummedUtilThreshold(limit)


def tune_predicted_floor(
    predictor: InterferencePredictor, runs: Sequence[Sequence[SoloProfile]], worst_speeds: Sequence[float], *,
    floor: float, target_rate: float,
) -> PredictedSlowdown | None:
    """The predictor rule with the lowest predicted-speed floor meeting ``target_rate`` on the calibration runs.

    The floor is tuned rather than set to ``floor`` because a least-squares model predicts the mean speed:
    admitting at predicted 0.8 would let about half the runs predicted near 0.8 fall below it.
    """
    limit = tune_limit([-predictor.worst_speed(run) for run in runs], [speed < floor for speed in worst_speeds],
                       target_rate)
    return None if limit is None else PredictedSlowdown(predictor, min(1.0, max(0.0, -limit)))


RULE_SYNTAX = ("none (no sharing), blind, summed-util:LIMIT (percent, Alnair: 70), "
               "predicted:FLOOR[:QUEUEING:BANDWIDTH] (a fraction of solo speed, e.g. 0.8), or IDLE/BUSY: one "
               "of those while no other job waits, another while jobs queue (e.g. predicted:0.9/predicted:0.8)")


def parse_rule(text: str, *, field: str = "colocation") -> AdmissionRule:
    """An admission rule from its configuration text (``RULE_SYNTAX``); an error names what is accepted."""
    if "/" in text:
        idle, _, busy = text.partition("/")
        if "/" in busy:
            raise InvalidInputError(f"colocation rule {text!r}", field=field, accepted=RULE_SYNTAX)
        return PressureAdaptive(parse_rule(idle, field=field), parse_rule(busy, field=field))
    name, _, rest = text.strip().lower().partition(":")
    numbers: list[float] = []
    for part in rest.split(":") if rest else []:
        try:
            numbers.append(float(part))
        except ValueError:
            raise InvalidInputError(f"{part!r} in {text!r} is not a number", field=field,
                                    accepted=RULE_SYNTAX) from None
    if name == "none" and not numbers:
        return NoSharing()
    if name == "blind" and not numbers:
        return BlindSharing()
    if name == "summed-util" and len(numbers) == 1:
        return SummedUtilThreshold(numbers[0])
    if name == "predicted" and len(numbers) in (1, 3):
        params = InterferenceParams(*numbers[1:]) if len(numbers) == 3 else InterferenceParams()
        return PredictedSlowdown(InterferencePredictor(params), numbers[0])
    raise InvalidInputError(f"colocation rule {text!r}", field=field, accepted=RULE_SYNTAX)
