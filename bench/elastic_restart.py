"""What a scheduler restart costs the elastic jobs, with and without the goodput models kept in their status.

    python bench/elastic_restart.py [--workload DIR] [--every 2] [--policy kubecell]

Why: on a cluster, a job's goodput model lives in the scheduler; its pods carry only their latest step report.
A restarted scheduler that learned the models again from those reports would know each job at one placement,
and pay restarts to explore the others again. The scheduler keeps each model in the ElasticJob's
``status.goodputModel`` (``core/elastic/saved_model.py``). This bench measures both on Sia's workloads, in the
simulator: the scheduler restarts every ``--every`` hours of each run, and at each restart every job's model
is replaced by

* **kept**: a new model that took up ``saved_model`` of the old one, through JSON, as the status holds it (the
  newest 32 placement shapes per GPU type, the noise sums, the micro-batch limits);
* **relearned**: a new model that knows only the job's latest report (what its pods carry, and all a
  cluster's scheduler without the status would have: no seed profiles, which only the simulator has);

beside the run without restarts. Only the goodput models are replaced: the allocator's own state (restart
counts, prices) is kept in all three, so the difference is the models'. Prints, per trace family, avg JCT, p99
JCT, makespan (hours) and restarts per job. ``--workload`` defaults to ``../shared/data/sia-sosp23-workloads``
(see its SOURCE.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.saved_model import restore_model, saved_model
from kubecell.sim.elastic.job import SimJob
from kubecell.sim.elastic.metrics import family_metrics
from kubecell.sim.elastic.simulator import ElasticSimulator, SimulationResult
from sia_inputs import DATA, load_or_explain, policy_or_explain

FIGURES = (("avg JCT h", "avg_jct_hours"), ("p99 JCT h", "p99_jct_hours"), ("makespan h", "makespan_hours"),
           ("restarts/job", "restarts_per_job"))
VARIANTS = ("no restart", "kept", "relearned")


class RestartingSimulator(ElasticSimulator):
    """The simulator whose scheduler restarts every ``every`` seconds (see the module)."""

    def __init__(self, *args: object, every: float, keep: bool, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.every, self.keep = every, keep
        self.next_restart = every
        self.restarts = 0

    def _decide(self, now: float, active: Sequence[SimJob]) -> None:
        if now >= self.next_restart:
            self.next_restart += self.every
            self.restarts += 1
            for job in active:
                self.estimates[job.name] = self._after_restart(job)
        super()._decide(now, active)

    def _after_restart(self, job: SimJob) -> OnlineGoodput:
        old = self.estimates[job.name]
        if not isinstance(old, OnlineGoodput):
            raise TypeError("this bench needs a policy with online goodput models")
        new = OnlineGoodput(initial_bsz=old.initial_bsz, max_bsz=old.max_bsz, max_local_bsz=old.max_local_bsz)
        if self.keep:
            problem = restore_model(new, json.loads(json.dumps(saved_model(old))))
            if problem is not None:
                raise RuntimeError(f"a kept model was not taken up: {problem}")
        elif job.running and job.ran_seconds > 0:
            report = self._report(job)  # what its pods carry: the report of the round just run
            if report is not None:
                new.observe(report)
        return new


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workload", type=Path, default=DATA)
    parser.add_argument("--policy", default="kubecell")
    parser.add_argument("--every", type=float, default=2.0, help="hours between the scheduler's restarts")
    args = parser.parse_args()
    if not args.every > 0:
        parser.error("--every must be positive")
    inputs, spec = load_or_explain(args.workload), policy_or_explain(args.policy)
    if inputs is None or spec is None:
        return 2
    if spec.estimate != "online":
        parser.error(f"{args.policy} does not learn its goodput models online: nothing to keep")
    started = time.perf_counter()
    results: dict[str, dict[str, list[SimulationResult]]] = {variant: {} for variant in VARIANTS}
    restarts = 0
    for workload in inputs.workloads:
        for variant in VARIANTS:
            if variant == "no restart":
                simulator = ElasticSimulator(workload, inputs.apps, inputs.nodes, spec)
            else:
                simulator = RestartingSimulator(workload, inputs.apps, inputs.nodes, spec, every=args.every * 3600.0,
                                                keep=variant == "kept")
            result = simulator.run()
            if isinstance(simulator, RestartingSimulator) and variant == "kept":
                restarts += simulator.restarts
            results[variant].setdefault(result.family, []).append(result)
        print(f"{workload.label}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(f"{spec.name} on {args.workload}: the scheduler restarts every {args.every:g} h "
          f"({restarts} restarts over {len(inputs.workloads)} workloads, kept run)")
    for family in sorted(results["no restart"]):
        print(f"\n{family}")
        print(f"  {'':12s} " + " ".join(f"{variant:>11s}" for variant in VARIANTS))
        figures = {variant: family_metrics(results[variant][family]) for variant in VARIANTS}
        for label, key in FIGURES:
            print(f"  {label:12s} " + " ".join(f"{float(figures[v][key]):11.3f}" for v in VARIANTS))  # type: ignore[arg-type]
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
