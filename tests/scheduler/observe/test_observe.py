"""The observing side without an API server: snapshots taken from an engine, the event recorder, the reason
kinds, the rate-limited publishing, the metric families, and the Grafana dashboard's PromQL (every metric
it names must be one ``Metrics.render`` exposes, so the dashboard cannot drift from the code)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubecell.core.engine.attempt import CycleResult
from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.model import Request
from kubecell.core.topology import CellForest
from kubecell.inputs.tenants import parse_tenants
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.kube.inventory import NodeView
from kubecell.scheduler.observe.capture import CaptureCache, capture
from kubecell.scheduler.observe.metrics import Metrics, _Only, gpu_families, gpu_text
from kubecell.scheduler.observe.reasons import REASON_KINDS, reason_kind
from kubecell.scheduler.observe.snapshot import GpuCell, Snapshot
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.scheduler.tracking import Tracking
from kubecell.testbed.nodes import synthetic_cluster

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "kubecell-dashboard.json"
TENANTS = "virtualClusters:\n  a: {cells: {A100x8/node: 2}}\n  b: {cells: {A100x8/node: 1}}\n"


class NoKube:
    """Stands in for the API client: these tests never reach the API server."""


def share(gpu_milli: int, cpu: int = 1000) -> Request:
    return Request("x", cpu_milli=cpu, gpu_count=1, gpu_milli=gpu_milli)


def whole(count: int) -> Request:
    return Request("x", cpu_milli=1000, gpu_count=count, gpu_milli=1000)


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    """A scheduler whose state is an engine on 4 synthetic nodes with VCs a (2 nodes) and b (1 node)."""
    nodes = synthetic_cluster(4)
    forest = CellForest(nodes)
    tenants = parse_tenants(YamlDocument(Path("tenants.yaml"), TENANTS), forest)
    engine = Engine(nodes, tenants, PRESETS["kubecell"], forest=forest)
    s = Scheduler(NoKube(), SchedulerOptions())  # type: ignore[arg-type]
    s.state = Tracking(engine, {n.name: NodeView(n.name, n) for n in nodes})
    s.needs_rebuild = False
    yield s
    s.pool.shutdown()


def run(s: Scheduler, jobs: list[tuple[str, str, Request, int]], now: float = 1.0) -> CycleResult:
    engine = s.state.engine if s.state else None
    assert engine is not None
    for name, vc, request, members in jobs:
        engine.submit(JobSpec(name, vc, request, members=members), now)
    result = engine.schedule(now)
    s.recorder.cycle(result, engine.book, now=now, decide_seconds=0.01, act_seconds=0.02, failed=[],
                     waiting=len(engine.pending))
    return result


def test_a_snapshot_shows_each_vc_by_class_each_gpu_and_the_queue(scheduler: Scheduler) -> None:
    run(scheduler, [("a1", "a", share(500), 1), ("a2", "a", share(500), 1), ("a3", "a", whole(2), 1),
                    ("b1", "b", whole(8), 1), ("b2", "b", whole(2), 1), ("b3", "b", whole(8), 4)])
    snap = capture(scheduler, now=2.0)
    vcs = {vc.name: vc for vc in snap.vcs}
    assert (vcs["a"].guaranteed_gpus, vcs["a"].guaranteed_in_use_gpus, vcs["a"].borrowed_gpus) == (16.0, 3.0, 0.0)
    assert (vcs["b"].guaranteed_gpus, vcs["b"].guaranteed_in_use_gpus, vcs["b"].borrowed_gpus) == (8.0, 8.0, 2.0)
    assert (vcs["b"].running_jobs, vcs["b"].pending_jobs) == (2, 1)
    assert len(snap.gpus) == 32
    assert snap.allocated_gpus == pytest.approx(13.0)
    assert snap.unallocated_gpus == pytest.approx(19.0)
    halves = [g for g in snap.gpus if g.milli_allocated == 1000 and len(g.pods) == 2]
    assert len(halves) == 1
    assert halves[0].owners == ("a",)
    assert sorted(g.owners for g in snap.gpus if g.owners) == sorted([("a",)] * 3 + [("b",)] * 10)
    (waiting,) = snap.pending
    assert (waiting.job, waiting.vc, waiting.gpus) == ("b3", "b", 32.0)
    assert waiting.reason.startswith("b3: pending: ")
    assert waiting.reason_kind in REASON_KINDS
    assert waiting.waiting_seconds == pytest.approx(1.0)
    placed = {d.job: d for d in snap.decisions}
    assert set(placed) == {"a1", "a2", "a3", "b1", "b2"}
    assert placed["b1"].nodes
    assert len(placed["b1"].gpus) == 8
    assert placed["b1"].action == "placed"
    assert not snap.rebuilding
    assert snap.running_jobs == 5


def test_unchanged_nodes_keep_their_cells_and_changed_ones_are_rebuilt(scheduler: Scheduler) -> None:
    cache = CaptureCache()
    run(scheduler, [("a1", "a", whole(8), 1)])
    first = capture(scheduler, cache=cache)
    run(scheduler, [("a2", "a", share(300), 1)], now=2.0)
    second = capture(scheduler, cache=cache, previous=first)
    assert second.allocated_gpus == pytest.approx(8.3)
    changed = {g.node for g, h in zip(first.gpus, second.gpus, strict=True) if g is not h}
    assert len(changed) == 1, "only the node that took the share is rebuilt"
    same = [g for g, h in zip(first.gpus, second.gpus, strict=True) if g.node not in changed]
    assert all(g is h for g, h in zip(same, [h for h in second.gpus if h.node not in changed], strict=True))
    fresh = capture(scheduler)  # no cache: the same picture from scratch
    assert fresh.gpus == second.gpus


def test_without_an_engine_the_last_snapshot_is_served_as_rebuilding(scheduler: Scheduler) -> None:
    run(scheduler, [("a1", "a", whole(1), 1)])
    last = capture(scheduler)
    scheduler.state = None
    during = capture(scheduler, previous=last)
    assert during.rebuilding
    assert during.gpus == last.gpus
    assert during.vcs == last.vcs
    assert capture(scheduler).rebuilding


def test_fragmentation_uses_the_learned_typical_pods_or_partial_gpus(scheduler: Scheduler) -> None:
    assert capture(scheduler).extra["fragmentation_typical_pods"] == 0  # nothing arrived: nothing learned
    engine = scheduler.state.engine if scheduler.state else None
    assert engine is not None
    engine.submit(JobSpec("p", "a", share(600)), 0.0)  # only 600-milli shares arrive
    engine.schedule(0.0)
    snap = capture(scheduler)
    assert snap.extra["fragmentation_typical_pods"] >= 1
    # the 400 milli left on the shared GPU fits no 600-milli pod: that, of all the free capacity, is fragment
    assert snap.fragmentation == pytest.approx(400 / (32_000 - 600), rel=0.05)


def test_publish_replaces_the_snapshot_at_most_every_interval_and_wakes_for_the_last_change(
        scheduler: Scheduler) -> None:
    seen: list[Snapshot | None] = []
    scheduler.publish()
    first = scheduler.snapshot
    assert first is not None
    run(scheduler, [("a1", "a", whole(1), 1)])
    scheduler.publish()  # too soon: skipped, but a wake-up is due
    assert scheduler.snapshot is first
    event = scheduler.events.get(timeout=5)
    assert event.kind == "wake"
    with scheduler.snapshot_changed:
        scheduler.publish()
        scheduler.snapshot_changed.wait_for(lambda: scheduler.snapshot is not first, timeout=1)
        seen.append(scheduler.snapshot)
    assert seen[0] is not first
    assert seen[0] is not None
    assert seen[0].allocated_gpus == 1.0


@pytest.mark.parametrize(("sentence", "members", "kind"), [
    ("j: pending: submitted; waiting for the next scheduling cycle", 1, "new"),
    ("j: pending: binding failed: 409 Conflict; waiting again", 1, "binding"),
    ("j: pending: virtual cluster 'x' was removed by a configuration reload (known: a)", 1, "config"),
    ("j: pending: VC a guarantees 8 GPUs; the job needs 16", 1, "never_fits"),
    ("j: pending: VC a guarantee in use (8 of 8 GPUs) by work of equal or higher priority; no idle capacity to "
     "borrow: needs 1 member(s) of 8 GPU on idle capacity; the roomiest node takes 0 member(s) now; 0/4 nodes "
     "fit one member: 4 insufficient GPUs", 1, "capacity"),
    ("j: pending: needs 4 member(s) of 8 GPU within one rack in its VC's cells; the roomiest node takes 1 "
     "member(s) now; 1/4 nodes fit one member: 3 insufficient GPUs", 4, "gang"),
    ("j: pending: needs 1 member(s) of 1 GPU on idle capacity; the roomiest node takes 0 member(s) now; 0/64 "
     "nodes fit one member: 64 not allowed by the job's node constraints", 1, "constraints"),
    ("j: pending: needs 1 member(s) of 8 GPU; the roomiest node takes 0 member(s) now (some capacity is "
     "reserved for starving jobs); 0/4 nodes fit one member: 3 reserved for a starving job, 1 insufficient "
     "GPUs", 1, "reservation"),
    ("j: pending: VC a guarantee in use (8 of 8 GPUs); VC a borrowing limit reached (8 of 8 GPUs)", 1, "quota"),
    ("j: pending: waiting for capacity freed by preemption", 1, "victims"),
    ("j: pending: something new", 1, "other"),
])
def test_reason_kinds(sentence: str, members: int, kind: str) -> None:
    assert reason_kind(sentence, members=members) == kind


def test_the_recorder_counts_attempts_gangs_preemptions_and_keeps_the_last_decisions(scheduler: Scheduler) -> None:
    run(scheduler, [("g", "a", whole(8), 2), ("w", "b", whole(8), 3)])
    registry = CollectorRegistry()
    for collector in scheduler.recorder.collectors():
        registry.register(collector)
    value = registry.get_sample_value
    assert value("kubecell_schedule_attempts_total", {"result": "scheduled"}) == 1
    assert value("kubecell_schedule_attempts_total", {"result": "unschedulable"}) == 1
    assert value("kubecell_gang_outcomes_total", {"outcome": "placed"}) == 1
    assert value("kubecell_scheduling_attempt_duration_seconds_count", {"result": "scheduled"}) == 1
    assert value("kubecell_scheduling_attempt_duration_seconds_sum", {"result": "scheduled"}) == pytest.approx(0.03)
    engine = scheduler.state.engine if scheduler.state else None
    assert engine is not None
    job = engine.jobs["g"]
    engine.bind_failed("g", 2.0, "refused")
    scheduler.recorder.cycle(CycleResult(started=[job]), engine.book, now=2.0, decide_seconds=0.0,
                             act_seconds=0.0, failed=[job], waiting=0)
    assert value("kubecell_binding_failures_total") == 1
    assert value("kubecell_gang_outcomes_total", {"outcome": "bind_failed"}) == 1
    scheduler.recorder.binding_refused("x", "a", gang=False, now=3.0, detail="409")
    assert value("kubecell_schedule_attempts_total", {"result": "error"}) == 2
    assert [d.action for d in scheduler.recorder.decisions] == ["placed", "failed", "failed"]
    g = scheduler.recorder.decisions[0]
    assert g.job == "g"
    assert len(g.gpus) == 16
    assert len(g.nodes) == 2
    assert g.score is not None


def test_the_per_gpu_text_is_what_prometheus_client_would_write() -> None:
    snap = Snapshot(0.0, 0, True, False, gpus=(GpuCell("n-1", 0, 'odd "model"\\x', True, 250, 100, 16384, (), ()),
                                               GpuCell("n-1", 1, "A100", False, 0, 0, 0, (), ())))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Only(gpu_families(snap)))
    assert gpu_text(snap) == generate_latest(registry)


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed(scheduler: Scheduler) -> set[str]:
    """Every series name ``/metrics`` declares (a family with no sample at the moment still counts: a
    queue that is empty now is not a metric that does not exist)."""
    text = Metrics(scheduler, None).render().decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def test_render_exposes_every_family_with_the_conventions(scheduler: Scheduler) -> None:
    run(scheduler, [("a1", "a", share(500), 1), ("b0", "b", whole(8), 3), ("b1", "b", whole(8), 2)])
    scheduler.publish()
    text = Metrics(scheduler, None).render().decode()
    pending = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "kubecell_pending_jobs"]
    assert [(s.labels["vc"], s.value) for s in pending] == [("b", 1.0)]
    names = exposed(scheduler)
    for name in ("kubecell_schedule_attempts_total", "kubecell_scheduling_attempt_duration_seconds_bucket",
                 "kubecell_pending_jobs", "kubecell_vc_guaranteed_gpus", "kubecell_vc_allocated_gpus",
                 "kubecell_vc_borrowed_gpus", "kubecell_gpu_allocated_milli", "kubecell_gpu_allocated_memory_bytes",
                 "kubecell_gpu_memory_bytes", "kubecell_fragmentation_ratio", "kubecell_leader",
                 "kubecell_scheduling_cycles_total", "kubecell_api_writes_total", "kubecell_gang_outcomes_total",
                 "kubecell_binding_failures_total", "kubecell_rebuilding", "kubecell_elastic_resizes_total",
                 "kubecell_elastic_moves_total", "kubecell_elastic_starts_total",
                 "kubecell_elastic_step_reports_total"):
        assert name in names, name
    assert all(name.startswith("kubecell_") for name in names)
    assert not [name for name in names if name.endswith("_created")], "no _created series: they are noise"
    scheduler.state = None  # a scrape with no engine at all never fails
    assert "kubecell_vc_allocated_gpus" in exposed(scheduler)


def dashboard_metric_names(data: Any) -> set[str]:
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query", "definition") and isinstance(value, str):
                    found.update(re.findall(r"\bkubecell_[a-z0-9_]+", value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data)
    return found


def test_the_grafana_dashboard_uses_only_metrics_the_scheduler_exposes(scheduler: Scheduler) -> None:
    data = json.loads(DASHBOARD.read_text())
    assert data["schemaVersion"] >= 36
    assert any(v["name"] == "datasource" and v["type"] == "datasource" for v in data["templating"]["list"])
    assert all(p["datasource"]["uid"] == "${datasource}" for p in data["panels"])
    used = dashboard_metric_names(data)
    assert len(used) >= 12
    run(scheduler, [("a1", "a", share(500), 1)])
    scheduler.publish()
    missing = used - exposed(scheduler)
    assert not missing, f"the dashboard queries metrics that /metrics does not expose: {sorted(missing)}"
    time.sleep(0)  # keep the scheduler fixture's pool alive until here
