"""The interference model: its physical limits, monotonicity, parameters and calibration."""

from __future__ import annotations

import itertools
import random

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import (
    InterferenceParams,
    InterferencePredictor,
    JobKey,
    SharedRun,
    SoloProfile,
    fit,
    predict_speeds,
)
from kubecell.core.interference.predictor import MAX_SHARERS
from tests.core.interference.support import job

CALIBRATED = InterferenceParams(queueing=0.4, bandwidth=0.5)


@pytest.mark.parametrize("params", [InterferenceParams(), CALIBRATED])
def test_a_lone_job_runs_at_full_speed(params: InterferenceParams) -> None:
    assert predict_speeds([job("a", 100.0, 90.0)], params) == (1.0,)
    assert predict_speeds([], params) == ()
    assert InterferencePredictor(params).worst_speed([]) == 1.0


def test_a_partner_that_never_uses_the_gpu_costs_nothing() -> None:
    assert predict_speeds([job("a", 90.0, 60.0), job("idle", 0.0, 0.0)], CALIBRATED) == (1.0, 1.0)


def test_two_jobs_that_always_need_the_gpu_get_half_each_at_the_defaults() -> None:
    assert predict_speeds([job("a", 100.0), job("b", 100.0)], InterferenceParams()) == pytest.approx((0.5, 0.5))


def test_the_pair_formula() -> None:
    a, b = job("a", 60.0, 30.0), job("b", 50.0, 40.0)
    expected = 1 / (1 + 0.4 * 0.6 * 0.5 + 0.5 * 0.3 * 0.4)
    assert predict_speeds([a, b], CALIBRATED) == pytest.approx((expected, expected))


@pytest.mark.parametrize("params", [InterferenceParams(), CALIBRATED, InterferenceParams(1.0, 1.0)])
@pytest.mark.parametrize("others", [1, 2, 3])
def test_a_busier_partner_never_predicts_a_faster_speed(params: InterferenceParams, others: int) -> None:
    rng = random.Random(others)
    for _ in range(200):
        sharers = [job(f"j{i}", rng.uniform(0, 100), rng.uniform(0, 100)) for i in range(others + 1)]
        before = predict_speeds(sharers, params)
        partner = sharers[1]
        for busier in (job("p", min(100.0, partner.gpu_util + 10), partner.gmem_util),
                       job("p", partner.gpu_util, min(100.0, partner.gmem_util + 10))):
            after = predict_speeds([sharers[0], busier, *sharers[2:]], params)
            assert after[0] <= before[0] + 1e-12
            assert all(0 < speed <= 1 for speed in after)


def test_one_more_sharer_never_speeds_anyone_up() -> None:
    rng = random.Random(7)
    for _ in range(100):
        sharers = [job(f"j{i}", rng.uniform(0, 100), rng.uniform(0, 100)) for i in range(3)]
        pair, triple = predict_speeds(sharers[:2], CALIBRATED), predict_speeds(sharers, CALIBRATED)
        assert triple[0] <= pair[0] + 1e-12
        assert triple[1] <= pair[1] + 1e-12


def test_too_many_sharers_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="at most 16"):
        predict_speeds([job(str(i), 10.0) for i in range(MAX_SHARERS + 1)], CALIBRATED)


def test_parameters_round_trip_and_refuse_typos_and_negatives() -> None:
    assert InterferenceParams.from_dict(CALIBRATED.to_dict()) == CALIBRATED
    assert InterferenceParams.from_dict({}) == InterferenceParams()
    with pytest.raises(InvalidInputError, match=r"unknown key.*queuing"):
        InterferenceParams.from_dict({"queuing": 0.3})
    with pytest.raises(InvalidInputError, match=r"field 'bandwidth'.*number"):
        InterferenceParams.from_dict({"bandwidth": "high"})
    with pytest.raises(InvalidInputError, match=r"field 'queueing'.*>= 0"):
        InterferenceParams(queueing=-0.1)


def synthetic_table(params: InterferenceParams, noise: float, seed: int) -> tuple[list[SharedRun],
                                                                                 dict[JobKey, SoloProfile]]:
    rng = random.Random(seed)
    solos = {}
    for index in range(30):
        profile = SoloProfile(JobKey(f"m{index}"), rng.uniform(5, 100), rng.uniform(0, 90), 2000.0)
        solos[profile.key] = profile
    runs = []
    for a, b in itertools.combinations(solos.values(), 2):
        speeds = predict_speeds([a, b], params)
        runs.append(SharedRun((a.key, b.key), tuple(s * (1 + rng.gauss(0, noise)) for s in speeds)))
    return runs, solos


@pytest.mark.parametrize("truth", [CALIBRATED, InterferenceParams(0.8, 0.0), InterferenceParams(0.1, 1.2)])
def test_fit_recovers_the_parameters_of_a_synthetic_table(truth: InterferenceParams) -> None:
    runs, solos = synthetic_table(truth, noise=0.03, seed=1)
    fitted = fit(runs, solos)
    assert fitted.queueing == pytest.approx(truth.queueing, abs=0.05)
    assert fitted.bandwidth == pytest.approx(truth.bandwidth, abs=0.05)


def test_fit_never_returns_a_negative_parameter() -> None:
    solos = {JobKey(n): SoloProfile(JobKey(n), u, m, 1.0) for n, u, m in (("a", 90, 10), ("b", 80, 10), ("c", 10, 90))}
    runs = [SharedRun((JobKey("a"), JobKey("b")), (1.2, 1.2)), SharedRun((JobKey("a"), JobKey("c")), (0.7, 0.7))]
    fitted = fit(runs, solos)
    assert fitted.queueing >= 0
    assert fitted.bandwidth >= 0


def test_fit_refuses_what_it_cannot_use() -> None:
    runs, solos = synthetic_table(CALIBRATED, noise=0.0, seed=2)
    with pytest.raises(InvalidInputError, match="no measured pairs"):
        fit([], solos)
    triple = SharedRun((JobKey("m0"), JobKey("m1"), JobKey("m2")), (0.9, 0.9, 0.9))
    with pytest.raises(InvalidInputError, match="exactly two jobs"):
        fit([*runs, triple], solos)
    with pytest.raises(InvalidInputError, match="no solo profile for ghost"):
        fit([SharedRun((JobKey("m0"), JobKey("ghost")), (0.9, 0.9))], solos)
