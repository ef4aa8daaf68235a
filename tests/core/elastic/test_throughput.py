"""Pollux's throughput model and its fit: known parameters are recovered, priors fill what reports miss."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from kubecell.core.elastic.throughput import (
    FitPriors,
    ThroughputParams,
    compute_scale,
    compute_time,
    examples_per_second,
    fit_throughput,
    network_time,
    overlap,
    step_time,
)
from tests.core.elastic.support import BATCHES, SHAPES, TRUE

Table = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64],
              NDArray[np.float64]]


def table(params: ThroughputParams, shapes: tuple[tuple[int, int], ...] = SHAPES,
          batches: tuple[int, ...] = BATCHES) -> Table:
    rows = []
    for nodes, replicas in shapes:
        for b in batches:
            t = float(step_time(params, nodes, replicas, b))
            rows.append((nodes, replicas, b, t, t - (params.alpha_c + params.beta_c * b)))
    a = np.array(rows, dtype=np.float64)
    return a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4]


@pytest.mark.parametrize("gamma", [1.0, 2.0, 3.0])
def test_fit_recovers_known_parameters(gamma: float) -> None:
    truth = ThroughputParams(0.02, 0.001, 0.01, 0.004, 0.05, 0.01, gamma)
    fitted = fit_throughput(*table(truth))
    assert fitted.gamma == gamma
    for name in ("alpha_c", "beta_c", "alpha_r", "beta_r", "alpha_n", "beta_n"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3), name


def test_network_time_by_link() -> None:
    assert network_time(TRUE, 1, 1) == 0.0
    assert network_time(TRUE, 1, 2) == pytest.approx(0.01)
    assert network_time(TRUE, 1, 8) == pytest.approx(0.01 + 6 * 0.004)
    assert network_time(TRUE, 2, 8) == pytest.approx(0.05 + 6 * 0.01)


def test_overlap_is_sum_at_gamma_one_and_near_max_at_ten() -> None:
    assert overlap(0.3, 0.1, 1.0) == pytest.approx(0.4)
    assert overlap(0.3, 0.1, 10.0) == pytest.approx(0.3, rel=1e-4)
    assert np.isfinite(overlap(1e5, 1e5, 10.0))


def test_accumulation_adds_compute_only_micro_batches() -> None:
    one = float(step_time(TRUE, 1, 4, 64, 1))
    three = float(step_time(TRUE, 1, 4, 64, 3))
    assert three - one == pytest.approx(2 * (TRUE.alpha_c + TRUE.beta_c * 64))
    assert examples_per_second(TRUE, 1, 4, 64, 3) == pytest.approx(4 * 64 * 3 / three)


def test_single_gpu_reports_do_not_promise_free_scaling() -> None:
    fitted = fit_throughput(*table(TRUE, shapes=((1, 1),)))
    c_ref = fitted.alpha_c + fitted.beta_c * float(np.median(BATCHES))
    priors = FitPriors()
    assert fitted.alpha_r == pytest.approx(priors.intra_sync * c_ref)
    assert fitted.alpha_n >= priors.inter_over_intra * fitted.alpha_r
    assert fitted.beta_r > 0
    assert fitted.beta_n > 0
    assert fitted.gamma == 1.0
    # Eight GPUs on two nodes are predicted below eight times one GPU (OnlineGoodput does not price them at all
    # until the job has run at 4: see test_goodput's exploration limit).
    one = float(examples_per_second(fitted, 1, 1, 64))
    assert float(examples_per_second(fitted, 2, 8, 64)) < 0.8 * 8 * one


def test_single_batch_size_splits_compute_in_half() -> None:
    fitted = fit_throughput(*table(TRUE, shapes=((1, 1),), batches=(64,)))
    compute = TRUE.alpha_c + TRUE.beta_c * 64
    assert fitted.alpha_c == pytest.approx(compute / 2)
    assert fitted.beta_c * 64 == pytest.approx(compute / 2)


def test_intra_node_reports_without_inter_node_keep_inter_node_slower() -> None:
    fitted = fit_throughput(*table(TRUE, shapes=((1, 1), (1, 2), (1, 4), (1, 8))))
    assert fitted.alpha_r == pytest.approx(TRUE.alpha_r, rel=1e-3)
    assert fitted.alpha_n >= FitPriors().inter_over_intra * fitted.alpha_r


def test_fit_is_cheap() -> None:
    import time

    data = table(TRUE)
    start = time.perf_counter()
    for _ in range(50):
        fit_throughput(*data)
    assert (time.perf_counter() - start) / 50 < 0.01


def _slower_with_replicas(factor: float) -> ThroughputParams:
    return ThroughputParams(TRUE.alpha_c, TRUE.beta_c, TRUE.alpha_r, TRUE.beta_r, TRUE.alpha_n, TRUE.beta_n,
                            TRUE.gamma, scale_replicas=(2.0,), scale=(factor,))


def test_compute_scale_is_one_for_one_replica_and_flat_beyond_the_reported_counts() -> None:
    params = ThroughputParams(0.1, 0.01, 0.0, 0.0, 0.0, 0.0, 1.0, scale_replicas=(2.0, 8.0), scale=(1.5, 3.0))
    scales = compute_scale(params, np.array([1, 2, 4, 8, 64]))
    assert scales == pytest.approx([1.0, 1.5, 2.25, 3.0, 3.0])
    assert compute_scale(TRUE, 16) == pytest.approx(1.0)


def test_replica_compute_learns_a_slower_multi_replica_compute() -> None:
    truth = _slower_with_replicas(2.0)
    data = table(truth)
    rows = []
    for nodes, replicas, b, t, _ in zip(*data, strict=True):
        compute = float(compute_time(truth, b) * compute_scale(truth, replicas))
        rows.append((nodes, replicas, b, t, t - compute))
    a = np.array(rows)
    learned = fit_throughput(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], FitPriors(replica_compute=True))
    assert learned.alpha_c == pytest.approx(TRUE.alpha_c, rel=1e-6)
    assert compute_scale(learned, 8) == pytest.approx(2.0, rel=1e-6)
    for nodes, replicas in ((1, 1), (1, 4), (2, 8)):
        assert float(step_time(learned, nodes, replicas, 64)) == pytest.approx(
            float(step_time(truth, nodes, replicas, 64)), rel=1e-3)
    pollux = fit_throughput(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4])
    assert float(step_time(pollux, 1, 1, 64)) > 1.2 * float(step_time(truth, 1, 1, 64))


def test_replica_compute_never_promises_faster_compute_than_one_replica() -> None:
    data = table(TRUE)
    faster = np.where(data[1] > 1, data[4] + 0.3 * (data[3] - data[4]), data[4])  # compute 0.7x alone
    learned = fit_throughput(data[0], data[1], data[2], data[3], faster, FitPriors(replica_compute=True))
    assert compute_scale(learned, 4) == pytest.approx(1.0)
