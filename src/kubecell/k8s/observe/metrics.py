"""Prometheus metrics of a running scheduler."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from kubecell.k8s.leader import LeaderElector
from kubecell.k8s.scheduler.scheduler import Scheduler


class Metrics:
    """Gauges read from the scheduler at scrape time (nothing to keep in step by hand)."""

    def __init__(self, scheduler: Scheduler, elector: LeaderElector | None) -> None:
        self.registry = CollectorRegistry()
        self.scheduler = scheduler
        self.elector = elector
        Gauge("kubecell_leader", "1 while this replica leads", registry=self.registry).set_function(
            lambda: 1.0 if elector is None or elector.leading.is_set() else 0.0)
        Gauge("kubecell_scheduling_cycles", "Scheduling cycles run by this replica",
              registry=self.registry).set_function(lambda: float(scheduler.cycles))
        Gauge("kubecell_api_writes", "Writes to the API server that carry decisions (records, bindings, "
              "evictions, conditions, FailedScheduling events)",
              registry=self.registry).set_function(lambda: float(scheduler.actions.writes))
        Gauge("kubecell_pending_jobs", "Jobs waiting to be placed", registry=self.registry).set_function(
            lambda: float(len(scheduler.engine.pending)) if scheduler.engine else 0.0)
        Gauge("kubecell_running_jobs", "Jobs holding GPUs", registry=self.registry).set_function(
            lambda: float(len(scheduler.engine.running)) if scheduler.engine else 0.0)
        Gauge("kubecell_allocated_gpus", "GPUs allocated (fractions count as their share)",
              registry=self.registry).set_function(
            lambda: scheduler.engine.book.allocated_gpu_milli / 1000 if scheduler.engine else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
