"""Metrics of a dynamic run: what tenants experienced (delays, completion times, preemptions) and what the
cluster did (utilisation, borrowing), overall and per virtual cluster.

The headline multi-tenant figure is the *sharing anomaly* (HiveD, OSDI '20): for the jobs of a VC that
fit its guarantee, how much longer they queue in the shared cluster than on a private cluster made of
exactly the VC's guaranteed cells (``private.py``). A scheduler that honours guarantees keeps it near
zero however busy the other tenants are. It is computed over the within-guarantee jobs that started in
both runs; within-guarantee jobs that started privately but never under the policy are counted
separately (``anomaly_jobs_never_started``) rather than silently dropped.

Units: queueing delays in minutes, completion times in hours, GPU amounts in GPUs. Statistics over an
empty set are ``None`` (JSON ``null``), never NaN, so ``summary.json`` stays valid JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kubecell.sim.dynamic.private import PrivateBaseline
from kubecell.sim.dynamic.simulator import JobRecord, Sample, SimulationResult

PREEMPTION_ALARM = 3
"""Jobs preempted more often than this are counted: repeated restarts are what users notice."""

Number = float | int | None
Stats = dict[str, Number]


def _round(value: float | np.floating[Any]) -> float:
    return round(float(value), 4)


def stats(values: Iterable[float], percentiles: Sequence[int] = (50, 95, 99)) -> Stats:
    """count, mean and the given percentiles (linear interpolation) of ``values``; None when empty."""
    array = np.fromiter(values, dtype=np.float64)
    out: Stats = {"count": int(array.size), "mean": _round(array.mean()) if array.size else None}
    for p in percentiles:
        out[f"p{p}"] = _round(np.percentile(array, p)) if array.size else None
    return out


def _minutes(records: Iterable[JobRecord]) -> list[float]:
    return [r.queueing_delay / 60.0 for r in records if r.queueing_delay is not None]


def job_metrics(records: Sequence[JobRecord]) -> dict[str, Any]:
    """Metrics that depend only on job records (shared by the overall and the per-VC figures)."""
    preemptions = [r.preemptions for r in records]
    return {
        "jobs": len(records),
        "started": sum(r.first_start is not None for r in records),
        "finished": sum(r.finish is not None for r in records),
        "rejected": sum(r.rejected is not None for r in records),
        "unfinished": sum(r.rejected is None and r.finish is None for r in records),
        "within_guarantee_jobs": sum(r.within_guarantee for r in records),
        "queueing_delay_minutes": stats(_minutes(records)),
        "within_guarantee_queueing_delay_minutes": stats(_minutes(r for r in records if r.within_guarantee)),
        "jct_hours": stats((r.completion_time / 3600.0 for r in records if r.completion_time is not None),
                           (50, 95)),
        "preemptions_per_job": {
            "mean": _round(np.mean(preemptions)) if preemptions else None,
            "max": max(preemptions, default=0),
            f"jobs_over_{PREEMPTION_ALARM}": sum(p > PREEMPTION_ALARM for p in preemptions),
            "total": sum(preemptions),
        },
        "node_failures_hit": sum(r.failures for r in records),
        "gpu_hours_lost_to_preemption": _round(sum(r.lost_gpu_seconds for r in records) / 3600.0),
    }


def _weights(samples: Sequence[Sample], end: float) -> np.ndarray:
    """Each sample stands for the time until the next one (the last one until the end of the run)."""
    if not samples:
        return np.zeros(0)
    times = np.array([s.time for s in samples] + [max(end, samples[-1].time)], dtype=np.float64)
    weights = np.diff(times)
    if weights.sum() <= 0:
        return np.ones(len(samples))
    return weights


def _time_mean(values: Sequence[float], weights: np.ndarray) -> float | None:
    if not values or weights.sum() <= 0:
        return None
    return _round(np.average(np.asarray(values, dtype=np.float64), weights=weights))


def windowed_utilisation(result: SimulationResult, stop: float) -> float | None:
    """Allocated / total GPUs averaged over [start, stop] from the samples (each sample holding until the
    next). Over the whole run every policy does the same work, so utilisation differs mostly while jobs
    still arrive; after the last arrival the long tail dilutes it."""
    if not result.samples or not result.total_gpus or stop <= result.start:
        return None
    times = np.array([s.time for s in result.samples] + [max(result.end, result.samples[-1].time)], np.float64)
    lows = np.clip(times[:-1], result.start, stop)
    highs = np.clip(times[1:], result.start, stop)
    weights = highs - lows
    if weights.sum() <= 0:
        return None
    allocated = np.array([s.allocated_milli / 1000.0 for s in result.samples], np.float64)
    return _round(np.average(allocated, weights=weights) / result.total_gpus)


def allocation_metrics(result: SimulationResult, vc: str) -> dict[str, Number]:
    """Time-averaged GPUs a VC held (by class) from the periodic samples, against its guarantee."""
    weights = _weights(result.samples, result.end)
    rows = [s.per_vc.get(vc, (0.0, 0.0, 0.0)) for s in result.samples]
    guaranteed = result.guaranteed_gpus.get(vc, 0)
    used = _time_mean([g for g, _, _ in rows], weights)
    borrowed = _time_mean([b for _, b, _ in rows], weights)
    opportunistic = _time_mean([o for _, _, o in rows], weights)
    allocated = _time_mean([g + b + o for g, b, o in rows], weights)
    return {
        "guaranteed_gpus": guaranteed,
        "allocated_gpus_mean": allocated,
        "guaranteed_used_gpus_mean": used,
        "borrowed_gpus_mean": borrowed,
        "opportunistic_gpus_mean": opportunistic,
        "guarantee_used_fraction": _round(used / guaranteed) if used is not None and guaranteed else None,
        "allocated_over_guaranteed": _round(allocated / guaranteed) if allocated is not None and guaranteed else None,
    }


def sharing_anomaly(records: Sequence[JobRecord], private: Mapping[str, JobRecord] | None) -> dict[str, Number]:
    """Mean queueing delay of the VC's within-guarantee jobs under the policy minus the same jobs' mean
    delay on the private cluster (minutes), and the ratio of the two means."""
    empty: dict[str, Number] = {"sharing_anomaly_minutes": None, "sharing_anomaly_ratio": None,
                                "anomaly_jobs_compared": 0, "anomaly_jobs_never_started": 0,
                                "shared_within_guarantee_delay_minutes": None,
                                "private_within_guarantee_delay_minutes": None}
    if private is None:
        return empty
    shared: list[float] = []
    alone: list[float] = []
    never = 0
    for record in records:
        other = private.get(record.name)
        if not record.within_guarantee or other is None or other.queueing_delay is None:
            continue
        if record.queueing_delay is None:
            never += int(record.rejected is None)
            continue
        shared.append(record.queueing_delay / 60.0)
        alone.append(other.queueing_delay / 60.0)
    out = dict(empty)
    out["anomaly_jobs_compared"] = len(shared)
    out["anomaly_jobs_never_started"] = never
    if shared:
        mean_shared, mean_alone = float(np.mean(shared)), float(np.mean(alone))
        out["shared_within_guarantee_delay_minutes"] = _round(mean_shared)
        out["private_within_guarantee_delay_minutes"] = _round(mean_alone)
        out["sharing_anomaly_minutes"] = _round(mean_shared - mean_alone)
        out["sharing_anomaly_ratio"] = _round(mean_shared / mean_alone) if mean_alone > 0 else None
    return out


def private_metrics(baseline: PrivateBaseline) -> dict[str, Any]:
    """The private run of one VC: its size and the job metrics there."""
    return {"nodes": len(baseline.nodes), "gpus": baseline.gpus, "gpu_utilisation": _round(baseline.result.utilisation),
            **job_metrics(baseline.result.records)}


@dataclass(slots=True)
class PolicyMetrics:
    """Everything ``summary.json`` says about one policy."""

    policy: str
    overall: dict[str, Any]
    per_vc: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "overall": self.overall, "per_vc": self.per_vc,
                "seconds": round(self.seconds, 3)}


def fragmentation_ratio(result: SimulationResult, stop: float) -> float | None:
    """Time-averaged share of idle GPU capacity that the workload's typical jobs cannot use (FGD's
    measure against the member shapes of the trace), over the samples up to ``stop``."""
    samples = [s for s in result.samples if s.time <= stop and s.idle_milli > 0]
    if not samples:
        return None
    weights = _weights(samples, stop)
    ratios = [s.fragment_milli / s.idle_milli for s in samples]
    return _time_mean(ratios, weights)


def policy_metrics(result: SimulationResult, baselines: Mapping[str, PrivateBaseline] | None = None) -> PolicyMetrics:
    """Overall and per-VC metrics of one run, with the sharing anomaly against the private baselines."""
    baselines = baselines or {}
    weights = _weights(result.samples, result.end)
    overall: dict[str, Any] = {
        "gpus": result.total_gpus,
        "gpu_utilisation": _round(result.utilisation),
        "gpu_utilisation_until_last_arrival": windowed_utilisation(
            result, max((r.submit for r in result.records), default=result.start)),
        "simulated_hours": _round((result.end - result.start) / 3600.0),
        "gangs_broken": result.gangs_broken,
        "pending_jobs_mean": _time_mean([float(s.pending) for s in result.samples], weights),
        "fragmentation_ratio_mean": fragmentation_ratio(
            result, max((r.submit for r in result.records), default=result.start)),
        **job_metrics(result.records),
    }
    by_vc: dict[str, list[JobRecord]] = {}
    for record in result.records:
        by_vc.setdefault(record.vc, []).append(record)
    names = list(result.guaranteed_gpus) + sorted(set(by_vc) - set(result.guaranteed_gpus))
    per_vc: dict[str, dict[str, Any]] = {}
    for vc in names:
        records = by_vc.get(vc, [])
        baseline = baselines.get(vc)
        per_vc[vc] = {
            **allocation_metrics(result, vc),
            **job_metrics(records),
            **sharing_anomaly(records, baseline.records if baseline is not None else None),
        }
    return PolicyMetrics(result.policy, overall, per_vc, result.wall_seconds)
