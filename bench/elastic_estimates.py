"""How far the online goodput model (``OnlineGoodput``) is from the simulator's true goodput, per application
and GPU type, at placements the job has not reported from.

Why a bench and not the workloads: the workload runs are chaotic (one changed decision moves a file by
+-0.02 h), so a model change is judged first by what it predicts, against the ground truth the simulator is
built from (Sia's profile tables and validation curves, ``models/<app>/``), then once on the workloads.

For each application and each GPU type of Sia's 64-GPU cluster, and for the gradient statistics of the first
epoch, a middle and a late one (0 %, 50 % and 90 % of its epochs), a fresh model is seeded with the 1-GPU seed
profiles of every type and then fed the reports a job makes while it grows on that type: 1, 2, 4, 8, 16
replicas (packed onto whole nodes; at most the type's GPUs and Sia's replica cap), three reports per size,
each at the batch the model itself advises (``best_batch``, corrected to what the tables can run as the
simulator does), with the table's step and sync time and the gradient statistics of that epoch at that batch.
Before the first report and after each size, every placement the policy could consider next on every type
(1, 2, 4, 8, 12, 16, 24 GPUs packed, up to ``explore_factor`` x the most replicas reported) that the model has
no report of is priced and compared with ``OracleGoodput`` at the same epoch, times the application's slowdown
(reports are the tables' uncalibrated times; the slowdown is a per-application constant no report shows).

The stage before any report (seeds only, no gradient statistics) is counted in the first epoch only: a job
has reported statistics long before a middle or late epoch.

Printed: per application and GPU type, the median and 90th percentile of ``|predicted / true - 1|`` and the
median signed error for each model variant, then the same pooled by stage (before any gradient statistics,
after 1, 2, 4, 8, 16 replicas). ``baseline`` is Pollux's model as kubecell had it (no noise prior, one compute
line: the options that switch the two candidates off), ``noise prior`` adds ``noise_prior=1.0``, ``compute
scale`` adds ``FitPriors(replica_compute=True)``, ``default`` is ``OnlineGoodput``'s current defaults.

    python bench/elastic_estimates.py [--models ../shared/data/sia-sosp23-workloads/models]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.throughput import FitPriors
from kubecell.core.elastic.types import StepReport
from kubecell.sim.elastic.applications import APPLICATIONS, ApplicationModel
from kubecell.sim.elastic.cluster import GpuKind, kinds_of, sia64
from kubecell.sim.elastic.estimates import OracleGoodput, seed_reports, spread
from kubecell.sim.elastic.runner import load_models

DEFAULT_MODELS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "sia-sosp23-workloads" / "models"
PHASES: Mapping[str, float] = {"early": 0.0, "mid": 0.5, "late": 0.9}
PATH = (1, 2, 4, 8, 16)
QUERY_COUNTS = (1, 2, 4, 8, 12, 16, 24)
REPORTS_PER_SIZE = 3
EXPLORE_FACTOR = 4.0
"""The policy's exploration limit (``OnlineGoodput``'s default): placements beyond it are never asked."""

Factory = Callable[[ApplicationModel, Sequence[GpuKind]], OnlineGoodput]


def _factory(**options: object) -> Factory:
    def make(app: ApplicationModel, kinds: Sequence[GpuKind]) -> OnlineGoodput:
        max_local = {kind.gpu_type: app.max_local_bsz[kind.gpu_type] for kind in kinds}
        return OnlineGoodput(initial_bsz=app.init_bsz, max_bsz=app.max_bsz, max_local_bsz=max_local,
                             prior=seed_reports(app, kinds), explore_factor=None, **options)  # type: ignore[arg-type]
    return make


VARIANTS: Mapping[str, Factory] = {
    "baseline": _factory(noise_prior=None, priors=FitPriors(replica_compute=False)),
    "noise prior": _factory(noise_prior=1.0, priors=FitPriors(replica_compute=False)),
    "compute scale": _factory(noise_prior=None, priors=FitPriors(replica_compute=True)),
    "default": _factory(),
}


def _capacity(kind: GpuKind) -> int:
    return sum(node.gpus for node in sia64() if node.gpu_type == kind.gpu_type)


def _shape(count: int, kind: GpuKind) -> tuple[int, int]:
    return max(1, -(-count // kind.gpus_per_node)), count


def _report(app: ApplicationModel, model: OnlineGoodput, kind: GpuKind, count: int, epoch: int) -> StepReport | None:
    """What a job at ``count`` GPUs of ``kind`` measures in ``epoch``, at the batch its model advises."""
    nodes, replicas = _shape(count, kind)
    placement = spread(nodes, replicas)
    advice = model.best_batch(kind.gpu_type, nodes, replicas)
    batch = (app.settle(kind.gpu_type, placement, advice[0], advice[1] - 1) if advice
             else app.initial_batch(kind.gpu_type, placement))
    if batch is None:
        return None
    times = app.throughput[kind.gpu_type].times(placement, batch.atomic_bsz)
    if times is None:
        return None
    sqr, var = app.grad_stats(batch.global_bsz, epoch)
    return StepReport(gpu_type=kind.gpu_type, num_nodes=nodes, num_replicas=replicas, local_bsz=batch.atomic_bsz,
                      step_time=times[0], sync_time=times[1], grad_sqr=sqr, grad_var=var)


def _errors(app: ApplicationModel, model: OnlineGoodput, oracle: OracleGoodput, kinds: Sequence[GpuKind],
            reported: set[tuple[str, int, int]]) -> list[tuple[str, float]]:
    """``(gpu type, predicted / true - 1)`` at every placement the policy may ask next and none reported."""
    seen = max((model.max_observed_replicas(k.gpu_type) for k in kinds), default=0)
    limit = EXPLORE_FACTOR * max(seen, 1)
    out: list[tuple[str, float]] = []
    for kind in kinds:
        for count in QUERY_COUNTS:
            if count > min(limit, _capacity(kind), app.max_replicas):
                continue
            nodes, replicas = _shape(count, kind)
            if (kind.gpu_type, nodes, replicas) in reported:
                continue
            truth = oracle.goodput(kind.gpu_type, nodes, replicas) * app.slowdown
            if truth <= 0:
                continue
            out.append((kind.gpu_type, model.goodput(kind.gpu_type, nodes, replicas) / truth - 1.0))
    return out


def measure(app: ApplicationModel, kinds: Sequence[GpuKind], make: Factory,
            ) -> tuple[dict[tuple[str, str], list[float]], dict[str, list[float]]]:
    """Errors per ``(app, gpu type)`` queried and per stage, over every growth path and epoch phase."""
    by_type: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_stage: dict[str, list[float]] = defaultdict(list)
    for fraction in PHASES.values():
        epoch = int(fraction * (app.epochs - 1))
        oracle = OracleGoodput(app, epoch=lambda e=epoch: e)  # type: ignore[misc]
        for kind in kinds:
            model = make(app, kinds)
            reported: set[tuple[str, int, int]] = set()
            stages: list[tuple[str, list[tuple[str, float]]]] = [("seeds", _errors(app, model, oracle, kinds,
                                                                                   reported))]
            for count in PATH:
                if count > min(_capacity(kind), app.max_replicas):
                    break
                for _ in range(REPORTS_PER_SIZE):
                    report = _report(app, model, kind, count, epoch)
                    if report is not None and model.observe(report):
                        reported.add((kind.gpu_type, report.num_nodes, report.num_replicas))
                stages.append((f"after {count}", _errors(app, model, oracle, kinds, reported)))
            if fraction > 0:
                stages = stages[1:]  # a job has reported statistics long before a middle or late epoch
            for stage, errors in stages:
                for gpu_type, error in errors:
                    by_type[(app.name, gpu_type)].append(error)
                    by_stage[stage].append(error)
    return by_type, by_stage


def _summary(errors: Sequence[float]) -> str:
    if not errors:
        return f"{'-':>15}"
    magnitude = np.abs(np.asarray(errors))
    bias = float(np.median(errors))
    return f"{np.median(magnitude):6.1%} {np.quantile(magnitude, 0.9):7.1%}" + f" {bias:+6.0%}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS, help="Sia's models/ folder")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    args = parser.parse_args(argv)
    models: Path = args.models
    if not (models / "seed-1gpu").is_dir():
        print(f"skipped: no Sia profile tables at {models} (needs ../shared/data/sia-sosp23-workloads/models)")
        return 0
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    kinds = kinds_of(sia64())
    apps = load_models(models, APPLICATIONS, kinds)
    by_type: dict[str, dict[tuple[str, str], list[float]]] = {}
    by_stage: dict[str, dict[str, list[float]]] = {}
    for name in names:
        by_type[name], by_stage[name] = defaultdict(list), defaultdict(list)
        for app in apps.values():
            types, stages = measure(app, kinds, VARIANTS[name])
            for key, values in types.items():
                by_type[name][key].extend(values)
            for stage, errors in stages.items():
                by_stage[name][stage].extend(errors)
    header = "".join(f" | {name + ': median p90 bias':>28}" for name in names)
    print(f"|predicted / true - 1| of goodput at unreported placements{'':>4}{header}")
    for pair in sorted(next(iter(by_type.values()))):
        print(f"{pair[0]:>12} {pair[1]:>10} n={len(by_type[names[0]][pair]):4d}{'':>32}"
              + "".join(f" | {_summary(by_type[name][pair]):>28}" for name in names))
    print("by stage of the growth path (all applications and GPU types)")
    for stage in next(iter(by_stage.values())):
        print(f"{stage:>23} n={len(by_stage[names[0]][stage]):5d}{'':>32}"
              + "".join(f" | {_summary(by_stage[name][stage]):>28}" for name in names))
    pooled = {name: [e for values in by_type[name].values() for e in values] for name in names}
    print(f"{'all':>23} n={len(pooled[names[0]]):5d}{'':>32}"
          + "".join(f" | {_summary(pooled[name]):>28}" for name in names))
    bad = [name for name in names if not all(math.isfinite(e) for e in pooled[name])]
    if bad:
        print(f"non-finite predictions in {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
