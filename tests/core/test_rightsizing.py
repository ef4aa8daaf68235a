"""Right-sizing from job history: numbers worked out by hand from the rule, too little history, whole GPUs
for jobs a share would throttle, and profiles that cannot be true refused."""

from __future__ import annotations

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.rightsizing import SizingRule, UsageProfile, recommend


def profile(job: str, p90: float, peak_mib: float, *, low: float = 0.0) -> UsageProfile:
    util = tuple([low] * 9 + [p90, max(p90, min(1.0, p90 + 0.05))])
    memory = tuple([peak_mib / 2] * 10 + [peak_mib])
    return UsageProfile(job, util, memory, 3600.0)


def test_the_share_covers_nine_in_ten_jobs_with_headroom() -> None:
    history = [profile(f"j{i}", p90, 2000 + 100 * i) for i, p90 in enumerate(
        [0.05, 0.08, 0.10, 0.12, 0.15, 0.18, 0.20, 0.22, 0.25, 0.60])]
    got = recommend("sd-serving", history)
    # p90 across the ten jobs' p90s (inverted CDF: the 9th smallest) = 0.25; * 1.25 = 312.5 milli -> 350
    assert got.milli == 350
    # peak 2900 MiB * 1.1 + 300 = 3490 -> 3584 (14 x 256)
    assert got.memory_mib == 3584
    assert not got.whole_gpu
    assert "90% of 10 jobs" in got.reason


def test_busy_jobs_get_a_whole_gpu() -> None:
    got = recommend("train", [profile(f"j{i}", 0.85, 30_000) for i in range(4)])
    assert got.milli == 1000
    assert got.whole_gpu
    assert "would not hold them" in got.reason


def test_idle_jobs_get_at_least_the_minimum_share() -> None:
    got = recommend("idle", [profile(f"j{i}", 0.0, 100) for i in range(5)])
    assert got.milli == 100


def test_too_little_history_gives_no_recommendation() -> None:
    got = recommend("new", [profile("j0", 0.1, 1000), profile("j1", 0.1, 1000)])
    assert (got.milli, got.memory_mib) == (None, None)
    assert "2 finished job(s) profiled; 3 needed" in got.reason


def test_a_looser_rule_changes_the_numbers_as_stated() -> None:
    history = [profile(f"j{i}", p90, 1000) for i, p90 in enumerate([0.1, 0.2, 0.3, 0.4])]
    rule = SizingRule(cover=0.5, headroom=0.0, step_milli=10, min_jobs=4)
    assert recommend("f", history, rule).milli == 200


@pytest.mark.parametrize(("util", "memory", "field"), [
    ((0.1,) * 10, (1.0,) * 11, "gpu_utilization"),
    ((0.1,) * 10 + (1.5,), (1.0,) * 11, "gpu_utilization"),
    ((0.1,) * 10 + (float("nan"),), (1.0,) * 11, "gpu_utilization"),
    ((0.2,) + (0.1,) * 10, (1.0,) * 11, "gpu_utilization"),
    ((0.1,) * 11, (-1.0,) + (1.0,) * 10, "gpu_memory_mib"),
])
def test_profiles_that_cannot_be_true_are_refused(util: tuple[float, ...], memory: tuple[float, ...],
                                                  field: str) -> None:
    with pytest.raises(InvalidInputError, match=field):
        UsageProfile("bad", util, memory, 1.0)


def test_a_rule_out_of_range_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="cover"):
        SizingRule(cover=0)
