"""Policies x workloads: load the inputs once, run every pair, summarise per run and per trace family.

``summary.json`` holds ``runs`` (one object per policy and workload, ``metrics.RUN_KEYS``), ``families`` (per
family, per policy: the Table 3 figures over its workloads, ``metrics.FAMILY_KEYS``), ``paper_table3`` (Sia's
published figures for the families present, to compare against) and ``meta`` (the command and inputs).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kubecell.core.elastic.types import ClusterNode
from kubecell.core.errors import InvalidInputError
from kubecell.sim.elastic.applications import APPLICATIONS, ApplicationModel
from kubecell.sim.elastic.cluster import GpuKind, cluster_by_name, kinds_of
from kubecell.sim.elastic.metrics import PAPER_TABLE3, Figures, family_metrics, run_metrics
from kubecell.sim.elastic.policies import PolicySpec
from kubecell.sim.elastic.profiles import load_application
from kubecell.sim.elastic.simulator import DEFAULT_MAX_HOURS, ROUND_SECONDS, SimulationResult, simulate
from kubecell.sim.elastic.workload import Workload, load_workload, models_dir_for, workload_files


@dataclass(frozen=True, slots=True)
class ElasticInputs:
    """Everything a run reads, validated: the workloads, the application models they use, the cluster."""

    workloads: tuple[Workload, ...]
    apps: Mapping[str, ApplicationModel]
    nodes: tuple[ClusterNode, ...]
    cluster: str
    models: Path


def load_models(models: Path, applications: Iterable[str], kinds: Sequence[GpuKind]) -> dict[str, ApplicationModel]:
    """The ground-truth model of each application, from ``models/<app>/``."""
    profiles = [kind.profile for kind in kinds]
    return {name: ApplicationModel(load_application(models, name, profiles), kinds)
            for name in sorted(set(applications))}


def load_inputs(workload: Path, *, cluster: str = "sia64", models: Path | None = None) -> ElasticInputs:
    """Read a workload file or directory, the cluster and the profiles of the applications used."""
    nodes = cluster_by_name(cluster)
    files = workload_files(workload)
    folder = models or models_dir_for(workload)
    if folder is None or not folder.is_dir():
        raise InvalidInputError(f"no profile folder {'at ' + str(folder) if folder else 'found beside the workload'}",
                                field="models", accepted="--models DIR: the data set's models/ folder "
                                "(sia-sosp23-workloads/models)")
    workloads = tuple(load_workload(path, APPLICATIONS) for path in files)
    labels: dict[str, Path] = {}
    for loaded in workloads:  # the label names a workload in summary.json and jobs.csv: one per workload
        if loaded.label in labels:
            raise InvalidInputError(f"{loaded.path} and {labels[loaded.label]} would both be reported as "
                                    f"{loaded.label!r}", location=str(workload), field="workload",
                                    accepted="workloads whose <folder>/<file> names differ")
        labels[loaded.label] = loaded.path
    used = {job.application for w in workloads for job in w.jobs}
    apps = load_models(folder, used, kinds_of(nodes))
    for job in (job for w in workloads for job in w.jobs):
        app = apps[job.application]
        if not app.init_bsz <= job.batch_size <= app.max_bsz:
            # a batch the profiles never ran: the rigid runs would quietly train at another one
            raise InvalidInputError(f"job {job.name!r}: batch_size {job.batch_size} is outside what "
                                    f"{job.application}'s profiles ran", location=job.where, field="batch_size",
                                    accepted=f"{app.init_bsz}..{app.max_bsz} (models/{job.application})")
    return ElasticInputs(workloads, apps, nodes, cluster, folder)


def check_runnable(inputs: ElasticInputs, specs: Sequence[PolicySpec], max_hours: float) -> None:
    """What would stop a run part-way, found before any runs: a rigid policy's job asking more GPUs than any one
    type has, and a job submitted after the run's horizon. Each names its file and line."""
    capacity: dict[str, int] = {}
    for node in inputs.nodes:
        capacity[node.gpu_type] = capacity.get(node.gpu_type, 0) + node.gpus
    rigid = [spec.name for spec in specs if spec.tuned_jobs]
    for job in (job for workload in inputs.workloads for job in workload.jobs):
        if rigid and job.num_replicas > max(capacity.values()):
            raise InvalidInputError(f"job {job.name!r} asks for {job.num_replicas} GPUs, which {', '.join(rigid)} "
                                    f"run it at, and no GPU type of {inputs.cluster} has that many ({capacity})",
                                    location=job.where, field="num_replicas",
                                    accepted=f"at most {max(capacity.values())} with {', '.join(rigid)}")
        if job.submitted >= max_hours * 3600.0:
            raise InvalidInputError(f"job {job.name!r} is submitted {job.submitted / 3600:.4g} h in, past the run's "
                                    f"{max_hours:g} h horizon", location=job.where, field="time",
                                    accepted=f"below {max_hours * 3600:g} s, or a larger --max-hours")


@dataclass(slots=True)
class ElasticRun:
    """All runs of one command and their summaries."""

    results: list[SimulationResult] = field(default_factory=list)
    runs: list[Figures] = field(default_factory=list)
    families: dict[str, dict[str, Figures]] = field(default_factory=dict)
    wall_seconds: float = 0.0


def run_elastic(inputs: ElasticInputs, specs: Sequence[PolicySpec], *, interval: float = ROUND_SECONDS,
                max_hours: float = DEFAULT_MAX_HOURS, handover_seconds: float = 0.0,
                on_start: Callable[[str], None] | None = None,
                on_step: Callable[[str], None] | None = None) -> ElasticRun:
    """Every policy on every workload, then the per-run and per-family figures."""
    started = time.perf_counter()
    run = ElasticRun()
    for spec in specs:
        for workload in inputs.workloads:
            label = f"{spec.name} on {workload.label}"
            if on_start:
                on_start(label)
            run.results.append(simulate(workload, inputs.apps, inputs.nodes, spec, interval=interval,
                                        max_hours=max_hours, handover_seconds=handover_seconds))
            if on_step:
                on_step(label)
    run.runs = [run_metrics(result) for result in run.results]
    grouped: dict[str, dict[str, list[SimulationResult]]] = defaultdict(lambda: defaultdict(list))
    for result in run.results:
        grouped[result.family][result.policy].append(result)
    run.families = {family: {policy: family_metrics(results) for policy, results in by_policy.items()}
                    for family, by_policy in grouped.items()}
    run.wall_seconds = time.perf_counter() - started
    return run


def summary(run: ElasticRun, meta: Mapping[str, object]) -> dict[str, object]:
    """The content of summary.json."""
    return {
        "runs": run.runs,
        "families": run.families,
        "paper_table3": {family: PAPER_TABLE3[family] for family in run.families if family in PAPER_TABLE3},
        "meta": dict(meta),
    }


def write_summary(out: Path, run: ElasticRun, meta: Mapping[str, object]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    path.write_text(json.dumps(summary(run, meta), indent=2, default=str) + "\n", encoding="utf-8")
    return path
