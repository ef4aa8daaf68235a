"""The packing experiment's metrics, bucketed by arrived workload as in the FGD paper's figures.

For each integer x in 0..130, take every arrival event whose arrived GPU request rounds (half to even,
as the authors' pandas script does) to x % of cluster capacity, and average: allocated GPU %
(Fig. 9(a)), fragmentation amount as % of all GPUs and fragmentation ratio as % of idle GPUs (Fig. 7).
An empty bucket borrows the events of x-1..x+1. Seeds are then summarised by mean and sample SD.

A figure no event measured (the arrivals stopped below its point, or no GPU was idle for a ratio) is
undefined: ``null`` in summary.json with the reason under ``not_measured``, ``n/a`` with that reason in
the console and the HTML report, never NaN.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kubecell.sim.packing.experiment import RunRecord

FloatArray = npt.NDArray[np.float64]

ARRIVED_PCT = np.arange(0, 131)
"""The x axis: arrived GPU request as a percentage of cluster GPU capacity."""
REPORT_POINTS = (50, 80, 90, 100, 110, 120, 130)
FRAG_POINTS = (50, 80, 90, 100)


def bucket_means(arrived_pct: FloatArray, values: FloatArray, xs: npt.NDArray[np.int64] = ARRIVED_PCT) -> FloatArray:
    """Mean of ``values`` per arrived-% bucket (NaN where no event lies within one point)."""
    bucket = np.round(arrived_pct).astype(np.int64)
    keep = (bucket >= 0) & (bucket <= xs[-1] + 1) & np.isfinite(values)
    size = int(xs[-1]) + 3
    sums = np.bincount(bucket[keep], weights=values[keep], minlength=size)
    counts = np.bincount(bucket[keep], minlength=size).astype(np.float64)
    out = np.full(len(xs), np.nan)
    for i, x in enumerate(xs):
        if counts[x] > 0:
            out[i] = sums[x] / counts[x]
        else:
            low, high = max(x - 1, 0), x + 2
            n = counts[low:high].sum()
            if n > 0:
                out[i] = sums[low:high].sum() / n
    return out


@dataclass(frozen=True, slots=True)
class RunCurves:
    """One run reduced to its bucketed curves and totals (small enough to send between processes)."""

    policy: str
    seed: int
    allocated_pct: FloatArray
    frag_amount_pct: FloatArray
    frag_ratio_pct: FloatArray
    placed: int
    failed: int
    seconds: float
    arrived_pct_max: float = float(ARRIVED_PCT[-1])
    """Arrived GPU request at the end of the run, as % of capacity: figures beyond it are undefined."""

    @property
    def unallocated_pct(self) -> FloatArray:
        result: FloatArray = 100.0 - self.allocated_pct
        return result


def curves_of(record: RunRecord) -> RunCurves:
    total = float(record.cluster_gpu_milli)
    arrived_pct = record.arrived / total * 100.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(record.idle > 0, record.fragment / record.idle * 100.0, np.nan)
    return RunCurves(
        policy=record.policy,
        seed=record.seed,
        allocated_pct=bucket_means(arrived_pct, record.allocated / total * 100.0),
        frag_amount_pct=bucket_means(arrived_pct, record.fragment / total * 100.0),
        frag_ratio_pct=bucket_means(arrived_pct, ratio),
        placed=record.placed,
        failed=record.failed,
        seconds=record.seconds,
        arrived_pct_max=float(arrived_pct[-1]) if len(arrived_pct) else 0.0,
    )


@dataclass(frozen=True, slots=True)
class Stat:
    mean: float
    sd: float

    def as_dict(self) -> dict[str, float | None]:
        return {"mean": _clean(self.mean), "sd": _clean(self.sd)}


def _clean(value: float) -> float | None:
    return None if not np.isfinite(value) else round(float(value), 4)


def stat(values: Sequence[float] | FloatArray) -> Stat:
    array = np.asarray(values, dtype=np.float64)
    array = array[np.isfinite(array)]
    if array.size == 0:
        return Stat(float("nan"), float("nan"))
    sd = float(array.std(ddof=1)) if array.size > 1 else 0.0
    return Stat(float(array.mean()), sd)


@dataclass(slots=True)
class PolicySummary:
    """All runs of one policy: the figures ``summary.json`` reports."""

    policy: str
    runs: list[RunCurves] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return sorted(run.seed for run in self.runs)

    def at(self, metric: str, x: int) -> Stat:
        """Mean and SD over seeds of a curve's value at arrived = x %."""
        return stat([getattr(run, metric)[x] for run in self.runs])

    def why_undefined(self, metric: str, x: int) -> str | None:
        """Why ``at(metric, x)`` has no value (None when it has one), in words a reader can act on."""
        if np.isfinite(self.at(metric, x).mean):
            return None
        reached = max((run.arrived_pct_max for run in self.runs), default=0.0)
        if reached < x - 1.5:  # an event counts for x when it rounds to x-1..x+1
            return (f"arrivals reached only {reached:.0f} % of GPU capacity, so nothing was measured at {x} % "
                    f"(inflate the workload to at least {x / 100:.2f})")
        if metric == "frag_ratio_pct":
            return f"no GPU capacity was idle around {x} % arrived, and the ratio is a share of idle capacity"
        return f"no arrival event lay within one point of {x} % arrived"

    def at_runs(self, field_name: str) -> Stat:
        """Mean and SD over seeds of a per-run total such as ``failed``."""
        return stat([getattr(run, field_name) for run in self.runs])

    def mean_curve(self, metric: str) -> tuple[FloatArray, FloatArray]:
        stacked = np.vstack([getattr(run, metric) for run in self.runs])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(stacked, axis=0)
            sd = np.nanstd(stacked, axis=0, ddof=1) if len(self.runs) > 1 else np.zeros(stacked.shape[1])
        return mean, sd

    @property
    def seconds(self) -> float:
        return float(sum(run.seconds for run in self.runs))

    def not_measured(self) -> dict[str, str]:
        """summary.json key (``frag_ratio_pct_at.90`` for nested ones) -> why that figure is null."""
        reasons: dict[str, str] = {}
        for key, metric, points in _REPORTED:
            for x in points:
                reason = self.why_undefined(metric, x)
                if reason is not None:
                    reasons[key if key.endswith(f"_at_{x}") else f"{key}.{x}"] = reason
        return reasons

    def as_dict(self) -> dict[str, object]:
        decisions = sum(run.placed + run.failed for run in self.runs)
        not_measured = self.not_measured()
        return {
            "policy": self.policy,
            "seeds": self.seeds,
            "unallocated_gpu_pct_at_100": self.at("unallocated_pct", 100).as_dict(),
            "unallocated_gpu_pct_at_130": self.at("unallocated_pct", 130).as_dict(),
            "allocated_gpu_pct_at": {str(x): self.at("allocated_pct", x).as_dict() for x in REPORT_POINTS},
            "frag_ratio_pct_at": {str(x): self.at("frag_ratio_pct", x).as_dict() for x in FRAG_POINTS},
            "frag_amount_pct_at": {str(x): self.at("frag_amount_pct", x).as_dict() for x in FRAG_POINTS},
            "failed_pods": self.at_runs("failed").as_dict(),
            "decisions": decisions,
            "seconds": round(self.seconds, 3),
            "decisions_per_second": round(decisions / self.seconds, 1) if self.seconds > 0 else None,
            "arrived_gpu_pct_reached": _clean(min((run.arrived_pct_max for run in self.runs), default=0.0)),
            **({"not_measured": not_measured} if not_measured else {}),
        }


_REPORTED: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("unallocated_gpu_pct_at_100", "unallocated_pct", (100,)),
    ("unallocated_gpu_pct_at_130", "unallocated_pct", (130,)),
    ("allocated_gpu_pct_at", "allocated_pct", REPORT_POINTS),
    ("frag_ratio_pct_at", "frag_ratio_pct", FRAG_POINTS),
    ("frag_amount_pct_at", "frag_amount_pct", FRAG_POINTS),
)
"""(summary.json key, curve, arrived % points) of every figure ``as_dict`` reports, so ``not_measured`` covers
exactly those."""
