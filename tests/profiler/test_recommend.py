"""Right-sizing advice from the job history: per-GPU profiles from a job's summed series, one recommendation per
family, jobs without GPU series counted and left out, and the same answer read back from a real store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from kubecell.profiler.distribution import distribution
from kubecell.profiler.history import JobHistory, JobRecord, Outcome
from kubecell.profiler.recommend import MIB, advise, usage_profile

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def job(name: str, util: list[float], memory_mib: float, *, gpus: int = 1, milli: int = 1000,
        outcome: Outcome = Outcome.SUCCEEDED, series: bool = True) -> JobRecord:
    metrics = {"gpu_utilization": distribution(util), "gpu_memory": distribution([memory_mib * MIB] * len(util))} \
        if series else {}
    return JobRecord(uid=f"uid-{name}", namespace="serving", owner_kind="Deployment", owner_name=name, created=T0,
                     pod_count=1, gpus_per_pod=gpus, milli_gpu_per_pod=milli, started=T0,
                     finished=T0 + timedelta(hours=2), outcome=outcome, metrics=metrics)


def test_a_pod_with_several_gpus_is_profiled_per_gpu() -> None:
    record = job("train-0", [1.6, 1.8, 2.0], 40_000, gpus=2)
    profile = usage_profile(record)
    assert profile is not None
    assert profile.gpu_utilization[-1] == 1.0
    assert profile.gpu_utilization[0] == 0.8
    assert profile.gpu_memory_mib[-1] == 20_000


def test_one_recommendation_per_family_beside_what_it_asked() -> None:
    records = [job(f"sd-serving-{i}", [0.02, 0.05, 0.10 + 0.02 * i], 3000 + 100 * i) for i in range(5)]
    records.append(job("sd-serving-9", [0.5], 9000, series=False))
    records.append(job("sd-serving-running", [0.9], 9000, outcome=Outcome.RUNNING))
    (advice,) = advise(records)
    assert (advice.family, advice.asked_gpus, advice.asked_milli) == ("sd-serving", 1, 1000)
    assert advice.advice.jobs == 5, "finished jobs with GPU series only"
    assert advice.without_series == 1
    # per-job p90 = each job's max (three samples): 0.10..0.18; p90 across 5 jobs = 0.18; * 1.25 = 225 -> 250
    assert advice.advice.milli == 250
    assert advice.saved_milli_per_pod == 750
    # peak 3400 MiB * 1.1 + 300 = 4040 -> 4096
    assert advice.advice.memory_mib == 4096


def test_the_advice_is_the_same_read_back_from_the_store(tmp_path: Path) -> None:
    records = [job(f"bert-{i}", [0.3, 0.4, 0.5], 8000) for i in range(3)]
    with JobHistory.open(f"sqlite:///{tmp_path}/history.db") as history:
        for record in records:
            history.save(record)
        stored = history.jobs(namespace="serving")
    assert advise(stored) == advise(records)
