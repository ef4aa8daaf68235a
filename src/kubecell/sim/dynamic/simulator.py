"""Discrete-event simulation of the engine on an embedded cluster: arrivals, starts, completions,
preemptions, node failures and configuration reloads on a simulated clock.

A job needs ``work`` seconds of execution at full size; running with n of its members it progresses
at rate n / members. A preempted or failed job keeps the progress of its last checkpoint (every
``checkpoint_seconds`` of its run) and loses the rest, which is reported as GPU-time lost. A resize is
work-conserving: an elastic job that grows or shrinks (``CycleResult.grown``, ``CycleResult.shrunk``)
keeps all the work it has done and runs on at the rate of its new size, so its remaining GPU-work is
spread over its new member count (elastic training rescales without a restart; no GPU-time is lost). With a
``speed_model`` (``sharing``), jobs sharing a GPU also run at the speed the model gives them beside their
partners, re-rated work-conservingly whenever a GPU's sharers change; without one a share runs as fast as a
whole GPU, as before. The engine runs one scheduling cycle per distinct event time. One bad job never stops a
run: the engine rejects it with a reason and the simulation counts it.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum

from kubecell.core.engine.engine import CycleResult, Engine
from kubecell.core.engine.job import Job, JobClass, JobPhase, JobSpec
from kubecell.core.engine.options import EngineOptions
from kubecell.core.estimates import DurationHistory
from kubecell.core.interference.history import PairHistory
from kubecell.core.model import Node
from kubecell.core.placement.frag import FragmentationMeasure, PodShape, typical_pods
from kubecell.core.placement.registry import DEFAULT_POLICY, PolicyContext, make_policy
from kubecell.core.tenancy.config import Tenants
from kubecell.sim.dynamic.sharing import SharingTracker, SpeedModel


class EventKind(IntEnum):
    # Order inside one timestamp: finishes free capacity before new work arrives.
    FINISH = 0
    NODE = 1
    RELOAD = 2
    SUBMIT = 3
    WAKE = 4  # a time-based rule (minimum runtime, starvation threshold) needs a cycle
    SAMPLE = 5


@dataclass(frozen=True, slots=True)
class NodeEvent:
    time: float
    node: str
    healthy: bool


@dataclass(slots=True)
class JobRecord:
    """What happened to one job (times in seconds of simulated time)."""

    name: str
    vc: str
    gpus: float
    members: int
    priority: int
    submit: float
    first_start: float | None = None
    finish: float | None = None
    preemptions: int = 0
    failures: int = 0
    rejected: str | None = None
    first_class: str | None = None
    within_guarantee: bool = False
    lost_gpu_seconds: float = 0.0

    @property
    def queueing_delay(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.submit

    @property
    def completion_time(self) -> float | None:
        return None if self.finish is None else self.finish - self.submit


@dataclass(slots=True)
class Sample:
    time: float
    allocated_milli: int
    per_vc: dict[str, tuple[float, float, float]]  # VC -> (guaranteed, borrowed, opportunistic) GPUs
    pending: int
    fragment_milli: float = 0.0  # free GPU milli the workload's typical jobs cannot use (FGD measure)
    idle_milli: int = 0


@dataclass(slots=True)
class SimulationResult:
    policy: str
    records: list[JobRecord]
    samples: list[Sample]
    total_gpus: int
    start: float
    end: float
    gpu_seconds_allocated: float
    gangs_broken: int
    wall_seconds: float
    guaranteed_gpus: dict[str, int] = field(default_factory=dict)

    @property
    def utilisation(self) -> float:
        span = self.end - self.start
        return self.gpu_seconds_allocated / (self.total_gpus * span) if span > 0 and self.total_gpus else 0.0


@dataclass(slots=True)
class _Run:
    token: int
    started: float
    rate: float
    done_before: float  # work completed before this run segment


FAMILY_LABELS = ("family", "application", "model")
"""The labels that name a job's workload family, in order of preference (trace loaders set ``application``
for Sia, ``model`` for Philly)."""


def family_keys(spec: JobSpec) -> list[tuple[str, ...]]:
    """The history keys of a job, most specific first: (VC, family, GPUs per job), (VC, family). A job without a
    family label has none: nothing is expected of it."""
    labels = dict(spec.labels)
    family = next((labels[name] for name in FAMILY_LABELS if labels.get(name)), None)
    if family is None:
        return []
    return [(spec.vc, family, str(spec.total_gpu_milli)), (spec.vc, family)]


class DynamicSimulation:
    def __init__(
        self,
        nodes: Sequence[Node],
        tenants: Tenants,
        options: EngineOptions,
        jobs: Sequence[JobSpec],
        *,
        node_events: Sequence[NodeEvent] = (),
        reloads: Sequence[tuple[float, Tenants]] = (),
        sample_seconds: float = 3600.0,
        checkpoint_seconds: float = 1800.0,
        horizon: float | None = None,
        placement: str = DEFAULT_POLICY,
        speed_model: SpeedModel | None = None,
        durations: DurationHistory | None = None,
        pair_history: PairHistory | None = None,
    ) -> None:
        """``placement`` names the placement policy every member is placed with (FGD is given the
        workload's typical member shapes in advance, as published; the others need nothing). ``speed_model``:
        how fast jobs sharing a GPU run (``sharing``); None, every job runs at full speed. ``durations``: the
        job history the simulation keeps as it goes, as a cluster's profiler would: each job is submitted with
        the run time its family's finished jobs give (``JobSpec.expected_seconds``, for ``queue_order``), and
        adds its own run time (first start to finish) when it finishes; None: no estimates. ``pair_history``:
        what sharing did, kept as the simulation goes, as a cluster's profiler would (``sharing``; with a
        ``speed_model`` only), for a ``HistoryInformed`` admission rule to read."""
        # Fragmentation is measured against the workload's own typical member shapes (by job count).
        typical = typical_pods(
            (PodShape(s.member.cpu_milli or 100, s.member.gpu_milli, s.member.gpu_count,
                      "|".join(sorted(s.member.gpu_models or ()))) for s in jobs),
            coverage=0.95, include_cpu_pods=True)
        self.placement = placement
        self.engine = Engine(nodes, tenants, options, placement=make_policy(placement, PolicyContext(typical)))
        self._measure = FragmentationMeasure(typical, self.engine.book.model_names)
        self.options = options
        self.jobs = list(jobs)
        self.node_events = list(node_events)
        self.reloads = list(reloads)
        self.sample_seconds = sample_seconds
        self.checkpoint_seconds = checkpoint_seconds
        self.horizon = horizon
        self._heap: list[tuple[float, int, int, object]] = []
        self._sequence = 0
        self._runs: dict[str, _Run] = {}
        self._done: dict[str, float] = {}
        self._tokens = 0
        self.records: dict[str, JobRecord] = {}
        self._wake_pushed: float | None = None
        self.sharing = SharingTracker(speed_model, pair_history) if speed_model is not None else None
        self.durations = durations

    def _push(self, when: float, kind: EventKind, payload: object) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (when, int(kind), self._sequence, payload))

    def run(self) -> SimulationResult:
        wall = time.perf_counter()
        engine = self.engine
        for spec in self.jobs:
            self._push(spec.submit_time, EventKind.SUBMIT, spec)
        for event in self.node_events:
            self._push(event.time, EventKind.NODE, event)
        for when, tenants in self.reloads:
            self._push(when, EventKind.RELOAD, tenants)
        start = min((s.submit_time for s in self.jobs), default=0.0)
        end_limit = self.horizon if self.horizon is not None else math.inf
        if self.sample_seconds > 0:
            self._push(start, EventKind.SAMPLE, None)
        samples: list[Sample] = []
        allocated_integral = 0.0
        last_time = start
        gangs_broken = 0
        now = start
        while self._heap:
            now = self._heap[0][0]
            if now > end_limit:
                now = end_limit
                break
            allocated = engine.book.allocated_gpu_milli
            allocated_integral += allocated / 1000.0 * (now - last_time)
            last_time = now
            only_samples = True
            sample_due = False
            while self._heap and self._heap[0][0] == now:
                _, kind, _, payload = heapq.heappop(self._heap)
                if kind == EventKind.SAMPLE:
                    sample_due = True  # taken after this time's cycle, so it shows the decisions made
                    continue
                only_samples = False
                self._handle(EventKind(kind), payload, now, samples)
            if not only_samples:
                result = engine.schedule(now)
                self._apply(result, now)
                if self.sharing is not None:
                    self._rerate(now)
                wake = engine.queries.next_wake()
                if wake is not None and wake > now and wake != self._wake_pushed:
                    self._wake_pushed = wake
                    self._push(wake, EventKind.WAKE, None)
                # Gangs shrink only by whole-job stops and by shrinks (never below their minimums), so
                # checking the jobs this cycle touched suffices.
                touched = [*result.started, *result.grown, *(cut.job for cut in result.shrunk)]
                gangs_broken += sum(1 for job in touched if 0 < job.size < job.spec.minimum)
            if sample_due:
                self._handle(EventKind.SAMPLE, None, now, samples)
            if not self._work_left():
                break
        if self.sharing is not None:
            self.sharing.finish(now)
        for job in engine.jobs.values():
            record = self.records.get(job.name)
            if record is not None:
                record.preemptions = job.preemptions
        return SimulationResult(
            policy=self.options.name,
            records=list(self.records.values()),
            samples=samples,
            total_gpus=engine.book.total_gpu_milli // 1000,
            start=start,
            end=now,
            gpu_seconds_allocated=allocated_integral,
            gangs_broken=gangs_broken,
            wall_seconds=time.perf_counter() - wall,
            guaranteed_gpus={vc.name: vc.guaranteed_gpus for vc in engine.tenants.vcs},
        )

    def _work_left(self) -> bool:
        engine = self.engine
        if engine.running:
            return True
        return any(kind not in (EventKind.SAMPLE, EventKind.WAKE) for _, kind, _, _ in self._heap)

    # ------------------------------------------------------------------ events
    def _handle(self, kind: EventKind, payload: object, now: float, samples: list[Sample]) -> None:
        engine = self.engine
        if kind == EventKind.SUBMIT:
            assert isinstance(payload, JobSpec)
            if self.durations is not None:
                payload = replace(payload, expected_seconds=self.durations.estimate(family_keys(payload)))
            job = engine.submit(payload, now)
            vc = engine.tenants.get(payload.vc)
            record = JobRecord(payload.name, payload.vc, payload.total_gpu_milli / 1000, payload.members,
                               payload.priority, payload.submit_time)
            record.within_guarantee = vc is not None and not payload.opportunistic and (
                engine.queries.guarantee_could_hold(vc, payload))
            if job.phase == JobPhase.REJECTED:
                record.rejected = job.wait_reason
            self.records.setdefault(payload.name, record)
            self._done[payload.name] = 0.0
        elif kind == EventKind.FINISH:
            assert isinstance(payload, tuple)
            name, token = payload
            run = self._runs.get(name)
            if run is None or run.token != token:
                return  # stale: the job was preempted or resized since
            del self._runs[name]
            job = engine.jobs[name]
            engine.finish(name, now)
            record = self.records[name]
            record.finish = now
            if self.durations is not None and record.first_start is not None:
                self.durations.record(family_keys(job.spec), now - record.first_start)
        elif kind == EventKind.NODE:
            assert isinstance(payload, NodeEvent)
            for job in engine.set_node_health(payload.node, payload.healthy, now):
                self._interrupt(job, now)
                self.records[job.name].failures += 1
        elif kind == EventKind.RELOAD:
            assert isinstance(payload, Tenants)
            engine.reload(payload, now)
        elif kind == EventKind.WAKE:
            pass  # the cycle after this batch of events does the work
        elif kind == EventKind.SAMPLE:
            per_vc = {name: (s["guaranteed_used_gpus"], s["borrowed_gpus"], s["opportunistic_gpus"])
                      for name, s in engine.queries.status().items()}
            book = engine.book
            fragment = float(self._measure.node_fragmentation(book.cpu_free, book.gpu_avail, book.model_id).sum())
            samples.append(Sample(now, book.allocated_gpu_milli, per_vc, len(engine.pending), fragment,
                                  int(book.total_avail.sum())))
            if self._work_left() or not samples or len(samples) < 2:
                self._push(now + self.sample_seconds, EventKind.SAMPLE, None)

    def _apply(self, result: CycleResult, now: float) -> None:
        engine = self.engine
        for job in result.rejected:  # e.g. requeued after its VC was removed by a reload
            self.records[job.name].rejected = job.wait_reason
        for cut in result.shrunk:  # before evictions: a job shrunk and then evicted in one cycle stops
            self._resize(cut.job, now)
        for job in result.evicted:
            self._interrupt(job, now)
        for job in result.started:
            if job.phase == JobPhase.RESERVED:
                engine.confirm(job.name, now)  # victims are gone at once in simulation
            record = self.records[job.name]
            if record.first_start is None:
                record.first_start = now
                record.first_class = (job.job_class or JobClass.GUARANTEED).value
            self._begin(job, now)
        for job in result.grown:
            self._resize(job, now)

    def _resize(self, job: Job, now: float) -> None:
        """Work-conserving: the work done so far is kept, the rest runs at the job's new size."""
        if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED) and job.name in self._runs:
            self._progress(job, now)
            self._begin(job, now)

    def _rerate(self, now: float) -> None:
        """Jobs whose GPU partners changed this cycle keep their progress and run on at their new speed."""
        assert self.sharing is not None
        for name in self.sharing.update(self.engine, list(self._runs), now):
            job = self.engine.jobs[name]
            self._progress(job, now)
            self._begin(job, now)

    def _rate(self, job: Job) -> float:
        if self.sharing is None:
            return job.size / job.spec.members
        return job.size / job.spec.members * self.sharing.speed_of(job.name)

    def _progress(self, job: Job, now: float) -> None:
        run = self._runs.get(job.name)
        if run is not None:
            self._done[job.name] = run.done_before + (now - run.started) * run.rate
            run.done_before = self._done[job.name]
            run.started = now

    def _begin(self, job: Job, now: float) -> None:
        self._tokens += 1
        rate = self._rate(job)
        done = self._done.get(job.name, 0.0)
        self._runs[job.name] = _Run(self._tokens, now, rate, done)
        remaining = max(job.spec.work - done, 0.0)
        self._push(now + (remaining / rate if rate > 0 else 0.0), EventKind.FINISH, (job.name, self._tokens))

    def _interrupt(self, job: Job, now: float) -> None:
        """A running job stopped early: keep its last checkpoint, count the rest as lost."""
        run = self._runs.pop(job.name, None)
        if run is None:
            return
        elapsed = now - run.started
        if self.checkpoint_seconds > 0:
            kept = math.floor(elapsed / self.checkpoint_seconds) * self.checkpoint_seconds
        else:
            kept = elapsed
        self._done[job.name] = run.done_before + kept * run.rate
        lost = (elapsed - kept) * run.rate * job.spec.total_gpu_milli / 1000.0
        self.records[job.name].lost_gpu_seconds += lost
