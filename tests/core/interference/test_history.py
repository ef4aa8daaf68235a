"""The pair history keeps what sharing did (time-weighted, bounded, refusing what is not a speed), and the rule
that asks it first decides a known pair by what it did and leaves everything else to the rule it wraps."""

from __future__ import annotations

import math

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import BlindSharing, JobKey, NoSharing, SummedUtilThreshold
from kubecell.core.interference.history import HistoryInformed, PairHistory
from tests.core.interference.support import job

GPU = 24576.0
A, B, C = JobKey("a"), JobKey("b"), JobKey("c")


def test_the_speed_of_a_pair_is_its_time_weighted_mean_in_each_direction() -> None:
    history = PairHistory()
    assert history.observe(A, B, 0.9, 100.0)
    assert history.observe(A, B, 0.6, 50.0)
    assert history.speed(A, B) == pytest.approx((0.9 * 100 + 0.6 * 50) / 150)
    assert history.seconds(A, B) == 150.0
    assert history.speed(B, A) is None, "each direction is its own: b beside a was never observed"
    assert len(history) == 1


@pytest.mark.parametrize(("speed", "seconds"), [(math.nan, 10.0), (0.0, 10.0), (-0.5, 10.0), (2.5, 10.0),
                                                (math.inf, 10.0), (0.9, 0.0), (0.9, -1.0), (0.9, math.nan),
                                                ("fast", 10.0)])
def test_what_is_not_a_measurement_is_refused_and_changes_nothing(speed: object, seconds: float) -> None:
    history = PairHistory()
    history.observe(A, B, 0.8, 10.0)
    assert not history.observe(A, B, speed, seconds)  # type: ignore[arg-type]
    assert history.speed(A, B) == 0.8
    assert history.seconds(A, B) == 10.0


def test_it_is_bounded_and_forgets_the_pair_observed_least_recently() -> None:
    history = PairHistory(max_pairs=2)
    history.observe(A, B, 0.9, 1.0)
    history.observe(A, C, 0.9, 1.0)
    history.observe(A, B, 0.9, 1.0)  # a-b observed again: a-c is now the oldest
    history.observe(B, C, 0.9, 1.0)
    assert len(history) == 2
    assert history.speed(A, C) is None
    assert history.speed(A, B) is not None
    with pytest.raises(InvalidInputError, match="max_pairs"):
        PairHistory(max_pairs=0)


def known(speed_ab: float, speed_ba: float) -> PairHistory:
    history = PairHistory()
    history.observe(A, B, speed_ab, 60.0)
    history.observe(B, A, speed_ba, 60.0)
    return history


def test_a_pair_known_in_both_directions_is_decided_by_what_it_did() -> None:
    busy_a, busy_b = job("a", 50.0), job("b", 40.0)  # 90 %: the 70 % rule refuses them
    assert HistoryInformed(SummedUtilThreshold(70.0), known(1.02, 1.0), 1.0).admits([busy_a, busy_b], GPU), \
        "neither lost anything beside the other: admitted, whatever the wrapped rule says"
    light_a, light_b = job("a", 20.0), job("b", 20.0)  # 40 %: the 70 % rule admits them
    assert not HistoryInformed(SummedUtilThreshold(70.0), known(0.7, 1.0), 1.0).admits([light_a, light_b], GPU), \
        "one of them lost 30 % the last time"


def test_everything_else_is_the_wrapped_rules() -> None:
    one_way = PairHistory()
    one_way.observe(A, B, 1.0, 60.0)  # b beside a never observed
    pair = [job("a", 20.0), job("b", 20.0)]
    assert HistoryInformed(BlindSharing(), one_way, 1.0).admits(pair, GPU)
    assert not HistoryInformed(NoSharing(), one_way, 1.0).admits(pair, GPU)
    three = [job("a", 10.0), job("b", 10.0), job("c", 10.0)]
    assert not HistoryInformed(NoSharing(), known(1.0, 1.0), 1.0).admits(three, GPU)
    assert HistoryInformed(NoSharing(), known(1.0, 1.0), 1.0).admits([job("a", 10.0)], GPU), "alone: always"
    too_big = [job("a", 10.0, memory_mib=20000.0), job("b", 10.0, memory_mib=20000.0)]
    assert not HistoryInformed(BlindSharing(), known(1.0, 1.0), 1.0).admits(too_big, GPU), \
        "a good history never makes memory fit"


@pytest.mark.parametrize("floor", [0.0, -1.0, 2.5, math.nan])
def test_a_floor_that_is_not_a_speed_is_refused(floor: float) -> None:
    with pytest.raises(InvalidInputError, match="floor"):
        HistoryInformed(BlindSharing(), PairHistory(), floor)
