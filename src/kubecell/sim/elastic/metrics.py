"""The figures of Sia's Table 3, computed the way Sia's ``utils/print_run_stats.py`` computes them.

Per run (one policy on one workload) and per trace family (all its workloads together):

- ``avg_jct_hours``: mean job completion time (completion - submission); over a family, the mean over all its
  jobs pooled (Sia's ``get_avg_jcts``), with ``avg_jct_hours_std`` the spread of the per-workload means (the
  +- of Table 3);
- ``p99_jct_hours``: the pooled JCTs sorted, the one at index ``int(0.99 * n)`` (Sia's ``get_p99_jct``);
- ``makespan_hours``: last completion - first submission, per workload; a family's is the mean (+- std);
- ``gpu_hours_per_job``: GPU-hours held (restart delays and the rest of the round a job finished in
  included, as Sia's logs count them) per job;
- ``restarts_per_job``: changes of allocation after the first start, per job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from kubecell.sim.elastic.simulator import SimulationResult

Figures = dict[str, float | int | str | None]

PAPER_TRACE = {"philly": "Philly", "saturn": "Helios", "newtrace": "newTrace"}
"""Trace family folder -> its name in the Sia paper (the Saturn cluster's workloads are its Helios rows)."""

PAPER_TABLE3: Mapping[str, Mapping[str, Mapping[str, float]]] = {
    "philly": {
        "Sia": {"avg_jct_hours": 0.6, "avg_jct_hours_std": 0.1, "p99_jct_hours": 9.5, "makespan_hours": 14.2,
                "makespan_hours_std": 1.9, "gpu_hours_per_job": 4.0, "gpu_hours_per_job_std": 0.7},
        "Pollux": {"avg_jct_hours": 1.0, "avg_jct_hours_std": 0.1, "p99_jct_hours": 14.9, "makespan_hours": 24.5,
                   "makespan_hours_std": 7.9, "gpu_hours_per_job": 5.6, "gpu_hours_per_job_std": 1.1},
        "Gavel+TunedJobs": {"avg_jct_hours": 1.9, "avg_jct_hours_std": 0.3, "p99_jct_hours": 30.0,
                            "makespan_hours": 33.8, "makespan_hours_std": 8.6, "gpu_hours_per_job": 9.0,
                            "gpu_hours_per_job_std": 6.3},
    },
    "saturn": {
        "Sia": {"avg_jct_hours": 0.7, "avg_jct_hours_std": 0.1, "p99_jct_hours": 10.9, "makespan_hours": 14.9,
                "makespan_hours_std": 1.7, "gpu_hours_per_job": 4.8, "gpu_hours_per_job_std": 0.7},
        "Pollux": {"avg_jct_hours": 1.0, "avg_jct_hours_std": 0.2, "p99_jct_hours": 15.0, "makespan_hours": 25.5,
                   "makespan_hours_std": 8.0, "gpu_hours_per_job": 5.9, "gpu_hours_per_job_std": 0.7},
        "Gavel+TunedJobs": {"avg_jct_hours": 2.5, "avg_jct_hours_std": 0.9, "p99_jct_hours": 38.7,
                            "makespan_hours": 43.0, "makespan_hours_std": 10.9, "gpu_hours_per_job": 12.1,
                            "gpu_hours_per_job_std": 3.7},
    },
    "newtrace": {
        "Sia": {"avg_jct_hours": 0.7, "avg_jct_hours_std": 0.1, "p99_jct_hours": 4.6, "makespan_hours": 52.2,
                "makespan_hours_std": 1.3, "gpu_hours_per_job": 3.0, "gpu_hours_per_job_std": 0.1},
        "Pollux": {"avg_jct_hours": 1.5, "avg_jct_hours_std": 0.2, "p99_jct_hours": 10.3, "makespan_hours": 62.3,
                   "makespan_hours_std": 4.6, "gpu_hours_per_job": 3.4, "gpu_hours_per_job_std": 0.2},
        "Gavel+TunedJobs": {"avg_jct_hours": 11.3, "avg_jct_hours_std": 3.0, "p99_jct_hours": 98.1,
                            "makespan_hours": 110.0, "makespan_hours_std": 21.5, "gpu_hours_per_job": 6.4,
                            "gpu_hours_per_job_std": 1.1},
    },
}
"""Sia (SOSP '23) Table 3 on the 64-GPU cluster (shared/data/sia-sosp23-workloads/SOURCE.md)."""

RUN_KEYS = ("policy", "family", "workload", "jobs", "completed", "avg_jct_hours", "p99_jct_hours", "makespan_hours",
            "gpu_hours_per_job", "restarts_per_job", "rounds", "wall_seconds")
FAMILY_KEYS = ("policy", "family", "workloads", "jobs", "completed", "avg_jct_hours", "avg_jct_hours_std",
               "p99_jct_hours", "makespan_hours", "makespan_hours_std", "gpu_hours_per_job", "gpu_hours_per_job_std",
               "restarts_per_job")


def _hours(seconds: float) -> float:
    return round(seconds / 3600.0, 4)


def p99(values: Sequence[float]) -> float | None:
    """Sia's p99: the sorted values at index ``int(0.99 * n)``."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(0.99 * len(ordered)), len(ordered) - 1)]


def _jcts(result: SimulationResult) -> list[float]:
    return [jct for record in result.records if (jct := record.jct) is not None]


def _makespan(result: SimulationResult) -> float | None:
    done = [r.completion for r in result.records if r.completion is not None]
    if not done:
        return None
    return max(done) - min(r.submitted for r in result.records)


def run_metrics(result: SimulationResult) -> Figures:
    """The Table 3 figures of one run."""
    jcts = _jcts(result)
    jobs = len(result.records)
    makespan = _makespan(result)
    worst = p99(jcts)
    return {
        "policy": result.policy,
        "family": result.family,
        "workload": result.workload,
        "jobs": jobs,
        "completed": len(jcts),
        "avg_jct_hours": _hours(float(np.mean(jcts))) if jcts else None,
        "p99_jct_hours": None if worst is None else _hours(worst),
        "makespan_hours": None if makespan is None else _hours(makespan),
        "gpu_hours_per_job": _hours(sum(r.gpu_seconds for r in result.records) / jobs) if jobs else None,
        "restarts_per_job": round(sum(r.restarts for r in result.records) / jobs, 4) if jobs else None,
        "rounds": result.rounds,
        "wall_seconds": round(result.wall_seconds, 3),
    }


def _std(values: Sequence[float]) -> float | None:
    return round(float(np.std(values)), 4) if values else None


def family_metrics(results: Sequence[SimulationResult]) -> Figures:
    """The Table 3 figures of one policy over the workloads of one family (all results of that pair)."""
    if not results:
        raise ValueError("no results to summarise")
    jcts = [jct for result in results for jct in _jcts(result)]
    jobs = sum(len(result.records) for result in results)
    makespans = [m for result in results if (m := _makespan(result)) is not None]
    means = [float(np.mean(j)) / 3600 for result in results if (j := _jcts(result))]
    per_job = [sum(r.gpu_seconds for r in result.records) / 3600 / len(result.records) for result in results]
    worst = p99(jcts)
    return {
        "policy": results[0].policy,
        "family": results[0].family,
        "workloads": len(results),
        "jobs": jobs,
        "completed": len(jcts),
        "avg_jct_hours": _hours(float(np.mean(jcts))) if jcts else None,
        "avg_jct_hours_std": _std(means),
        "p99_jct_hours": None if worst is None else _hours(worst),
        "makespan_hours": _hours(float(np.mean(makespans))) if makespans else None,
        "makespan_hours_std": _std([m / 3600 for m in makespans]),
        "gpu_hours_per_job": _hours(sum(r.gpu_seconds for result in results for r in result.records) / jobs),
        "gpu_hours_per_job_std": _std(per_job),
        "restarts_per_job": round(sum(r.restarts for result in results for r in result.records) / jobs, 4),
    }
