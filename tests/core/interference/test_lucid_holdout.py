"""On Lucid's measured pairs (RTX 3090), the calibrated predictor against the best single summed-utilization
threshold, both tuned on calibration pairs only and judged on pairs of models they were never tuned on.

The protocol is the bench's (``bench/colocation.py``, default ``--holdout any``): models dealt into folds;
calibration = pairs with no held-out model; evaluation = pairs with at least one; both rules tuned to a bad
rate (a job below 0.8x) <= 1 % on calibration; counts summed over folds, and here also over five foldings
(4 folds with seeds 0-3, and leave-one-model-out) so that no single lucky split decides.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from kubecell.core.interference import (
    InterferencePredictor,
    SharedRun,
    SoloProfile,
    fit,
    tune_predicted_floor,
    tune_summed_util,
)
from kubecell.inputs.colocation import load_shared_runs, load_solo_profiles
from tests.core.interference.support import colocation_file

pytestmark = pytest.mark.shared_data

FLOOR, TARGET_RATE, GPU_MIB = 0.8, 0.01, 24576.0
Case = tuple[SharedRun, tuple[SoloProfile, ...]]


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    solos = load_solo_profiles(colocation_file("lucid_single_data.csv"))
    runs = load_shared_runs(colocation_file("lucid_colocate_pairs.csv"), solos)
    return [(run, run.profiles(solos)) for run in runs]


def models(case: Case) -> set[str]:
    return {job.model for job in case[0].jobs}


def held_out(cases: Sequence[Case], folds: int, seed: int) -> dict[str, list[int]]:
    """``{"threshold": [admitted, bad], "kubecell": [admitted, bad]}`` summed over the folds."""
    names = sorted({model for case in cases for model in models(case)})
    random.Random(seed).shuffle(names)
    totals = {"threshold": [0, 0], "kubecell": [0, 0]}
    for index in range(folds):
        hidden = set(names[index::folds])
        calibration = [case for case in cases if not models(case) & hidden]
        runs, worst = [case[1] for case in calibration], [case[0].worst_speed() for case in calibration]
        threshold = tune_summed_util(runs, worst, floor=FLOOR, target_rate=TARGET_RATE)
        predictor = InterferencePredictor(fit([case[0] for case in calibration], {p.key: p for r in runs for p in r}))
        kubecell = tune_predicted_floor(predictor, runs, worst, floor=FLOOR, target_rate=TARGET_RATE)
        assert threshold is not None
        assert kubecell is not None
        for case in cases:
            if models(case) & hidden:
                for name, rule in (("threshold", threshold), ("kubecell", kubecell)):
                    if rule.admits(case[1], GPU_MIB):
                        totals[name][0] += 1
                        totals[name][1] += case[0].worst_speed() < FLOOR
    return totals


@pytest.fixture(scope="module")
def pooled(cases: list[Case]) -> dict[str, list[int]]:
    totals = {"threshold": [0, 0], "kubecell": [0, 0]}
    for folds, seed in ((4, 0), (4, 1), (4, 2), (4, 3), (8, 0)):
        for name, (admitted, bad) in held_out(cases, folds, seed).items():
            totals[name][0] += admitted
            totals[name][1] += bad
    return totals


def test_the_tables_are_the_documented_ones(cases: list[Case]) -> None:
    assert len(cases) == 820
    low = [case for case in cases if sum(p.gpu_util for p in case[1]) <= 100.0]
    assert len(low) == 336  # SOURCE.md's 801 is on the full 1,388-row table; this is its 820-row part


def test_on_unseen_models_kubecell_admits_more_at_about_the_same_bad_rate(pooled: dict[str, list[int]]) -> None:
    (t_admitted, t_bad), (k_admitted, k_bad) = pooled["threshold"], pooled["kubecell"]
    assert k_admitted >= 1.05 * t_admitted
    assert k_bad / k_admitted <= t_bad / t_admitted + 0.005


@pytest.mark.xfail(strict=True, reason="issue 23's target is not met on held-out models: about +10 % admitted "
                   "at a bad rate 0.1 points higher (see bench/colocation.py); flip this when it is")
def test_issue_23_target_at_least_15_percent_more_at_no_higher_bad_rate(pooled: dict[str, list[int]]) -> None:
    (t_admitted, t_bad), (k_admitted, k_bad) = pooled["threshold"], pooled["kubecell"]
    assert k_admitted >= 1.15 * t_admitted
    assert k_bad * t_admitted <= t_bad * k_admitted
