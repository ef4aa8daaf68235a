"""What the scheduler *did*, counted where it happens: attempts, latency, preemptions, gang outcomes.

Gauges (who holds which GPU now) are read from the latest ``Snapshot`` at scrape time; events cannot be:
a placement that came and went between two scrapes must still be counted. So ``Scheduler.cycle`` hands
each cycle's result to a ``Recorder``, which bumps Prometheus counters and histograms (thread-safe, cheap)
and keeps the last decisions for the snapshot. The HTTP thread never computes anything here; it only
reads the collectors.

Result labels are kube-scheduler's where they mean the same (``scheduled``, ``unschedulable``,
``error``), plus ``rejected`` (a job nothing could ever admit) and ``preempted`` for evicted work.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from prometheus_client import Counter, Histogram, disable_created_metrics
from prometheus_client.registry import Collector

from kubecell.core.book import AllocationBook
from kubecell.core.engine.attempt import CycleResult
from kubecell.core.engine.job import Job
from kubecell.scheduler.observe.snapshot import Decision

# A "<counter>_created" gauge per series only doubles what Prometheus stores (process-wide setting).
disable_created_metrics()  # type: ignore[no-untyped-call]

DECISIONS_KEPT = 200
"""Decisions the snapshot shows (the dashboard's 'last decisions'); older ones are only counted."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds: a cycle decides in milliseconds on a small cluster and in tenths of a second at 5,000 nodes."""
WAIT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
"""Seconds a job waits in the queue: from a tenth of a second (an idle cluster) to a day (a full one)."""

RESULTS = ("scheduled", "unschedulable", "rejected", "error")
GANG_OUTCOMES = ("placed", "placed_partial", "grown", "shrunk", "preempted", "bind_failed", "rejected")


class Recorder:
    """Counters and histograms of scheduling events, and a ring of the last decisions."""

    def __init__(self) -> None:
        self.attempts = Counter(
            "kubecell_schedule_attempts", "Scheduling attempts by result: scheduled (a job or gang started), "
            "unschedulable (a job still waiting after a cycle that ran), rejected (never admissible), error "
            "(the API server refused its allocation record or Binding)", ["result"], registry=None)
        self.attempt_seconds = Histogram(
            "kubecell_scheduling_attempt_duration_seconds", "Duration of the scheduling cycle (the engine's "
            "decision plus writing records and Bindings) an attempt was part of, one observation per attempt",
            ["result"], buckets=LATENCY_BUCKETS, registry=None)
        self.cycle_seconds = Histogram(
            "kubecell_scheduling_cycle_duration_seconds", "Duration of one scheduling cycle by phase: decide "
            "(the engine) and act (records, Bindings, evictions)", ["phase"], buckets=LATENCY_BUCKETS,
            registry=None)
        self.queue_wait_seconds = Histogram(
            "kubecell_job_queue_wait_seconds", "Time from a job's entry into the queue to its start",
            buckets=WAIT_BUCKETS, registry=None)
        self.preemptions = Counter(
            "kubecell_preemptions", "Jobs evicted to make room for others, by the VC of the evicted job",
            ["vc"], registry=None)
        self.gang_outcomes = Counter(
            "kubecell_gang_outcomes", "What became of multi-member jobs: placed (every member), placed_partial "
            "(a threshold gang started below its headcount), grown, shrunk (members above its minimum released "
            "for a preemptor; it runs on), preempted, bind_failed (rolled back), rejected", ["outcome"],
            registry=None)
        self.binding_failures = Counter(
            "kubecell_binding_failures", "Allocation records or Bindings the API server refused", registry=None)
        self.elastic_resizes = Counter(
            "kubecell_elastic_resizes", "ElasticJob targets the scheduler set through /scale, by direction",
            ["direction"], registry=None)
        self.elastic_moves = Counter(
            "kubecell_elastic_moves", "ElasticJobs moved to another GPU model (every worker restarts there)",
            registry=None)
        self.elastic_starts = Counter(
            "kubecell_elastic_starts", "Waiting ElasticJob gangs started on another GPU model than the one they "
            "waited on: after a move whose GPUs were taken before its new gang formed (after=move), or while "
            "waiting for room (after=wait)", ["after"], registry=None)
        self.step_reports = Counter(
            "kubecell_elastic_step_reports", "Workers' step reports read, by outcome: accepted by the goodput "
            "model, or the reason they were refused (MalformedReport, StaleReport, UntrustedReport ...)",
            ["outcome"], registry=None)
        for result in RESULTS:
            self.attempts.labels(result)
            self.attempt_seconds.labels(result)
        for outcome in GANG_OUTCOMES:
            self.gang_outcomes.labels(outcome)
        for phase in ("decide", "act"):
            self.cycle_seconds.labels(phase)
        for direction in ("grow", "shrink"):
            self.elastic_resizes.labels(direction)
        for after in ("move", "wait"):
            self.elastic_starts.labels(after)
        self.step_reports.labels("accepted")
        self._decisions: deque[Decision] = deque(maxlen=DECISIONS_KEPT)
        self._lock = threading.Lock()

    def collectors(self) -> tuple[Collector, ...]:
        """What a ``CollectorRegistry`` serving this scheduler registers (any number of registries may)."""
        return (self.attempts, self.attempt_seconds, self.cycle_seconds, self.queue_wait_seconds,
                self.preemptions, self.gang_outcomes, self.binding_failures, self.elastic_resizes,
                self.elastic_moves, self.elastic_starts, self.step_reports)

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """The last ``DECISIONS_KEPT`` decisions, oldest first."""
        with self._lock:
            return tuple(self._decisions)

    # ------------------------------------------------------------------ events
    def cycle(self, result: CycleResult, book: AllocationBook, *, now: float, decide_seconds: float,
              act_seconds: float, failed: Sequence[Job], waiting: int) -> None:
        """One cycle that ran. ``failed``: jobs of ``result.started``/``grown`` whose writes the API server
        refused (they are back in the queue); ``waiting``: jobs still queued after it. Unschedulable
        attempts are counted one per waiting job but observed once per cycle in the latency histogram (a
        queue of thousands would otherwise cost a cycle thousands of observations)."""
        total = decide_seconds + act_seconds
        self.cycle_seconds.labels("decide").observe(decide_seconds)
        self.cycle_seconds.labels("act").observe(act_seconds)
        grown = {id(job) for job in result.grown}
        refused = {id(job) for job in failed}
        decisions: list[Decision] = []
        for job in [*result.started, *result.grown]:
            if id(job) in refused:
                continue
            was_grown = id(job) in grown
            if not was_grown:
                self._attempt("scheduled", total)
                if job.queued_at is not None:
                    self.queue_wait_seconds.observe(max(0.0, now - job.queued_at))
            if job.spec.members > 1:
                outcome = ("grown" if was_grown else
                           "placed" if job.size >= job.spec.members else "placed_partial")
                self.gang_outcomes.labels(outcome).inc()
            decisions.append(_placed(job, book, now, "grown" if was_grown else "placed"))
        for job in failed:
            self.attempt_seconds.labels("error").observe(total)
            decisions.append(self._refused(job.name, job.vc, job.spec.members > 1, now, job.wait_reason))
        for cut in result.shrunk:
            self.gang_outcomes.labels("shrunk").inc()
            decisions.append(_placed(cut.job, book, now, "shrunk", cut.reason))
        for job in result.evicted:
            self.preemptions.labels(job.vc).inc()
            if job.spec.members > 1:
                self.gang_outcomes.labels("preempted").inc()
            decisions.append(Decision(now, job.name, job.vc, "preempted", (), (), None, job.wait_reason))
        for job in result.rejected:
            self._attempt("rejected", total)
            if job.spec.members > 1:
                self.gang_outcomes.labels("rejected").inc()
        if waiting:
            self.attempts.labels("unschedulable").inc(waiting)
            self.attempt_seconds.labels("unschedulable").observe(total)
        with self._lock:
            self._decisions.extend(decisions)

    def binding_refused(self, job: str, vc: str, *, gang: bool, now: float, detail: str) -> None:
        """A Binding sent without waiting that the API server refused (its answer came back later, on a
        writer thread: hence names, not the engine's job object)."""
        decision = self._refused(job, vc, gang, now, detail)
        with self._lock:
            self._decisions.append(decision)

    def _refused(self, job: str, vc: str, gang: bool, now: float, detail: str) -> Decision:
        self.binding_failures.inc()
        self.attempts.labels("error").inc()
        if gang:
            self.gang_outcomes.labels("bind_failed").inc()
        return Decision(now, job, vc, "failed", (), (), None, detail)

    def _attempt(self, result: str, seconds: float) -> None:
        self.attempts.labels(result).inc()
        self.attempt_seconds.labels(result).observe(seconds)


def _placed(job: Job, book: AllocationBook, now: float, action: str, detail: str | None = None) -> Decision:
    """A decision naming where the job's members are now (nodes in first-member order, ``node/index`` GPUs);
    ``detail``: why (default: its class)."""
    nodes: dict[str, None] = {}
    gpus: list[str] = []
    for member in job.running_members:
        allocation = book.allocations.get(member)
        if allocation is None:
            continue
        nodes[allocation.node] = None
        gpus.extend(f"{allocation.node}/{index}" for index in allocation.gpu_indices)
    score = None if job.placement_score is None else float(job.placement_score)
    klass = job.job_class.value if job.job_class is not None else ""
    return Decision(now, job.name, job.vc, action, tuple(nodes), tuple(gpus), score,
                    klass if detail is None else detail)
