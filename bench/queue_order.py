"""History-based queue order in the dynamic simulator: a VC's waiting jobs first come, first served (``age``)
against shortest-expected-first with the run times the simulation's own job history gives (``history``:
each job is submitted with its family's median so far, and adds its own run time when it finishes, as
``kubecell profile collect`` and ``kubecell scheduler --history`` do on a cluster), and against the same order
given the true run times (``oracle``, the bound no estimate can pass); ``backfill`` adds EASY backfill by
history into starvation reservations (``EngineOptions.backfill_margin``).

The workload is synthetic but anchored in a real distribution: no public trace here has job families with their
run times (the Philly per-VC lists are not in ``../shared/data``), so each of ``--families`` families takes its
median run time from the 83,154 Philly job run times of ``../shared/data/philly/derived_timeseries`` (Alibaba's
NSDI '22 extract, zero-second jobs dropped; capped at two days), its GPUs per job from {1: 60 %, 2: 15 %,
4: 15 %, 8: 10 %}, and its jobs' run times vary around the median by a lognormal factor (``--spread``, sigma 0.8 by
default: within a family the p90 job runs ~3x the median). Families are split between two VCs that are each
guaranteed half of an 8 x 8-GPU cluster; arrivals are Poisson at ``--load`` (offered GPU-seconds per second over
GPUs).

    python bench/queue_order.py [--jobs 2000] [--load 1.2] [--seeds 0,1,2] [--families 60] [--spread 0.8]
                                [--margins 2]

``--margins 2,3`` runs the ``backfill`` order once per margin (rows ``backfill x2``, ``backfill x3``).

Printed per order, the means over seeds of: average JCT (and its lowest and highest seed), p50 / p99 JCT, the
average and longest wait, and the share of jobs that had an estimate when they were submitted.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.estimates import DurationHistory
from kubecell.core.model import MILLI_PER_GPU, Request, make_node
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.sim.dynamic.simulator import DynamicSimulation

RUNTIMES = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "philly" / "derived_timeseries"
            / "philly_runtime_from_alibaba_nsdi22.csv")
ORDERS = ("age", "history", "backfill", "oracle")
BACKFILL_MARGIN = 2.0
"""``backfill``: ``history`` plus EASY backfill into starvation reservations when ``now + 2 x`` the job's
expected run time is before the region's expected end (within a family, a run is below twice the median about
80 % of the time at the default spread). ``--margins`` measures others."""
GPU_CHOICES, GPU_WEIGHTS = (1, 2, 4, 8), (0.6, 0.15, 0.15, 0.1)
NODES, GPUS_PER_NODE = 8, 8
MAX_RUN_SECONDS = 2 * 86_400.0
"""Run times are capped at two days (Philly's longest run for weeks): a handful of such jobs would otherwise
carry most of the offered load long after arrivals stop, and every order would wait only for them."""


@dataclass(frozen=True)
class Figures:
    avg_jct: float
    p50_jct: float
    p99_jct: float
    avg_wait: float
    max_wait: float
    estimated: float


class CountingHistory(DurationHistory):
    """A job history that counts the estimates it gives: the jobs that had one when they were submitted."""

    def __init__(self) -> None:
        super().__init__()
        self.given = 0

    def estimate(self, keys: Sequence[Hashable]) -> float | None:
        found = super().estimate(keys)
        self.given += found is not None
        return found


def runtimes(path: Path) -> np.ndarray:
    with path.open() as handle:
        values = [float(row["runtime"]) for row in csv.DictReader(handle)]
    return np.array([value for value in values if value > 0], np.float64)


def workload(pool: np.ndarray, jobs: int, families: int, spread: float, load: float, seed: int) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    medians = rng.choice(pool, size=families)
    gpus = rng.choice(GPU_CHOICES, size=families, p=GPU_WEIGHTS)
    family_of = rng.integers(families, size=jobs)
    work = np.clip(medians[family_of] * rng.lognormal(0.0, spread, size=jobs), 60.0, MAX_RUN_SECONDS)
    demand = float(np.sum(work * gpus[family_of]))
    rate = load * NODES * GPUS_PER_NODE * jobs / demand  # arrivals per second giving the offered load
    submits = np.cumsum(rng.exponential(1.0 / rate, size=jobs))
    specs = []
    for index in range(jobs):
        family = int(family_of[index])
        count = int(gpus[family])
        name = f"job-{index}"
        specs.append(JobSpec(name=name, vc="a" if family % 2 == 0 else "b",
                             member=Request(name, cpu_milli=1000, gpu_count=count, gpu_milli=MILLI_PER_GPU),
                             submit_time=float(submits[index]), work=float(work[index]),
                             labels=(("family", f"f{family}"),)))
    return specs


def simulate(order: str, specs: list[JobSpec], margin: float = BACKFILL_MARGIN) -> Figures:
    nodes = [make_node(f"n{i}", cpu_milli=96_000, memory_mib=1 << 19, gpu_count=GPUS_PER_NODE,
                       gpu_model="V100M32") for i in range(NODES)]
    half = NODES * GPUS_PER_NODE // 2
    tenants = resolve_tenants({"virtualClusters": {"a": {"gpus": half}, "b": {"gpus": half}}}, CellForest(nodes))
    options = PRESETS["kubecell"].with_(queue_order="age" if order == "age" else "shortest-expected",
                                        backfill_margin=margin if order == "backfill" else None)
    history = CountingHistory() if order in ("history", "backfill") else None
    jobs = [replace(spec, expected_seconds=spec.work) for spec in specs] if order == "oracle" else specs
    simulation = DynamicSimulation(nodes, tenants, options, jobs, sample_seconds=0, durations=history)
    result = simulation.run()
    records = [r for r in result.records if r.completion_time is not None and r.first_start is not None]
    jct = np.array([r.completion_time for r in records], np.float64)
    wait = np.array([r.first_start - r.submit for r in records], np.float64)  # type: ignore[operator]
    share = 1.0 if order == "oracle" else 0.0 if history is None else history.given / len(specs)
    return Figures(float(jct.mean()), float(np.percentile(jct, 50)), float(np.percentile(jct, 99)),
                   float(wait.mean()), float(wait.max()), share)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runtimes", type=Path, default=RUNTIMES)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--load", type=float, default=1.2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--families", type=int, default=60)
    parser.add_argument("--spread", type=float, default=0.8)
    parser.add_argument("--margins", default=f"{BACKFILL_MARGIN:g}",
                        help="backfill margins, comma-separated (each at least 1): one backfill row per margin")
    args = parser.parse_args()
    try:
        margins = list(dict.fromkeys(float(value) for value in args.margins.split(",")))  # each once
    except ValueError:
        parser.error(f"--margins {args.margins!r}: numbers, comma-separated")
    if not margins or not all(math.isfinite(m) and m >= 1 for m in margins):
        parser.error(f"--margins {args.margins!r}: every margin must be finite and at least 1")
    if not args.runtimes.is_file():
        print(f"Philly run times absent: {args.runtimes} (see ../shared/data/philly/SOURCE.md)", file=sys.stderr)
        return 2
    pool = runtimes(args.runtimes)
    seeds = [int(part) for part in args.seeds.split(",") if part.strip()]
    print(f"{len(pool)} Philly run times (median {np.median(pool) / 3600:.2f} h); {args.jobs} jobs in "
          f"{args.families} families (spread {args.spread}), load {args.load}, {NODES} x {GPUS_PER_NODE} GPUs, "
          f"2 VCs, seeds {seeds}")
    runs = [(order, margin, order if order != "backfill" or len(margins) == 1 else f"backfill x{margin:g}")
            for order in ORDERS for margin in (margins if order == "backfill" else [BACKFILL_MARGIN])]
    results: dict[str, list[Figures]] = {label: [] for _, _, label in runs}
    for seed in seeds:
        specs = workload(pool, args.jobs, args.families, args.spread, args.load, seed)
        for order, margin, label in runs:
            results[label].append(simulate(order, specs, margin))
    print(f"  {'order':12s} {'avg JCT h (min-max)':>21s} {'p50 h':>7s} {'p99 h':>7s} {'avg wait h':>10s} "
          f"{'max wait h':>10s} {'estimated':>9s}")
    for order, rows in results.items():
        avg = [row.avg_jct / 3600 for row in rows]
        print(f"  {order:12s} {statistics.fmean(avg):7.2f} ({min(avg):5.2f}-{max(avg):5.2f}) "
              f"{statistics.fmean(r.p50_jct for r in rows) / 3600:7.2f} "
              f"{statistics.fmean(r.p99_jct for r in rows) / 3600:7.1f} "
              f"{statistics.fmean(r.avg_wait for r in rows) / 3600:10.2f} "
              f"{statistics.fmean(r.max_wait for r in rows) / 3600:10.1f} "
              f"{statistics.fmean(r.estimated for r in rows):9.0%}")
    for order in (label for label in results if label != "age"):
        ratios = [h.avg_jct / a.avg_jct for h, a in zip(results[order], results["age"], strict=True)]
        print(f"  {order} avg JCT / age's: {statistics.fmean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
              + ("" if math.isfinite(statistics.fmean(ratios)) else " (no finished job)"))
    for order in (label for label in results if label.startswith("backfill")):
        better = sum(b.avg_jct < h.avg_jct for b, h in zip(results[order], results["history"], strict=True))
        print(f"  {order}: avg JCT below history's in {better} of {len(seeds)} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
