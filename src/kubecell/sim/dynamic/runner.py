"""Runs a dynamic experiment: load and validate the inputs, run each tenancy policy on the same jobs, run
every VC alone on its private cluster once, compute the metrics and write the report.

Everything a user can get wrong (files, keys, policy names, trace rows) is checked before the first
simulation starts, so a long run never dies half-way on an input error; a job the engine cannot take
(unknown VC, too large for the cluster) is rejected with a reason and counted, not raised.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kubecell import __version__
from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS, engine_options
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node
from kubecell.core.placement.registry import DEFAULT_POLICY
from kubecell.core.tenancy.config import Tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.cluster import load_cluster
from kubecell.inputs.tenants import load_tenants
from kubecell.sim.dynamic.metrics import PolicyMetrics, policy_metrics, private_metrics
from kubecell.sim.dynamic.private import PrivateBaseline, run_private_baseline
from kubecell.sim.dynamic.report import write_html, write_jobs, write_plots, write_summary, write_timeseries
from kubecell.sim.dynamic.simulator import DynamicSimulation, NodeEvent, SimulationResult
from kubecell.sim.traces.workloads import SECONDS_PER_DAY, Workload, load_workloads

DEFAULT_POLICIES = ("quota", "hived", "kubecell")
DEFAULT_REPAIR_HOURS = 4.0
SAMPLE_SECONDS = 3600.0
CHECKPOINT_SECONDS = 1800.0


@dataclass(slots=True)
class DynamicInputs:
    cluster_path: Path
    tenants_path: Path
    nodes: list[Node]
    forest: CellForest
    tenants: Tenants
    workload: Workload

    @property
    def jobs(self) -> list[JobSpec]:
        return self.workload.jobs

    @property
    def unknown_vcs(self) -> dict[str, int]:
        """Jobs per VC the tenant configuration does not know (the engine will reject them)."""
        counts: dict[str, int] = {}
        for job in self.jobs:
            if self.tenants.get(job.vc) is None:
                counts[job.vc] = counts.get(job.vc, 0) + 1
        return counts


def load_inputs(cluster: str | Path, tenants: str | Path, workloads: Sequence[str | Path], *,
                days: float | None = None, start_day: float = 0.0, skip_bad_rows: bool = False) -> DynamicInputs:
    """Parse and validate the cluster, the tenants (against the cluster) and the workload files."""
    nodes = load_cluster(cluster)
    forest = CellForest(nodes)
    resolved = load_tenants(tenants, forest)
    workload = load_workloads(workloads, days=days, start_day=start_day, skip_bad_rows=skip_bad_rows)
    return DynamicInputs(Path(cluster), Path(tenants), nodes, forest, resolved, workload)


def parse_tenancy(text: str) -> list[str]:
    """'quota,hived,kubecell' -> validated, de-duplicated tenancy preset names (``--tenancy``; placement
    policies are a different kind, chosen with ``--placement``)."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names:
        raise InvalidInputError("no tenancy preset given", field="tenancy", accepted=", ".join(PRESETS))
    for name in names:
        if name not in PRESETS:
            raise InvalidInputError(f"unknown tenancy preset {name!r}", field="tenancy",
                                    accepted=", ".join(PRESETS) + " (placement policies go to --placement)")
    return list(dict.fromkeys(names))


def check_has_jobs(inputs: DynamicInputs, *, days: float | None = None, start_day: float = 0.0) -> None:
    """Stop before running when there is nothing to measure: with no job every figure of the report (delays,
    completion times, utilisation, the sharing anomaly) is undefined, so say why the workload is empty."""
    if inputs.jobs:
        return
    files = inputs.workload.files
    rows = sum(f.rows for f in files)
    outside = sum(f.outside_window for f in files)
    bad = sum(f.rejected for f in files)
    window = f" (days {start_day:g} to {start_day + days:g} of each trace)" if days is not None else (
        f" (from day {start_day:g} of each trace)" if start_day else "")
    raise InvalidInputError(
        f"no jobs to simulate: {len(files)} workload file(s) hold {rows} row(s), {outside} outside the "
        f"window{window} and {bad} bad", field="workload",
        accepted="trace files with at least one job in the --start-day / --days window")


MAX_NODE_FAILURES = 1_000_000
"""Node failures one run may draw: each is an event with its repair, so a million is already far past any
trace's hardware record."""


def check_run_options(*, node_failures: int = 0, repair_hours: float = DEFAULT_REPAIR_HOURS,
                      horizon_days: float | None = None) -> None:
    """Validate the run parameters (before loading anything, so a typo costs no parsing time)."""
    if not 0 <= node_failures <= MAX_NODE_FAILURES:  # (10^12 asked numpy for 7 TiB)
        raise InvalidInputError(f"{node_failures} failures", field="node-failures",
                                accepted=f"a whole number from 0 to {MAX_NODE_FAILURES:,}")
    if repair_hours <= 0 or not math.isfinite(repair_hours):
        raise InvalidInputError(f"repair after {repair_hours:g} hours", field="repair-hours",
                                accepted="a number of hours > 0")
    if horizon_days is not None and (not math.isfinite(horizon_days) or horizon_days <= 0):
        raise InvalidInputError(f"horizon {horizon_days:g} days", field="horizon-days", accepted="a number of days > 0")


def node_failure_events(nodes: Sequence[Node], count: int, *, seed: int, start: float, end: float,
                        repair_seconds: float) -> list[NodeEvent]:
    """``count`` GPU-node failures at uniform random times in [start, end), each repaired after
    ``repair_seconds``; failures of a node that is already down extend its outage. Seeded."""
    if count < 0:
        raise InvalidInputError(f"{count} failures", field="node-failures", accepted="a whole number >= 0")
    if repair_seconds <= 0 or not math.isfinite(repair_seconds):
        raise InvalidInputError(f"repair after {repair_seconds / 3600:g} hours", field="repair-hours",
                                accepted="a number of hours > 0")
    gpu_nodes = [node.name for node in nodes if node.gpu_count]
    if count == 0 or not gpu_nodes:
        return []
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(start, max(end, start + 1.0), size=count))
    chosen = rng.integers(0, len(gpu_nodes), size=count)
    outages: dict[str, list[list[float]]] = {}
    for when, index in zip(times.tolist(), chosen.tolist(), strict=True):
        spans = outages.setdefault(gpu_nodes[index], [])
        if spans and when <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], when + repair_seconds)
        else:
            spans.append([when, when + repair_seconds])
    events = [event for node, spans in outages.items() for down, up in spans
              for event in (NodeEvent(down, node, False), NodeEvent(up, node, True))]
    return sorted(events, key=lambda e: (e.time, e.node, e.healthy))


@dataclass(slots=True)
class DynamicRun:
    inputs: DynamicInputs
    results: list[SimulationResult]
    baselines: dict[str, PrivateBaseline]
    metrics: list[PolicyMetrics]
    private: dict[str, dict[str, Any]]
    node_events: list[NodeEvent] = field(default_factory=list)
    wall_seconds: float = 0.0


def run_dynamic(
    inputs: DynamicInputs,
    policies: Sequence[str],
    *,
    seed: int = 0,
    node_failures: int = 0,
    repair_hours: float = DEFAULT_REPAIR_HOURS,
    horizon_days: float | None = None,
    sample_seconds: float = SAMPLE_SECONDS,
    checkpoint_seconds: float = CHECKPOINT_SECONDS,
    placement: str = DEFAULT_POLICY,
    on_start: Callable[[str], None] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> DynamicRun:
    """Run every tenancy preset and every VC's private baseline, all placing with the ``placement`` policy;
    ``on_start(label)`` before and ``on_step(label)`` after each simulation, with the same label (the preset's
    name, or ``private baseline of VC <name>``), so progress can name the simulation that is running.

    Node failures (if any) hit the shared cluster only: a private cluster is other hardware.
    """
    started = time.perf_counter()
    check_run_options(node_failures=node_failures, repair_hours=repair_hours, horizon_days=horizon_days)
    horizon = horizon_days * SECONDS_PER_DAY if horizon_days is not None else None
    jobs = inputs.jobs
    last_submit = max((job.submit_time for job in jobs), default=0.0)
    events = node_failure_events(inputs.nodes, node_failures, seed=seed, start=0.0,
                                 end=min(last_submit, horizon) if horizon is not None else last_submit,
                                 repair_seconds=repair_hours * 3600.0)
    results: list[SimulationResult] = []
    for policy in policies:
        if on_start is not None:
            on_start(policy)
        simulation = DynamicSimulation(inputs.nodes, inputs.tenants, engine_options(policy), jobs, node_events=events,
                                       sample_seconds=sample_seconds, checkpoint_seconds=checkpoint_seconds,
                                       horizon=horizon, placement=placement)
        results.append(simulation.run())
        if on_step is not None:
            on_step(policy)
    baselines: dict[str, PrivateBaseline] = {}
    with_jobs = {job.vc for job in jobs}
    for vc in inputs.tenants.names:
        if vc not in with_jobs:
            continue
        label = private_label(vc)
        if on_start is not None:
            on_start(label)
        baselines[vc] = run_private_baseline(inputs.forest, inputs.tenants, vc, jobs, sample_seconds=sample_seconds,
                                             checkpoint_seconds=checkpoint_seconds, horizon=horizon,
                                             placement=placement)
        if on_step is not None:
            on_step(label)
    metrics = [policy_metrics(result, baselines) for result in results]
    private = {vc: private_metrics(baseline) for vc, baseline in baselines.items()}
    return DynamicRun(inputs, results, baselines, metrics, private, events, time.perf_counter() - started)


def private_label(vc: str) -> str:
    """How progress names the private-baseline simulation of ``vc``."""
    return f"private baseline of VC {vc}"


def step_count(inputs: DynamicInputs, policies: Sequence[str]) -> int:
    """Simulations ``run_dynamic`` will perform (for progress bars)."""
    with_jobs = {job.vc for job in inputs.jobs}
    return len(policies) + sum(vc in with_jobs for vc in inputs.tenants.names)


def run_meta(run: DynamicRun, policies: Sequence[str], **extra: object) -> dict[str, object]:
    inputs = run.inputs
    files = [f"{f.path} ({f.format}, VC {f.vc}: {f.jobs} jobs of {f.rows} rows, {f.rejected} bad, "
             f"{f.outside_window} outside the window)" for f in inputs.workload.files]
    return {
        "kubecell": __version__,
        "cluster": str(inputs.cluster_path),
        "tenants": str(inputs.tenants_path),
        "workload": files,
        "tenancy": list(policies),
        "nodes": len(inputs.nodes),
        "gpus": sum(node.gpu_count for node in inputs.nodes),
        "jobs": len(inputs.jobs),
        "bad_rows_skipped": len(inputs.workload.rejected),
        "jobs_of_unknown_vcs": sum(inputs.unknown_vcs.values()),
        "node_failures": sum(not e.healthy for e in run.node_events),
        **extra,
        "wall_seconds": round(run.wall_seconds, 2),
    }


def write_report(out: Path, run: DynamicRun, meta: dict[str, object]) -> Path:
    """Write every output file; returns the index.html path."""
    write_summary(out, run.metrics, meta, run.private)
    write_jobs(out, run.results, run.baselines)
    write_timeseries(out, run.results)
    plots = write_plots(out, run.results, run.metrics, run.private)
    return write_html(out, run.metrics, run.private, meta, plots)
