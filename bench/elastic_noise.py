"""How much of a difference in the elastic simulator's Table 3 figures is noise: the same policy on copies of the
workloads whose arrival times are moved by a few seconds.

    python bench/elastic_noise.py [--workload DIR] [--policy kubecell] [--repeats 5] [--jitter 30] [--seed 0]
                                  [--option KEY=VALUE ...] [--handover-seconds S]

Why: a round-based elastic policy is chaotic. One decision taken a round earlier or later (a job arriving at
107 s instead of 125 s is first seen at 120 s instead of 180 s) changes who gets which GPUs, and the whole
run diverges from there. A difference between two policies, or between a policy and a published figure,
means something only when it is larger than the spread of these copies. Copy 0 is the workload as it is; copy
``r`` moves every arrival later by a uniform random amount in ``[0, --jitter]`` seconds (seed ``--seed + r``),
which is below the resolution at which the traces were recorded for any user-visible purpose.

For each trace family it prints every copy's average JCT, pooled p99 JCT and mean makespan (hours), GPU-hours
and restarts per job, their mean and standard deviation over the copies, Sia's published figures (Table 3;
it gives no restart count), and in how many copies the policy is below each of them. ``--workload`` defaults
to ``../shared/data/sia-sosp23-workloads`` (see its SOURCE.md). ``--option fifo_decay=0.85`` runs kubecell's
policy with one of its ``ElasticOptions`` replaced, so that a knob is measured against the defaults the same way.
``--handover-seconds 30`` gives a GPU that one job lets go to the next only 30 s later, as a cluster does
when the giver's workers checkpoint within their grace period (see ``simulator.ElasticSimulator``).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

from kubecell.sim.elastic.metrics import PAPER_TABLE3
from kubecell.sim.elastic.runner import ElasticInputs, run_elastic
from kubecell.sim.elastic.simulator import MAX_HANDOVER_SECONDS
from kubecell.sim.elastic.workload import Workload
from sia_inputs import DATA, load_or_explain, policy_or_explain

FIGURES = (("avg JCT h", "avg_jct_hours"), ("p99 JCT h", "p99_jct_hours"), ("makespan h", "makespan_hours"),
           ("GPU h / job", "gpu_hours_per_job"), ("restarts/job", "restarts_per_job"))


def jittered(workload: Workload, jitter: float, rng: random.Random) -> Workload:
    """The workload with every arrival moved later by up to ``jitter`` seconds (arrival order kept sorted)."""
    jobs = [dataclasses.replace(job, submitted=job.submitted + rng.uniform(0.0, jitter)) for job in workload.jobs]
    jobs.sort(key=lambda job: job.submitted)
    return dataclasses.replace(workload, jobs=tuple(jobs))


def number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number in the run's figures, got {value!r}")
    return float(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workload", type=Path, default=DATA)
    parser.add_argument("--policy", default="kubecell")
    parser.add_argument("--repeats", type=int, default=5, help="copies, the first one unmoved")
    parser.add_argument("--jitter", type=float, default=30.0, help="largest move of an arrival, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--handover-seconds", type=float, default=0.0,
                        help="a GPU one job gives up reaches the next job this much later (a cluster's grace period)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="replace one of kubecell's ElasticOptions (repeatable), e.g. fifo_decay=0.85")
    args = parser.parse_args()
    if args.repeats < 2 or args.jitter < 0 or not 0 <= args.handover_seconds <= MAX_HANDOVER_SECONDS:
        parser.error(f"--repeats must be at least 2, --jitter at least 0, --handover-seconds within "
                     f"0..{MAX_HANDOVER_SECONDS:g}")
    inputs, spec = load_or_explain(args.workload), policy_or_explain(args.policy, args.option)
    if inputs is None or spec is None:
        return 2
    started = time.perf_counter()
    per_copy: list[dict[str, dict[str, float]]] = []
    for copy in range(args.repeats):
        rng = random.Random(args.seed + copy)
        workloads = inputs.workloads if copy == 0 else tuple(jittered(w, args.jitter, rng) for w in inputs.workloads)
        run = run_elastic(ElasticInputs(workloads, inputs.apps, inputs.nodes, inputs.cluster, inputs.models), [spec],
                          handover_seconds=args.handover_seconds)
        per_copy.append({family: {key: number(by_policy[spec.name][key]) for _, key in FIGURES}
                         for family, by_policy in run.families.items()})
        print(f"copy {copy}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(f"{spec.name} on {args.workload}, {args.repeats} copies (copy 0 unmoved, arrivals moved by up to "
          f"{args.jitter:g} s), seed {args.seed}"
          + (f", GPUs handed over {args.handover_seconds:g} s after they are given up"
             if args.handover_seconds else ""))
    for family in sorted(per_copy[0]):
        print(f"\n{family}")
        print(f"  {'':12s} " + " ".join(f"{f'copy {c}':>8s}" for c in range(args.repeats)) +
              f" {'mean':>8s} {'std':>7s} {'paper: Sia':>10s} {'below it':>9s}")
        for label, key in FIGURES:
            values = [copy[family][key] for copy in per_copy]
            paper = PAPER_TABLE3.get(family, {}).get("Sia", {}).get(key)
            below = f"{sum(value < paper for value in values)} of {len(values)}" if paper is not None else "-"
            print(f"  {label:12s} " + " ".join(f"{value:8.3f}" for value in values) +
                  f" {statistics.fmean(values):8.3f} {statistics.stdev(values):7.3f} "
                  f"{(f'{paper:.2f}' if paper is not None else '-'):>10s} {below:>9s}")
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
