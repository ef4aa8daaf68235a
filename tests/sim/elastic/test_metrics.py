"""Table 3's figures, computed as Sia's ``print_run_stats.py`` computes them, on hand-made results."""

from __future__ import annotations

import pytest

from kubecell.sim.elastic.metrics import FAMILY_KEYS, RUN_KEYS, family_metrics, p99, run_metrics
from kubecell.sim.elastic.simulator import JobRecord, SimulationResult


def record(name: str, submitted: float, completion: float | None, gpu_hours: float, restarts: int = 0) -> JobRecord:
    return JobRecord(name=name, application="cifar10", submitted=submitted, num_replicas=4, batch_size=128,
                     first_start=submitted, completion=completion, restarts=restarts, gpu_seconds=gpu_hours * 3600,
                     restart_gpu_seconds=0.0, max_gpus=4)


def result(workload: str, records: list[JobRecord]) -> SimulationResult:
    return SimulationResult("rigid", workload, "philly", 64, records=records)


def test_p99_is_sias_index() -> None:
    assert p99(list(range(100))) == 99        # int(0.99 * 100) = 99
    assert p99(list(range(160))) == 158       # int(0.99 * 160) = 158: the second largest of 160
    assert p99([5.0]) == 5.0
    assert p99([]) is None


def test_run_and_family_figures() -> None:
    hour = 3600.0
    one = result("philly/workload-1", [record("a", 0, 1 * hour, 4.0, restarts=2), record("b", hour, 4 * hour, 8.0)])
    two = result("philly/workload-2", [record("c", 600, 600 + 2 * hour, 3.0)])
    figures = run_metrics(one)
    assert set(figures) == set(RUN_KEYS)
    assert figures["avg_jct_hours"] == 2.0       # (1 + 3) / 2
    assert figures["p99_jct_hours"] == 3.0
    assert figures["makespan_hours"] == 4.0      # last completion (4 h) - first submission (0)
    assert figures["gpu_hours_per_job"] == 6.0
    assert figures["restarts_per_job"] == 1.0
    family = family_metrics([one, two])
    assert set(family) == set(FAMILY_KEYS)
    assert family["avg_jct_hours"] == 2.0        # pooled: (1 + 3 + 2) / 3
    assert family["avg_jct_hours_std"] == 0.0    # the two workloads' means are both 2 h
    assert family["makespan_hours"] == 3.0       # mean of 4 h and 2 h
    assert family["makespan_hours_std"] == 1.0
    assert family["gpu_hours_per_job"] == pytest.approx(5.0)
    assert family["gpu_hours_per_job_std"] == pytest.approx(1.5)  # per workload: 6 and 3
    assert (family["workloads"], family["jobs"], family["completed"]) == (2, 3, 3)


def test_unfinished_jobs_are_counted_not_averaged() -> None:
    figures = run_metrics(result("w", [record("a", 0, 3600.0, 1.0), record("b", 0, None, 1.0)]))
    assert (figures["jobs"], figures["completed"], figures["avg_jct_hours"]) == (2, 1, 1.0)
