"""Admission rules share one interface, all but no-sharing refuse what does not fit in memory, and tuning
picks the largest limit whose calibration bad rate meets the target."""

from __future__ import annotations

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import (
    AdmissionRule,
    BlindSharing,
    InterferenceParams,
    InterferencePredictor,
    NoSharing,
    PredictedSlowdown,
    PressureAdaptive,
    SummedUtilThreshold,
    tune_limit,
    tune_predicted_floor,
    tune_summed_util,
)
from kubecell.core.interference.admission import parse_rule
from tests.core.interference.support import job

GPU = 24576.0
LIGHT, HEAVY, BIG = job("light", 20.0, 5.0), job("heavy", 95.0, 70.0), job("big", 30.0, 10.0, memory_mib=20000.0)
PREDICTOR = InterferencePredictor(InterferenceParams(queueing=0.4, bandwidth=0.5))


@pytest.mark.parametrize(("rule", "light_pair", "heavy_pair", "oversized"), [
    (NoSharing(), False, False, False),
    (BlindSharing(), True, True, False),
    (SummedUtilThreshold(70.0), True, False, False),
    (PredictedSlowdown(PREDICTOR, 0.8), True, False, False),
])
def test_each_rule(rule: AdmissionRule, light_pair: bool, heavy_pair: bool, oversized: bool) -> None:
    assert rule.admits([LIGHT, LIGHT], GPU) is light_pair
    assert rule.admits([HEAVY, HEAVY], GPU) is heavy_pair
    assert rule.admits([BIG, BIG], GPU) is oversized
    assert rule.admits([LIGHT], GPU) is True
    assert rule.name


def test_rule_parameters_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="field 'limit'"):
        SummedUtilThreshold(float("nan"))
    with pytest.raises(InvalidInputError, match=r"field 'floor'.*between 0 and 1"):
        PredictedSlowdown(PREDICTOR, 80.0)


def test_tuning_takes_the_largest_limit_meeting_the_rate() -> None:
    scores = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    bad = [False, False, True, False, False, True]
    assert tune_limit(scores, bad, 0.0) == 20.0
    assert tune_limit(scores, bad, 0.25) == 50.0  # 1 bad of 5 admitted; 60 would make it 2 of 6
    assert tune_limit(scores, bad, 1 / 3) == 60.0
    assert tune_limit([5.0], [True], 0.5) is None


def test_tied_scores_are_admitted_together() -> None:
    assert tune_limit([10.0, 20.0, 20.0], [False, False, True], 0.3) == 10.0
    assert tune_limit([10.0, 20.0, 20.0], [False, True, False], 0.3) == 10.0


def test_tuning_refuses_mismatched_input() -> None:
    with pytest.raises(InvalidInputError, match="2 scores but 1 verdicts"):
        tune_limit([1.0, 2.0], [True], 0.1)
    with pytest.raises(InvalidInputError, match="target_rate"):
        tune_limit([1.0], [True], 2.0)


def test_both_rules_tune_on_the_same_runs() -> None:
    runs = [(job("a", u), job("b", u)) for u in (10.0, 30.0, 50.0, 70.0, 90.0)]
    worst = [1.0, 0.95, 0.85, 0.7, 0.5]
    threshold = tune_summed_util(runs, worst, floor=0.8, target_rate=0.0)
    assert threshold == SummedUtilThreshold(100.0)
    predicted = tune_predicted_floor(PREDICTOR, runs, worst, floor=0.8, target_rate=0.0)
    assert predicted is not None
    assert predicted.floor == pytest.approx(PREDICTOR.worst_speed(runs[2]))
    assert [predicted.admits(run, GPU) for run in runs] == [True, True, True, False, False]


@pytest.mark.parametrize(("text", "expected"), [
    ("none", NoSharing()),
    ("Blind", BlindSharing()),
    ("summed-util:70", SummedUtilThreshold(70.0)),
    ("predicted:0.8", PredictedSlowdown(InterferencePredictor(), 0.8)),
    ("predicted:0.9:0.3:0.5", PredictedSlowdown(InterferencePredictor(InterferenceParams(0.3, 0.5)), 0.9)),
    ("summed-util:70/blind", PressureAdaptive(SummedUtilThreshold(70.0), BlindSharing())),
])
def test_rules_are_read_from_their_configuration_text(text: str, expected: object) -> None:
    assert parse_rule(text) == expected


@pytest.mark.parametrize("text", ["", "sometimes", "summed-util", "summed-util:x", "predicted:2", "none:1",
                                  "predicted:0.8:1", "summed-util:-5", "none/blind/none", "none/"])
def test_bad_rule_texts_say_what_is_accepted(text: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_rule(text)
