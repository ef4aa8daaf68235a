"""Prometheus metrics of a running ElasticJob controller, by Prometheus' conventions (``kubecell_elastic_``
prefix, seconds, counters ending in ``_total``).

Two sources, as for the scheduler (``kubecell.scheduler.observe.metrics``), and for the same reason: a scrape
runs on an HTTP thread while the controller's loop changes its cache.

- *state* (ElasticJobs per phase; per job its target, workers, ready workers and restarts, as its status
  says) is read from the rows the loop publishes after each pass (``publish``: one tuple, replaced whole), so
  a scrape never iterates the live cache;
- *events* (reconciles and their latency, Pod creates and deletes by outcome, Events by reason) are counters
  the loop bumps as they happen, so nothing between two scrapes is lost.

Per-job series are labelled by namespace and name, as kube-state-metrics labels a Deployment's replicas: one
series per ElasticJob that exists, dropped when it is deleted.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubecell.elastic.states import Phase
from kubecell.elastic.status import count, read_status


@dataclass(frozen=True, slots=True)
class JobRow:
    """One ElasticJob as its status states it (what the controller last wrote, read defensively)."""

    namespace: str
    name: str
    phase: str
    target: int
    workers: int
    ready: int
    restarts: int


def job_rows(jobs: Iterable[Mapping[str, Any]]) -> tuple[JobRow, ...]:
    """The rows of the jobs in the controller's cache (an object without a name is left out)."""
    rows = []
    for obj in jobs:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            continue
        written = obj.get("status")
        status: Mapping[str, Any] = written if isinstance(written, Mapping) else {}
        view = read_status(obj)
        rows.append(JobRow(str(meta.get("namespace", "default")), name, str(view.phase), view.target,
                           count(status.get("replicas")), count(status.get("readyReplicas")), view.restarts))
    return tuple(sorted(rows, key=lambda row: (row.namespace, row.name)))


class _StateCollector(Collector):
    def __init__(self, owner: ControllerMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Metric]:
        owner = self.owner
        yield GaugeMetricFamily("kubecell_elastic_leader", "1 while this replica leads (or runs without "
                                "election)", value=1.0 if owner.leading() else 0.0)
        yield GaugeMetricFamily("kubecell_elastic_synced", "1 once the controller has listed its ElasticJobs and "
                                "Pods and completed a pass", value=1.0 if owner.synced.is_set() else 0.0)
        rows = owner.rows
        phases = GaugeMetricFamily("kubecell_elastic_jobs", "ElasticJobs by the phase their status states",
                                   labels=["phase"])
        tally = Tally(row.phase for row in rows)
        for phase in Phase:  # every phase, 0 included (an unknown one is read as Pending)
            phases.add_metric([str(phase)], float(tally[str(phase)]))
        yield phases
        labels = ["namespace", "elasticjob"]
        per_job = {
            "target": GaugeMetricFamily("kubecell_elastic_job_target_replicas", "Workers the job runs at "
                                        "(status.targetReplicas: spec.replicas once established)", labels=labels),
            "workers": GaugeMetricFamily("kubecell_elastic_job_replicas", "Worker Pods that are not leaving "
                                         "(status.replicas)", labels=labels),
            "ready": GaugeMetricFamily("kubecell_elastic_job_ready_replicas", "Ready workers "
                                       "(status.readyReplicas)", labels=labels),
            "restarts": GaugeMetricFamily("kubecell_elastic_job_restarts", "Rendezvous restarts counted against "
                                          "maxRestarts (status.restarts)", labels=labels),
        }
        for row in rows:
            key = [row.namespace, row.name]
            per_job["target"].add_metric(key, float(row.target))
            per_job["workers"].add_metric(key, float(row.workers))
            per_job["ready"].add_metric(key, float(row.ready))
            per_job["restarts"].add_metric(key, float(row.restarts))
        yield from per_job.values()


class ControllerMetrics:
    """The controller's counters and published state, in a registry of its own (a test may run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rows: tuple[JobRow, ...] = ()
        self.synced = threading.Event()
        self.leading: Callable[[], bool] = lambda: True
        """Whether this replica leads (the process sets it to its elector's flag)."""
        self.reconciles = Counter("kubecell_elastic_reconciles", "Reconciles of one ElasticJob, by outcome "
                                  "(refused: the API refused its rendezvous Service or host, quota or "
                                  "admission; error: another API error or a bug; either way the job is tried "
                                  "again at the next resync)",
                                  ["outcome"], registry=self.registry)
        self.reconcile_seconds = Histogram("kubecell_elastic_reconcile_duration_seconds", "Time to reconcile one "
                                           "ElasticJob (API round trips included)", registry=self.registry,
                                           buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.pod_writes = Counter("kubecell_elastic_pod_writes", "Creates and deletes of worker and rendezvous "
                                  "Pods, by verb and outcome (ok; exists or gone: a repeat the API answered 409 or "
                                  "404; refused: quota or admission)", ["verb", "outcome"], registry=self.registry)
        self.events = Counter("kubecell_elastic_events", "Events recorded on ElasticJobs, by type and reason",
                              ["type", "reason"], registry=self.registry)
        self.expiries = Counter("kubecell_elastic_expired_jobs", "Finished ElasticJobs deleted past their "
                                "spec.ttlSecondsAfterFinished (deleted: or found gone; refused: the API refused the "
                                "delete, tried again later)", ["outcome"], registry=self.registry)
        for outcome in ("ok", "refused", "error"):
            self.reconciles.labels(outcome)
        for outcome in ("deleted", "refused"):
            self.expiries.labels(outcome)
        for verb, outcome in (("create", "ok"), ("create", "exists"), ("create", "refused"), ("delete", "ok"),
                              ("delete", "gone")):
            self.pod_writes.labels(verb, outcome)
        self.registry.register(_StateCollector(self))

    def publish(self, jobs: Iterable[Mapping[str, Any]]) -> None:
        """The loop's pass is done: its cache becomes what the state metrics show."""
        self.rows = job_rows(jobs)
        self.synced.set()

    def render(self) -> bytes:
        """Prometheus' text format."""
        return generate_latest(self.registry)
