"""Metrics on hand-built results, where every figure can be worked out on paper."""

from __future__ import annotations

import json

import pytest

from kubecell.core.tenancy.config import Tenants
from kubecell.sim.dynamic.metrics import (
    allocation_metrics,
    job_metrics,
    policy_metrics,
    sharing_anomaly,
    stats,
    windowed_utilisation,
)
from kubecell.sim.dynamic.private import PrivateBaseline
from kubecell.sim.dynamic.simulator import JobRecord, Sample, SimulationResult


def record(name: str, vc: str, submit: float, start: float | None = None, finish: float | None = None, *,
           within: bool = True, preemptions: int = 0, lost: float = 0.0, rejected: str | None = None) -> JobRecord:
    r = JobRecord(name, vc, gpus=8.0, members=1, priority=0, submit=submit, first_start=start, finish=finish,
                  preemptions=preemptions, rejected=rejected, within_guarantee=within, lost_gpu_seconds=lost)
    r.first_class = None if start is None else "guaranteed"
    return r


def result(records: list[JobRecord], samples: list[Sample], *, policy: str = "kubecell") -> SimulationResult:
    return SimulationResult(policy=policy, records=records, samples=samples, total_gpus=32, start=0.0, end=7200.0,
                            gpu_seconds_allocated=8 * 3600 + 16 * 3600, gangs_broken=0, wall_seconds=0.5,
                            guaranteed_gpus={"a": 16, "b": 8})


@pytest.fixture
def shared() -> SimulationResult:
    records = [
        record("j1", "a", 0, 600, 4200),
        record("j2", "a", 0, 1200, 8400, within=False, preemptions=5, lost=3600),
        record("j3", "b", 100, rejected="too big"),
        record("j4", "b", 200, 200, within=True, preemptions=1, lost=1800),
        record("j5", "a", 300),
    ]
    samples = [Sample(0.0, 8000, {"a": (8.0, 0.0, 0.0), "b": (0.0, 0.0, 0.0)}, 2),
               Sample(3600.0, 16000, {"a": (8.0, 8.0, 0.0), "b": (0.0, 0.0, 0.0)}, 1)]
    return result(records, samples)


@pytest.fixture
def baselines() -> dict[str, PrivateBaseline]:
    def baseline(vc: str, records: list[JobRecord]) -> PrivateBaseline:
        run = SimulationResult("private", records, [], 16, 0.0, 1.0, 0.0, 0, 0.0, {vc: 16})
        return PrivateBaseline(vc, [], Tenants(()), run)

    return {"a": baseline("a", [record("j1", "a", 0, 240, 3840), record("j2", "a", 0, 0, 7200),
                                record("j5", "a", 300, 300, 400)]),
            "b": baseline("b", [record("j4", "b", 200, 260, 1000)])}


def test_stats() -> None:
    assert stats([]) == {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None}
    assert stats([1.0, 2.0, 3.0, 4.0], (50,)) == {"count": 4, "mean": 2.5, "p50": 2.5}
    assert stats(range(101))["p95"] == 95.0


def test_job_metrics(shared: SimulationResult) -> None:
    m = job_metrics(shared.records)
    assert (m["jobs"], m["started"], m["finished"], m["rejected"], m["unfinished"]) == (5, 3, 2, 1, 2)
    assert m["within_guarantee_jobs"] == 4
    assert m["queueing_delay_minutes"]["mean"] == pytest.approx(10.0)
    assert m["queueing_delay_minutes"]["p50"] == pytest.approx(10.0)
    assert m["within_guarantee_queueing_delay_minutes"]["mean"] == pytest.approx(5.0)
    assert m["jct_hours"]["count"] == 2
    assert m["jct_hours"]["mean"] == pytest.approx((4200 + 8400) / 2 / 3600, abs=1e-4)
    assert m["preemptions_per_job"] == {"mean": 1.2, "max": 5, "jobs_over_3": 1, "total": 6}
    assert m["gpu_hours_lost_to_preemption"] == pytest.approx(1.5)


def test_allocation_over_time(shared: SimulationResult) -> None:
    a = allocation_metrics(shared, "a")
    assert a["guaranteed_gpus"] == 16
    assert a["allocated_gpus_mean"] == pytest.approx(12.0)
    assert a["guaranteed_used_gpus_mean"] == pytest.approx(8.0)
    assert a["borrowed_gpus_mean"] == pytest.approx(4.0)
    assert a["guarantee_used_fraction"] == pytest.approx(0.5)
    assert a["allocated_over_guaranteed"] == pytest.approx(0.75)
    assert allocation_metrics(shared, "b")["allocated_gpus_mean"] == 0.0
    assert windowed_utilisation(shared, 300.0) == pytest.approx(8 / 32)
    assert windowed_utilisation(shared, 7200.0) == pytest.approx(12 / 32)
    assert shared.utilisation == pytest.approx(0.375)


def test_sharing_anomaly(shared: SimulationResult, baselines: dict[str, PrivateBaseline]) -> None:
    a = sharing_anomaly([r for r in shared.records if r.vc == "a"], baselines["a"].records)
    # j1 within guarantee: 10 min shared vs 4 min private; j2 is not within guarantee; j5 never started shared.
    assert a["sharing_anomaly_minutes"] == pytest.approx(6.0)
    assert a["sharing_anomaly_ratio"] == pytest.approx(2.5)
    assert (a["anomaly_jobs_compared"], a["anomaly_jobs_never_started"]) == (1, 1)
    b = sharing_anomaly([r for r in shared.records if r.vc == "b"], baselines["b"].records)
    assert b["sharing_anomaly_minutes"] == pytest.approx(-1.0)  # borrowing beat the private cluster
    assert b["sharing_anomaly_ratio"] == pytest.approx(0.0)
    none = sharing_anomaly(shared.records, None)
    assert none["sharing_anomaly_minutes"] is None
    assert none["anomaly_jobs_compared"] == 0


def test_ratio_is_null_when_private_delay_is_zero() -> None:
    shared = [record("x", "a", 0, 60, 100)]
    private = {"x": record("x", "a", 0, 0, 40)}
    out = sharing_anomaly(shared, private)
    assert out["sharing_anomaly_minutes"] == pytest.approx(1.0)
    assert out["sharing_anomaly_ratio"] is None


def test_policy_metrics_is_valid_json(shared: SimulationResult, baselines: dict[str, PrivateBaseline]) -> None:
    m = policy_metrics(shared, baselines)
    data = json.loads(json.dumps(m.as_dict(), allow_nan=False))
    assert data["policy"] == "kubecell"
    assert set(data) == {"policy", "overall", "per_vc", "seconds"}
    assert list(data["per_vc"]) == ["a", "b"]
    overall = data["overall"]
    assert overall["gpu_utilisation"] == pytest.approx(0.375)
    assert overall["gpu_utilisation_until_last_arrival"] == pytest.approx(0.25)
    assert overall["gangs_broken"] == 0
    assert overall["pending_jobs_mean"] == pytest.approx(1.5)
    assert data["per_vc"]["a"]["sharing_anomaly_minutes"] == pytest.approx(6.0)
    assert data["per_vc"]["b"]["rejected"] == 1


def test_jobs_of_unknown_vcs_get_their_own_entry() -> None:
    run = result([record("z1", "zz", 0, rejected="unknown virtual cluster 'zz'")], [])
    per_vc = policy_metrics(run).per_vc
    assert list(per_vc) == ["a", "b", "zz"]
    assert per_vc["zz"]["rejected"] == 1
    assert per_vc["zz"]["allocated_gpus_mean"] is None
