"""Right-sizing: the GPU share a workload family needs, from what its past jobs used.

Why: production inference pods mostly hold whole GPUs and use a few percent of them (the Alibaba GenAI
trace: 86 % of pods average under 10 %). The scheduler can only pack them if someone says how much they
need; the history says it better than the user. The rule is deliberately simple and stated in numbers, so a
platform team can check a recommendation by hand:

* **compute**: each past job contributes its ``compute_quantile`` (p90 by default) of GPU utilization per GPU;
  the family needs the ``cover`` (p90) of those across jobs, plus ``headroom`` (25 %), rounded up to
  ``step_milli`` (50 milli-GPU) and at least ``min_milli``. A job whose p90 sits above what a share can hold
  (a whole GPU) makes the recommendation a whole GPU: a share would throttle it.
* **memory**: the largest p100 (peak) of GPU memory across the family's jobs, plus ``memory_margin`` (10 %) and
  ``context_mib`` (the CUDA context NVML counts to the process), rounded up to ``memory_step_mib``. Memory is
  not elastic: running out of it kills a job, so no quantile below the peak is used.
* fewer than ``min_jobs`` finished jobs: no recommendation (``None``) with the reason.

Profiles are plain data (deciles, as the profiler stores them), so the rule is the same in the simulator, the
CLI and the scheduler. Nothing is enforced here: the recommendation is advice, or the share the engine places
a pod at when an operator turns that on (the pod's own request stays its limit).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU

DECILES = 11
"""p0, p10, ..., p100."""


@dataclass(frozen=True, slots=True)
class UsageProfile:
    """What one finished job used, per GPU it held: deciles (p0..p100) of GPU utilization (0..1 of a GPU) and of
    GPU memory (MiB), and how long it ran."""

    job: str
    gpu_utilization: tuple[float, ...]
    gpu_memory_mib: tuple[float, ...]
    seconds: float

    def __post_init__(self) -> None:
        for name, values, high in (("gpu_utilization", self.gpu_utilization, 1.0),
                                   ("gpu_memory_mib", self.gpu_memory_mib, math.inf)):
            if len(values) != DECILES:
                raise InvalidInputError(f"{len(values)} values", location=f"job {self.job}", field=name,
                                        accepted=f"{DECILES} deciles p0..p100")
            if any(not math.isfinite(v) or v < 0 or v > high for v in values):
                raise InvalidInputError(f"{values}", location=f"job {self.job}", field=name,
                                        accepted=f"finite numbers in 0..{high}")
            if any(b < a for a, b in itertools.pairwise(values)):
                raise InvalidInputError("deciles decrease", location=f"job {self.job}", field=name,
                                        accepted="non-decreasing p0..p100")
        if not (math.isfinite(self.seconds) and self.seconds >= 0):
            raise InvalidInputError(f"{self.seconds}", location=f"job {self.job}", field="seconds",
                                    accepted="finite seconds >= 0")


@dataclass(frozen=True, slots=True)
class SizingRule:
    """The knobs of the rule in the module docstring."""

    compute_quantile: int = 9
    """Decile of each job's utilization taken (9: p90)."""
    cover: float = 0.9
    """Share of the family's jobs whose decile the recommendation covers."""
    headroom: float = 0.25
    step_milli: int = 50
    min_milli: int = 100
    memory_margin: float = 0.10
    context_mib: int = 300
    memory_step_mib: int = 256
    min_jobs: int = 3

    def __post_init__(self) -> None:
        if not 0 <= self.compute_quantile < DECILES or not 0 < self.cover <= 1 or self.headroom < 0 \
                or self.step_milli < 1 or not 0 < self.min_milli <= MILLI_PER_GPU or self.memory_margin < 0 \
                or self.context_mib < 0 or self.memory_step_mib < 1 or self.min_jobs < 1:
            raise InvalidInputError(f"{self}", field="sizing rule",
                                    accepted="decile 0..10, cover in (0, 1], headroom and margins >= 0, "
                                             f"steps >= 1, min_milli in 1..{MILLI_PER_GPU}, min_jobs >= 1")


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The share a family needs (``milli`` per GPU, ``memory_mib`` per GPU), or why there is none."""

    family: str
    jobs: int
    milli: int | None
    memory_mib: int | None
    reason: str

    @property
    def whole_gpu(self) -> bool:
        return self.milli == MILLI_PER_GPU


def _quantile_of(values: Sequence[float], share: float) -> float:
    """The smallest value at or above ``share`` of them (inverted CDF, a value some job really had)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def _round_up(value: float, step: int) -> int:
    return int(math.ceil(value / step - 1e-9) * step)


def recommend(family: str, history: Sequence[UsageProfile], rule: SizingRule | None = None) -> Recommendation:
    """The share for ``family`` from its finished jobs' profiles (see the module)."""
    rule = rule or SizingRule()
    if len(history) < rule.min_jobs:
        return Recommendation(family, len(history), None, None,
                              f"{len(history)} finished job(s) profiled; {rule.min_jobs} needed")
    per_job = [profile.gpu_utilization[rule.compute_quantile] for profile in history]
    need = _quantile_of(per_job, rule.cover)
    milli = max(rule.min_milli, _round_up(need * (1 + rule.headroom) * MILLI_PER_GPU, rule.step_milli))
    peak = max(profile.gpu_memory_mib[-1] for profile in history)
    memory = _round_up(peak * (1 + rule.memory_margin) + rule.context_mib, rule.memory_step_mib)
    decile = f"p{rule.compute_quantile * 10}"
    if milli >= MILLI_PER_GPU:
        return Recommendation(family, len(history), MILLI_PER_GPU, memory,
                              f"{rule.cover:.0%} of {len(history)} jobs reach {need:.0%} of a GPU at their "
                              f"{decile}: a share with {rule.headroom:.0%} headroom would not hold them")
    return Recommendation(family, len(history), milli, memory,
                          f"{rule.cover:.0%} of {len(history)} jobs stay within {need:.1%} of a GPU at their "
                          f"{decile} (+{rule.headroom:.0%} headroom); peak memory {peak:.0f} MiB "
                          f"(+{rule.memory_margin:.0%} and {rule.context_mib} MiB of CUDA context)")
