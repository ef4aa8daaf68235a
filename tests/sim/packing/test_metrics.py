"""Arrival-bucketed metrics of the packing experiment and their per-policy summary."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kubecell.sim.packing.experiment import RunRecord
from kubecell.sim.packing.metrics import ARRIVED_PCT, PolicySummary, RunCurves, bucket_means, curves_of, stat


def means(arrived: list[float], values: list[float]) -> np.ndarray:
    return bucket_means(np.array(arrived, np.float64), np.array(values, np.float64))


def test_buckets_round_half_to_even() -> None:
    out = means([0.5, 1.5, 2.5, 3.5, 4.4999], [10, 20, 30, 40, 50])
    # 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4, 4.4999 -> 4
    assert out[0] == 10
    assert out[2] == pytest.approx(25)
    assert out[4] == pytest.approx(45)


def test_empty_bucket_borrows_its_neighbours_and_is_nan_when_nothing_is_near() -> None:
    out = means([0.5, 1.5, 2.5, 3.5], [10, 20, 30, 40])  # buckets 0, 2, 2, 4
    assert out[1] == pytest.approx((10 + 20 + 30) / 3)  # events of buckets 0..2
    assert out[3] == pytest.approx((20 + 30 + 40) / 3)  # events of buckets 2..4
    assert out[5] == pytest.approx(40)  # only bucket 4 is within one point
    assert np.isnan(out[6:]).all()
    assert out.shape == ARRIVED_PCT.shape


def test_first_and_last_buckets() -> None:
    out = means([1.0, 131.2], [7, 9])
    assert out[0] == pytest.approx(7)  # borrows 0..1 (there is no -1)
    assert out[130] == pytest.approx(9)  # borrows 129..131: events just past 130 % still count
    assert np.isnan(means([140.0, -3.0], [1, 2])).all()  # far outside the axis: ignored


def test_non_finite_values_are_ignored() -> None:
    out = means([10, 10, 10, 20], [1, np.nan, 3, np.nan])
    assert out[10] == pytest.approx(2)
    assert np.isnan(out[20])  # the only event there has no value, and 19..21 has nothing else


def test_custom_axis() -> None:
    out = bucket_means(np.array([5.0, 7.0]), np.array([1.0, 3.0]), np.array([5, 6, 7, 9], np.int64))
    assert out[0] == 1
    assert out[1] == pytest.approx(2)
    assert out[2] == 3
    assert np.isnan(out[3])


def record(**overrides: object) -> RunRecord:
    fields: dict[str, object] = {
        "policy": "fgd",
        "seed": 42,
        "cluster_gpu_milli": 10_000,
        # arrived 10, 20, 30, 130 % of a 10-GPU cluster
        "arrived": np.array([1000, 2000, 3000, 13000], np.int64),
        "allocated": np.array([1000, 2000, 2000, 10000], np.int64),
        "fragment": np.array([900.0, 2000.0, 4000.0, 0.0]),
        "idle": np.array([9000, 8000, 8000, 0], np.int64),
        "placed": 3,
        "failed": 1,
        "seconds": 0.25,
    }
    fields.update(overrides)
    return RunRecord(**fields)  # type: ignore[arg-type]


def test_curves_of_hand_built_record() -> None:
    curves = curves_of(record())
    assert (curves.policy, curves.seed, curves.placed, curves.failed, curves.seconds) == ("fgd", 42, 3, 1, 0.25)
    assert curves.allocated_pct[10] == pytest.approx(10)
    assert curves.allocated_pct[11] == pytest.approx(10)  # empty: borrows bucket 10
    assert curves.allocated_pct[20] == pytest.approx(20)
    assert curves.allocated_pct[30] == pytest.approx(20)
    assert np.isnan(curves.allocated_pct[100])
    assert curves.allocated_pct[130] == pytest.approx(100)
    assert curves.unallocated_pct[130] == pytest.approx(0)
    assert curves.unallocated_pct[20] == pytest.approx(80)

    assert curves.frag_amount_pct[10] == pytest.approx(9)  # 900 of 10000 milli
    assert curves.frag_amount_pct[30] == pytest.approx(40)
    assert curves.frag_amount_pct[130] == pytest.approx(0)
    assert curves.frag_ratio_pct[10] == pytest.approx(10)  # 900 of 9000 idle
    assert curves.frag_ratio_pct[20] == pytest.approx(25)
    assert curves.frag_ratio_pct[30] == pytest.approx(50)
    assert np.isnan(curves.frag_ratio_pct[130])  # nothing idle: the ratio is undefined, not 0 or inf


def test_curves_average_every_event_in_a_bucket() -> None:
    # three arrivals land in bucket 50 of a 100-GPU cluster
    curves = curves_of(
        record(
            cluster_gpu_milli=100_000,
            arrived=np.array([49_600, 50_000, 50_400], np.int64),
            allocated=np.array([49_600, 49_600, 50_000], np.int64),
            fragment=np.array([1000.0, 2000.0, 3000.0]),
            idle=np.array([50_400, 50_400, 50_000], np.int64),
        )
    )
    assert curves.allocated_pct[50] == pytest.approx((49.6 + 49.6 + 50.0) / 3)
    assert curves.frag_amount_pct[50] == pytest.approx(2.0)


def constant_run(seed: int, allocated: float, frag_ratio: float, seconds: float = 1.0) -> RunCurves:
    n = len(ARRIVED_PCT)
    return RunCurves(
        policy="bestfit",
        seed=seed,
        allocated_pct=np.full(n, allocated),
        frag_amount_pct=np.full(n, 5.0),
        frag_ratio_pct=np.full(n, frag_ratio),
        placed=100,
        failed=seed - 40,
        seconds=seconds,
    )


def test_policy_summary_as_dict() -> None:
    summary = PolicySummary("bestfit", [constant_run(43, 94.0, 30.0, 0.5), constant_run(42, 90.0, 20.0, 0.75)])
    data = summary.as_dict()
    json.dumps(data, allow_nan=False)  # summary.json must be strict JSON
    assert data["policy"] == "bestfit"
    assert data["seeds"] == [42, 43]
    sample_sd = round(math.sqrt(8.0), 4)  # values 10 and 6 around 8, ddof=1 (population SD would be 2)
    assert data["unallocated_gpu_pct_at_100"] == {"mean": 8.0, "sd": sample_sd}
    assert data["unallocated_gpu_pct_at_130"] == {"mean": 8.0, "sd": sample_sd}
    frag = data["frag_ratio_pct_at"]
    assert isinstance(frag, dict)
    assert set(frag) == {"50", "80", "90", "100"}
    assert frag["90"] == {"mean": 25.0, "sd": round(math.sqrt(50.0), 4)}
    assert data["failed_pods"] == {"mean": 2.5, "sd": round(math.sqrt(0.5), 4)}
    assert data["decisions"] == (100 + 3) + (100 + 2)
    assert data["seconds"] == pytest.approx(1.25)


def test_policy_summary_with_one_seed_and_undefined_values() -> None:
    run = constant_run(42, 90.0, 20.0)
    run.frag_ratio_pct[:] = np.nan
    data = PolicySummary("bestfit", [run]).as_dict()
    json.dumps(data, allow_nan=False)
    assert data["unallocated_gpu_pct_at_130"] == {"mean": 10.0, "sd": 0.0}
    assert data["frag_ratio_pct_at"] == {x: {"mean": None, "sd": None} for x in ("50", "80", "90", "100")}


def test_stat_uses_sample_standard_deviation_and_skips_nan() -> None:
    result = stat([1.0, 2.0, 3.0, float("nan")])
    assert result.mean == pytest.approx(2.0)
    assert result.sd == pytest.approx(1.0)  # ddof=1; the population SD would be 0.816
    assert stat([5.0]).sd == 0.0
    assert math.isnan(stat([]).mean)


def test_mean_curve_over_seeds() -> None:
    summary = PolicySummary("bestfit", [constant_run(42, 90.0, 20.0), constant_run(43, 94.0, 30.0)])
    mean, sd = summary.mean_curve("unallocated_pct")
    assert mean == pytest.approx(np.full(len(ARRIVED_PCT), 8.0))
    assert sd == pytest.approx(np.full(len(ARRIVED_PCT), math.sqrt(8.0)))
