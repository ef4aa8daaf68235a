"""Where kubecell's online goodput model loses time against the truth, per application.

    python bench/elastic_gap.py [--workload DIR]

Why: with every job's true goodput (``kubecell-oracle``) the same policy finishes jobs sooner than with the
goodput it learns from step reports (``kubecell``). This bench says which applications that gap comes from,
and which half of the model causes it: ``kubecell-true-noise`` learns the throughput online but reads the
true gradient noise, so the gap between it and the oracle is the throughput model's, the rest the noise
model's. The policy is the same in all three runs; only what it is told about each job changes.

For each trace family it prints, per application, the jobs, their average JCT under the three runs, and each
application's share of the family's average JCT gap (its JCT-hours lost over the family's job count), so the
shares add up to the family's gap. ``--workload`` defaults to ``../shared/data/sia-sosp23-workloads`` (see its
SOURCE.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

from kubecell.core.errors import InvalidInputError
from kubecell.sim.elastic.policies import policy_spec
from kubecell.sim.elastic.runner import run_elastic
from sia_inputs import DATA, load_or_explain

RUNS = ("kubecell", "kubecell-true-noise", "kubecell-oracle")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workload", type=Path, default=DATA)
    args = parser.parse_args()
    inputs = load_or_explain(args.workload)
    if inputs is None:
        return 2
    try:
        specs = [policy_spec(name) for name in RUNS]
    except InvalidInputError as error:
        print(str(error), file=sys.stderr)
        return 2
    started = time.perf_counter()
    run = run_elastic(inputs, specs, on_step=lambda label: print(f"{label}: {time.perf_counter() - started:.0f} s",
                                                                  file=sys.stderr, flush=True))
    # family -> application -> policy -> JCT hours of each completed job
    jct: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for result in run.results:
        for record in result.records:
            if record.completion is not None:
                jct[result.family][record.application][result.policy].append(
                    (record.completion - record.submitted) / 3600.0)
    for family in sorted(jct):
        jobs = sum(len(by_policy[RUNS[0]]) for by_policy in jct[family].values())
        print(f"\n{family}: {jobs} jobs; avg JCT h per application, and its share of the family's avg JCT gap")
        print(f"  {'application':12s} {'jobs':>5s} " + " ".join(f"{name:>20s}" for name in RUNS) +
              f" {'online-oracle':>14s} {'of it: noise':>13s}")
        rows = {app: [sum(jct[family][app][name]) for name in RUNS] for app in sorted(jct[family])}
        rows["all"] = [sum(sums[i] for sums in rows.values()) for i in range(len(RUNS))]
        for app, sums in rows.items():
            count = jobs if app == "all" else len(jct[family][app][RUNS[0]])
            gap, noise = (sums[0] - sums[2]) / jobs, (sums[0] - sums[1]) / jobs
            print(f"  {app:12s} {count:5d} " + " ".join(f"{value / count:20.3f}" for value in sums) +
                  f" {gap:+14.4f} {noise:+13.4f}")
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
