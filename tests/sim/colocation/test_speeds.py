"""The pair speed model: measured pairs run at their measured speeds, anything unmeasured at the fitted
predictor's, and a job alone at full speed."""

from __future__ import annotations

import pytest

from kubecell.core.engine.job import JobSpec
from kubecell.core.interference import InterferenceParams, InterferencePredictor, JobKey, SharedRun, SoloProfile, fit
from kubecell.sim.colocation.speeds import PairSpeeds
from kubecell.sim.colocation.workload import share_job

A = SoloProfile(JobKey("a"), 80.0, 40.0, 2000.0)
B = SoloProfile(JobKey("b"), 60.0, 20.0, 3000.0)
C = SoloProfile(JobKey("c"), 30.0, 10.0, 1000.0)
SOLOS = {profile.key: profile for profile in (A, B, C)}
RUNS = [SharedRun((A.key, B.key), (0.62, 0.71)), SharedRun((A.key, C.key), (0.9, 0.95)),
        SharedRun((B.key, B.key), (0.8, 0.84))]


def job(name: str, profile: SoloProfile) -> JobSpec:
    return share_job(name, profile, 0.0, 100.0)


def test_a_measured_pair_runs_at_its_measured_speeds_in_either_order() -> None:
    speeds = PairSpeeds(RUNS, SOLOS)
    assert speeds.speed(job("x", A), [[job("y", B)]]) == 0.62
    assert speeds.speed(job("y", B), [[job("x", A)]]) == 0.71
    assert speeds.measured(A.key, [B.key])
    assert speeds.measured(B.key, [A.key])


def test_a_pair_of_one_configuration_averages_its_two_measurements() -> None:
    speeds = PairSpeeds(RUNS, SOLOS)
    assert speeds.speed(job("x", B), [[job("y", B)]]) == pytest.approx(0.82)


def test_a_job_alone_runs_at_full_speed() -> None:
    speeds = PairSpeeds(RUNS, SOLOS)
    assert speeds.speed(job("x", A), []) == 1.0
    assert speeds.speed(job("x", A), [[]]) == 1.0
    assert speeds.measured(A.key, [])


def test_an_unmeasured_pair_runs_at_the_predictor_fitted_on_all_pairs() -> None:
    speeds = PairSpeeds(RUNS, SOLOS)
    assert not speeds.measured(B.key, [C.key])
    predicted = speeds.predictor.speeds([B, C])
    assert speeds.speed(job("x", B), [[job("y", C)]]) == pytest.approx(predicted[0])
    assert speeds.speed(job("y", C), [[job("x", B)]]) == pytest.approx(predicted[1])
    assert 0 < predicted[0] < 1, "the fitted model slows a busy pair down"
    assert speeds.predictor.params == fit(RUNS, SOLOS) != InterferenceParams(), "fitted on every pair given"


def test_three_sharers_are_predicted_even_when_each_pair_was_measured() -> None:
    predictor = InterferencePredictor(InterferenceParams(queueing=1.0))
    speeds = PairSpeeds(RUNS, SOLOS, predictor)
    assert speeds.speed(job("x", A), [[job("y", B), job("z", C)]]) == pytest.approx(predictor.speeds([A, B, C])[0])
    assert not speeds.measured(A.key, [B.key, C.key])


def test_a_job_on_several_gpus_runs_at_its_slowest_gpus_speed() -> None:
    speeds = PairSpeeds(RUNS, SOLOS)
    assert speeds.speed(job("x", A), [[job("y", C)], [job("z", B)], []]) == 0.62
