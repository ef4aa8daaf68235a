"""Interference-aware sharing end to end: one workload of GPU-sharing jobs in the dynamic simulator, five rules.

    python bench/colocation_sim.py [--pairs FILE] [--solo FILE] [--jobs N] [--load X[,Y...]] [--seeds 0,1,2]
                                   [--gpus-per-node 4] [--nodes 8] [--in-sample] [--holdout-models 3]
                                   [--controller-as-compute]

Defaults read Lucid's RTX 3090 tables from ``../shared/data/colocation`` (non-commercial licence: read at run
time, never stored in the product). Co-located jobs run at the measured pair speeds (``PairSpeeds``); the
rules are no sharing, blind packing, Alnair's 70 % summed-utilization rule, the best summed-utilization
threshold, and kubecell's predicted-slowdown rule, the last two calibrated on the pairs of the models not
held out (``--in-sample``: on every pair); ``kubecell + score`` is kubecell's rule placed with the
interference score mixed into the packing score (``kubecell:1+interference:1``); ``kubecell adaptive`` adapts
to whether jobs wait (Alnair's 70 % rule while nothing waits, kubecell's rule at a looser floor while jobs
queue); ``kubecell + history`` is the adaptive rule whose idle part first asks what the
pair did when it shared a GPU before (a history learned on an earlier workload; ``history, cold``: learned
from nothing as the run goes; ``history, as measured``: learned as a cluster's profiler measures it, from
utilization, capped at 1 and noisy, with the cluster's floor 0.95; ``history, short readings``: the same, each
speed also cut by how far the pair table's own GPU reading of that pair falls short of one job at a time).
See ``kubecell.sim.colocation.experiment`` for the setup. ``--controller-as-compute``: the rules see each job's
memory-controller utilization as its compute's, as the scheduler's job history does on a cluster that exports
no controller series (the jobs still run at their measured speeds).

First it prints how the pair table's GPU readings add up: per band of summed solo utilization, the reading
while the two shared over the sum of each one's solo utilization times its speed (at most 100 %), and how
many pairs that ran at 0.95x or faster a reading-based speed would still show at 0.95x.

For each load it prints, per rule, the means over seeds of: average JCT (with the lowest and highest seed's),
p50 / p99 JCT, makespan, GPU-hours (a GPU holding any job, however many, counts once), the mean speed of jobs
while sharing, the share of job-time run below 0.8x of solo speed, the share of job-time run shared, and the
share of shared job-time at measured rather than predicted speeds. Then kubecell's average JCT over each
rule's, and in how many seeds kubecell's average JCT is below no sharing's, blind's and the 70 % rule's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import JobKey, SharedRun, SoloProfile
from kubecell.core.interference.history import MEASURED_FLOOR
from kubecell.inputs.colocation import load_shared_runs, load_solo_profiles
from kubecell.sim.colocation.experiment import RULES, ExperimentConfig, ExperimentResult, run_experiment

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "colocation"
BASELINES = ("no sharing", "blind", "alnair 70 %")
OURS = ("kubecell", "kubecell + score", "kubecell adaptive", "kubecell + history", "history, cold",
        "history, as measured", "history, short readings")


def numbers(text: str, kind: type[float] | type[int]) -> list[float] | list[int]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def mean(values: list[float]) -> float:
    finite = [value for value in values if not math.isnan(value)]
    return statistics.fmean(finite) if finite else math.nan


SHORTFALL_BANDS = ((0.0, 70.0), (70.0, 100.0), (100.0, 130.0), (130.0, 200.0))


def reading_report(runs: list[SharedRun], solos: dict[JobKey, SoloProfile]) -> None:
    rows = []
    for run in runs:
        short = run.reading_shortfall(solos) if len(run.jobs) == 2 else None
        if short is not None:
            summed = sum(solo.gpu_util for solo in run.profiles(solos))
            rows.append((summed, short, min(min(run.speeds), 1.0)))
    if not rows:
        print("no pair has a GPU reading (gpu_util column): the readings' shortfall is not known")
        return
    print("GPU reading while shared / sum of solo utilization x speed (one job at a time), per summed solo "
          "utilization:")
    for low, high in SHORTFALL_BANDS:
        band = sorted(short for summed, short, _ in rows if low < summed <= high)
        if band:
            print(f"  {low:3.0f}-{high:3.0f} %: {len(band):4d} pairs, median {statistics.median(band):.2f}, "
                  f"mean {statistics.fmean(band):.2f}")
    good = [(short, speed) for _, short, speed in rows if speed >= MEASURED_FLOOR]
    kept = sum(speed * min(short, 1.0) >= MEASURED_FLOOR for short, speed in good)
    print(f"  pairs whose slower job ran at {MEASURED_FLOOR}x or faster: {len(good)}; read through the shortfall, "
          f"{kept} of them still at {MEASURED_FLOOR}x or faster")


def report(load: float, results: list[ExperimentResult]) -> None:
    config = results[0].config
    print(f"\nload {load:g} ({config.jobs} jobs, {config.nodes} x {config.gpus_per_node} GPUs, "
          f"seeds {', '.join(str(result.config.seed) for result in results)})")
    for result in results:
        print(f"  seed {result.config.seed}: {result.calibration.describe()}")
    print(f"  {'rule':24s} {'avg JCT h (min-max)':>21s} {'p50 h':>6s} {'p99 h':>6s} {'makespan h':>10s} "
          f"{'GPU-h':>7s} {'speed shared':>12s} {'< 0.8x':>7s} {'shared':>7s} {'measured':>8s}")
    for rule in RULES:
        rows = [result.results[rule] for result in results]
        jct = [row.avg_jct / 3600 for row in rows]
        p50, p99 = mean([row.p50_jct / 3600 for row in rows]), mean([row.p99_jct / 3600 for row in rows])
        below, shared = mean([row.below_floor for row in rows]), mean([row.shared_time for row in rows])
        print(f"  {rule:24s} {mean(jct):7.3f} ({min(jct):5.2f}-{max(jct):5.2f}) {p50:6.2f} {p99:6.2f} "
              f"{mean([row.makespan / 3600 for row in rows]):10.1f} {mean([row.gpu_hours for row in rows]):7.0f} "
              f"{mean([row.shared_speed for row in rows]):12.3f} {100 * below:6.1f}% {100 * shared:6.1f}% "
              f"{100 * mean([row.measured for row in rows]):7.1f}%")
    for ours in OURS:
        print(f"  {ours} avg JCT / rule's (mean over seeds, min-max):")
        for rule in RULES:
            if rule in OURS:
                continue
            ratios = [result.results[ours].avg_jct / result.results[rule].avg_jct for result in results]
            print(f"    / {rule:15s} {mean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
        wins = sum(all(result.results[ours].avg_jct < result.results[rule].avg_jct for rule in BASELINES)
                   for result in results)
        print(f"  target ({ours} avg JCT below no sharing, blind and 70 %): met in {wins} of {len(results)} seeds")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=DATA / "lucid_colocate_pairs.csv")
    parser.add_argument("--solo", type=Path, default=DATA / "lucid_single_data.csv")
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--load", type=lambda text: numbers(text, float), default=[1.2],
                        help="offered GPU demand / GPUs; a comma-separated list runs each")
    parser.add_argument("--seeds", type=lambda text: numbers(text, int), default=[0, 1, 2])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--in-sample", action="store_true", help="calibrate the rules on every pair")
    parser.add_argument("--holdout-models", type=int, default=3, help="models left out of calibration")
    parser.add_argument("--controller-as-compute", action="store_true",
                        help="the rules see each job's memory-controller utilization as its compute's (a cluster "
                             "that exports no controller series)")
    args = parser.parse_args()
    if args.jobs < 1 or args.nodes < 1 or args.gpus_per_node < 1:
        parser.error("--jobs, --nodes and --gpus-per-node take a whole number of at least 1")
    if not all(math.isfinite(load) and 0 < load <= 100 for load in args.load):
        parser.error(f"--load {args.load}: each offered load is a number above 0 and at most 100")
    if any(seed < 0 for seed in args.seeds):
        parser.error(f"--seeds {args.seeds}: seeds are whole numbers of at least 0")
    for path in (args.pairs, args.solo):
        if not path.is_file():
            sys.exit(f"{path}: not found. The Lucid tables live in ../shared/data/colocation next to the "
                     "repository; pass --pairs and --solo to use other measurements.")
    try:
        solos = load_solo_profiles(args.solo)
        runs = load_shared_runs(args.pairs, solos)
    except InvalidInputError as error:
        sys.exit(str(error))
    started = time.perf_counter()
    reading_report(runs, solos)
    print(f"{len(runs)} measured runs, {len(solos)} solo profiles; calibration "
          f"{'in-sample (every pair)' if args.in_sample else f'held out: {args.holdout_models} models per seed'}")
    for load in args.load:
        try:
            results = [run_experiment(runs, solos, ExperimentConfig(
                nodes=args.nodes, gpus_per_node=args.gpus_per_node, jobs=args.jobs, load=load, seed=seed,
                in_sample=args.in_sample, holdout_models=args.holdout_models,
                controller_known=not args.controller_as_compute)) for seed in args.seeds]
        except InvalidInputError as error:  # a table too small to hold models out of, an impossible setting
            sys.exit(str(error))
        report(load, results)
    print(f"\nwall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
