"""Prometheus metrics of a running scheduler, by Prometheus' conventions.

Two sources, never the live engine (a scrape runs on an HTTP thread while the scheduler thread changes it):

- *state* (who holds which GPU, each VC against its guarantee, the queue by reason, fragmentation) is read
  at scrape time from the latest published snapshot (``PublishedView.snapshot``) by ``SnapshotCollector``;
  during a rebuild the previous snapshot is served and ``kubecell_rebuilding`` is 1, so a scrape never fails;
- *events* (attempts and their latency, preemptions, gang outcomes, refused writes) are counters and
  histograms the scheduler thread bumps as they happen (``kubecell.scheduler.observe.recorder``), so nothing
  that happened between two scrapes is lost.

All names carry the ``kubecell_`` prefix, amounts are in base units (bytes, seconds; GPUs where the
unit is a device), counters end in ``_total``. The text of the per-GPU families (three samples per GPU:
120,000 lines at 5,000 nodes x 8 GPUs) is made once per snapshot and reused by every scrape until the
next one. ``docs/kubernetes.md`` lists every family.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kubecell.kube.leader import LeaderElector
from kubecell.scheduler.observe.snapshot import Snapshot
from kubecell.scheduler.observe.view import PublishedView

MIB = 1 << 20
CLASSES = ("guaranteed", "borrowed", "opportunistic")


class LiveCollector(Collector):
    """Figures that are cheap and safe to read from another thread at any moment (ints and flags)."""

    def __init__(self, scheduler: PublishedView, elector: LeaderElector | None) -> None:
        self.scheduler = scheduler
        self.elector = elector

    def collect(self) -> Iterator[Metric]:
        s, elector = self.scheduler, self.elector
        leading = elector is None or elector.leading.is_set()
        yield GaugeMetricFamily("kubecell_leader", "1 while this replica leads", value=1.0 if leading else 0.0)
        yield CounterMetricFamily("kubecell_scheduling_cycles", "Scheduling cycles run by this replica",
                                  value=float(s.cycles))
        yield CounterMetricFamily("kubecell_api_writes", "Writes to the API server that carry decisions "
                                  "(records, bindings, evictions, conditions, FailedScheduling events)",
                                  value=float(s.api_writes))
        snapshot = s.snapshot
        rebuilding = snapshot is None or snapshot.rebuilding or s.needs_rebuild
        yield GaugeMetricFamily("kubecell_rebuilding", "1 while the scheduler rebuilds its state from the API "
                                "server (the state metrics then show the last snapshot taken before)",
                                value=1.0 if rebuilding else 0.0)
        yield GaugeMetricFamily("kubecell_snapshot_timestamp_seconds", "When the snapshot the state metrics "
                                "show was taken (Unix time)", value=snapshot.taken_at if snapshot else 0.0)


class SnapshotCollector(Collector):
    """The state families, from the scheduler's latest snapshot (read once per collection, so every family
    of one scrape describes the same moment)."""

    def __init__(self, scheduler: PublishedView) -> None:
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        snapshot = self.scheduler.snapshot
        yield from vc_families(snapshot)
        yield from cluster_families(snapshot)
        yield from gpu_families(snapshot)


def vc_families(snapshot: Snapshot | None) -> Iterator[Metric]:
    guaranteed = GaugeMetricFamily("kubecell_vc_guaranteed_gpus", "GPUs guaranteed to the virtual cluster",
                                   labels=["vc"])
    allocated = GaugeMetricFamily("kubecell_vc_allocated_gpus", "GPUs the virtual cluster holds, by class "
                                  "(guaranteed: inside its guarantee; borrowed: idle capacity beyond it; "
                                  "opportunistic: scavenged); fractions count as their share", labels=["vc", "class"])
    borrowed = GaugeMetricFamily("kubecell_vc_borrowed_gpus", "GPUs the virtual cluster borrows beyond its "
                                 "guarantee", labels=["vc"])
    running = GaugeMetricFamily("kubecell_running_jobs", "Jobs holding resources, by virtual cluster",
                                labels=["vc"])
    pending = GaugeMetricFamily("kubecell_pending_jobs", "Jobs waiting, by virtual cluster and kind of reason "
                                "(kubecell.scheduler.observe.reasons.REASON_KINDS)", labels=["vc", "reason"])
    for vc in snapshot.vcs if snapshot else ():
        guaranteed.add_metric([vc.name], vc.guaranteed_gpus)
        for klass, value in zip(CLASSES, (vc.guaranteed_in_use_gpus, vc.borrowed_gpus, vc.opportunistic_gpus),
                                strict=True):
            allocated.add_metric([vc.name, klass], value)
        borrowed.add_metric([vc.name], vc.borrowed_gpus)
        running.add_metric([vc.name], float(vc.running_jobs))
    counts = Counter((job.vc, job.reason_kind) for job in snapshot.pending) if snapshot else Counter()
    for (vc_name, kind), count in sorted(counts.items()):
        pending.add_metric([vc_name, kind], float(count))
    yield from (guaranteed, allocated, borrowed, running, pending)


def cluster_families(snapshot: Snapshot | None) -> Iterator[Metric]:
    gpus = GaugeMetricFamily("kubecell_gpus", "GPUs kubecell schedules, by model and health", labels=["model",
                                                                                                     "healthy"])
    counts = Counter((gpu.model, "true" if gpu.healthy else "false") for gpu in snapshot.gpus) if snapshot \
        else Counter()
    for (model, healthy), count in sorted(counts.items()):
        gpus.add_metric([model, healthy], float(count))
    yield gpus
    isolation = GaugeMetricFamily("kubecell_running_pods", "Pods holding GPUs through kubecell, by isolation mode "
                                  "(accounting: shares are bookkeeping only; mps: memory limited by the driver)",
                                  labels=["isolation"])
    for mode, count in sorted((snapshot.pods_by_isolation if snapshot else {}).items()):
        isolation.add_metric([mode], float(count))
    yield isolation
    yield GaugeMetricFamily("kubecell_allocated_gpus", "GPUs allocated in the cluster (fractions count as their "
                            "share; includes pods another scheduler bound)",
                            value=snapshot.allocated_gpus if snapshot else 0.0)
    yield GaugeMetricFamily("kubecell_fragmentation_ratio", "Share (0-1) of the free GPU capacity that the "
                            "workload's typical pods cannot use (FGD's measure; without known typical pods, the "
                            "share of free capacity on partially used GPUs)",
                            value=snapshot.fragmentation if snapshot else 0.0)


def gpu_families(snapshot: Snapshot | None) -> Iterator[Metric]:
    labels = ["node", "gpu", "model"]
    milli, used, total = (GaugeMetricFamily(name, text, labels=labels) for name, text in GPU_FAMILIES)
    for gpu in snapshot.gpus if snapshot else ():
        key = [gpu.node, str(gpu.index), gpu.model]
        milli.add_metric(key, float(gpu.milli_allocated))
        used.add_metric(key, float(gpu.memory_allocated_mib * MIB))
        total.add_metric(key, float(gpu.memory_total_mib * MIB))
    yield from (milli, used, total)


GPU_FAMILIES = (
    ("kubecell_gpu_allocated_milli", "Milli-GPU allocated on the GPU (0-1000)"),
    ("kubecell_gpu_allocated_memory_bytes", "GPU memory allocated on the GPU"),
    ("kubecell_gpu_memory_bytes", "GPU memory of the GPU (0 where unknown)"),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    """A sample value as ``generate_latest`` writes it (Go's float formatting)."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def gpu_text(snapshot: Snapshot | None) -> bytes:
    """``gpu_families`` in the text format, written directly: the same lines ``generate_latest`` makes for
    them, ten times faster (three lines per GPU are most of a large cluster's exposition)."""
    gpus = snapshot.gpus if snapshot else ()
    keys = [f'{{gpu="{g.index}",model="{_label(g.model)}",node="{_label(g.node)}"}} ' for g in gpus]
    values = (
        [float(g.milli_allocated) for g in gpus],
        [float(g.memory_allocated_mib * MIB) for g in gpus],
        [float(g.memory_total_mib * MIB) for g in gpus],
    )
    parts = []
    for (name, help_text), column in zip(GPU_FAMILIES, values, strict=True):
        parts.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
        parts.extend(f"{name}{key}{_number(value)}\n" for key, value in zip(keys, column, strict=True))
    return "".join(parts).encode()


class _Only(Collector):
    """One collector's families, for rendering a part of the exposition on its own."""

    def __init__(self, families: Iterator[Metric] | None = None) -> None:
        self.families = list(families or ())

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class Metrics:
    """``/metrics`` of one scheduler process: ``render()`` is the text exposition, ``registry`` the same
    collectors for anything that serves a ``CollectorRegistry`` (``prometheus_client.start_http_server``)."""

    def __init__(self, scheduler: PublishedView, elector: LeaderElector | None) -> None:
        self.scheduler = scheduler
        self.elector = elector
        self.live = CollectorRegistry(auto_describe=False)
        self.live.register(LiveCollector(scheduler, elector))
        for collector in scheduler.recorder.collectors():
            self.live.register(collector)
        self.state = SnapshotCollector(scheduler)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(LiveCollector(scheduler, elector))
        for collector in scheduler.recorder.collectors():
            self.registry.register(collector)
        self.registry.register(self.state)
        self._lock = threading.Lock()
        self._rendered: tuple[Snapshot | None, bytes] | None = None

    def render(self) -> bytes:
        """The exposition: live figures and counters now, state from the latest snapshot (its text is
        made once per snapshot)."""
        snapshot = self.scheduler.snapshot
        with self._lock:
            if self._rendered is None or self._rendered[0] is not snapshot:
                only = CollectorRegistry(auto_describe=False)
                only.register(_Only(iter([*vc_families(snapshot), *cluster_families(snapshot)])))
                self._rendered = (snapshot, generate_latest(only) + gpu_text(snapshot))
            state = self._rendered[1]
        return generate_latest(self.live) + state
