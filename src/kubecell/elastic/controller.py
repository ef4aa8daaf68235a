"""The ElasticJob controller's reconcile loop: list and watch ElasticJobs and their Pods, decide each job's
next step with the state machine (``kubecell.elastic.states``), write the status, then act.

**Restart-safe.** Everything that must survive lives in the API server: the phase, when the workers last
changed (``lastResizeTime``), its record of each job (``kubecell.elastic.finished``, a ConfigMap only it writes,
since anyone with status rights may write the status: how the job ended, its restart count, the target its
workers follow; the status shows them, and is written back where it says otherwise) and the Pods themselves,
each labelled with the rendezvous run it joins (the restart count when it was made: a worker of an older run is
replaced, whoever made it). Worker names are deterministic
(``<job>-worker-<i>``), so a create repeated after a crash is answered 409 and changes nothing. The status
is written *before* the actions, with the job's ``resourceVersion`` as a precondition: a restart is counted
once, and a decision taken on a stale copy of the job is refused (409) and taken again on the fresh one.
What the controller keeps in memory is only what it did and has not seen come back yet (client-go's
"expectations": Pods it deleted or created, indices it left missing on purpose), so it never double-counts
while its watch lags; a new controller starts without them and reads everything from a fresh list.

**Bounded.** One thread consumes the watch events; each job is reconciled when one of its objects changed,
and every ``resync_seconds`` (deadlines depend on time). A reconcile reads the cache, writes the status only
when it changed, and sends at most one request per worker. A bug or an API error while reconciling one job
is logged and costs that job one pass, never the loop. An ElasticJob that cannot be read gets its condition
and an Event and nothing else is touched: its Pods, if any, are left as they are.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubecell.elastic import workers as readers
from kubecell.elastic.events import JobEvents, object_key
from kubecell.elastic.expectations import Expectations
from kubecell.elastic.expiry import Expiries
from kubecell.elastic.finished import REASON_NOT_OBSERVED, FinishedJobs, disowned, memory
from kubecell.elastic.metrics import ControllerMetrics
from kubecell.elastic.stall import StallClocks
from kubecell.elastic.states import (
    STARTED,
    TERMINAL,
    CreateWorker,
    Decision,
    DeleteWorker,
    Emit,
    EnsureRendezvous,
    Observation,
    Phase,
    RemoveRendezvous,
    Worker,
    counted,
    step,
)
from kubecell.elastic.status import MAX_GENERATION, StatusView, count, read_status, status_body
from kubecell.elastic.writes import CreateRefusedError, JobWrites
from kubecell.kube.clock import rfc3339
from kubecell.kube.elasticjob_objects import template_hash
from kubecell.kube.elasticjobs import (
    LABEL_JOB,
    ROLE_RENDEZVOUS,
    ROLE_WORKER,
    ElasticJobSpec,
    ElasticJobSpecError,
    collection_path,
    job_path,
    read_elastic_job,
    rendezvous_name,
    worker_index,
)
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.watch import Collection, Event, Watcher

log = logging.getLogger("kubecell.elastic")

COMPONENT = "kubecell-elastic-controller"
MAX_CREATES_PER_PASS = 500
"""Workers one job's reconcile creates at most (the ReplicaSet controller's burst); the rest are owed to the
next resync. After the first the API refuses (quota, admission) the job makes none more that pass: a job of
4,096 workers under a quota made 8,192 calls (a create and an Event each) in one reconcile, 20 s during which
no other ElasticJob was reconciled."""

@dataclass(frozen=True, slots=True)
class ControllerOptions:
    namespace: str | None = None
    """Watch one namespace (None: all)."""
    component: str = COMPONENT
    """The name the controller's Events carry."""
    resync_seconds: float = 5.0
    """Every job that has not ended is reconciled at least this often (deadlines are time-driven)."""
    service_recheck_seconds: float = 60.0
    """How long a rendezvous Service seen is believed to exist before it is looked up again."""
    expectation_seconds: float = 60.0
    """How long a create or delete of the controller's own stands for its Pod before the watch shows it."""
    stuck_seconds: float = 300.0
    """How long past its grace period a Pod of a job may stay Terminating before it is deleted at once (its node
    is lost: nothing else would ever end it, and the job could not replace it)."""
    state_namespace: str = "kubecell-system"
    """The controller's own namespace (its Lease's), where it records the jobs it saw end."""


class ElasticController:
    """Runs ElasticJobs until :meth:`shutdown`; :attr:`ready` is set after the first full pass."""

    def __init__(self, kube: Kube, options: ControllerOptions | None = None, *,
                 clock: Callable[[], float] = time.time, metrics: ControllerMetrics | None = None) -> None:
        self.kube = kube
        self.options = options or ControllerOptions()
        self.clock = clock
        self.metrics = metrics or ControllerMetrics()
        self.events: queue.Queue[Event] = queue.Queue()
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.pods_of: dict[str, set[str]] = {}
        self.dirty: set[str] = set()
        self.expectations: dict[str, Expectations] = {}
        self.synced: set[str] = set()
        self.job_events = JobEvents(kube, self.metrics, self.options.component)
        """The job's Events, a refused create told once, not per retry."""
        self.writes = JobWrites(kube, self.metrics, self.job_events.tell_once,
                                recheck_seconds=self.options.service_recheck_seconds,
                                expectation_seconds=self.options.expectation_seconds)
        self.finished = FinishedJobs(kube, self.options.state_namespace, self.options.namespace)
        """The jobs it saw end (read at the first pass): a status that says so is not enough."""
        self.stalls = StallClocks()
        """How long each job has been short of its minimum Ready, on this controller's clock (never the status')."""
        self.expiries = Expiries(kube, self.metrics.expiries)
        """When finished jobs with ``spec.ttlSecondsAfterFinished`` are deleted (from the record's end times)."""

    def shutdown(self) -> None:
        self.stop.set()

    # --- the loop --------------------------------------------------------------------------------------

    def run(self) -> None:
        namespace = self.options.namespace
        pods_path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        watchers = [
            Watcher(self.kube, Collection("elasticjobs", collection_path(namespace), optional=True), self.events,
                    self.stop),
            Watcher(self.kube, Collection("pods", pods_path, query=(("labelSelector", LABEL_JOB),),
                                          transform=readers.trimmed), self.events, self.stop),
        ]
        for watcher in watchers:
            watcher.start()
        next_resync = time.monotonic() + self.options.resync_seconds
        while not self.stop.is_set():
            try:
                self._apply(self.events.get(timeout=0.5))
                for _ in range(10_000):  # drain what is queued, then act once on all of it
                    self._apply(self.events.get_nowait())
            except queue.Empty:
                pass
            if self.synced != {"elasticjobs", "pods"}:
                continue
            resync = time.monotonic() >= next_resync
            if resync:
                next_resync = time.monotonic() + self.options.resync_seconds
                self.dirty |= {key for key, obj in self.jobs.items() if self._final(key, obj) is None}
            if self.reconcile_dirty() or resync or not self.ready.is_set():
                self.expiries.expire(self.clock())
                self.metrics.publish(self.jobs.values())
            if self.finished.loaded:
                self.ready.set()

    def reconcile_dirty(self) -> int:
        """Reconcile the jobs marked dirty; how many were (none while the record of ended jobs is unreadable)."""
        if (self.dirty or not self.finished.loaded) and not self.finished.ready(self.jobs):
            return 0
        dirty, self.dirty = self.dirty, set()
        for key in sorted(dirty):
            if self.stop.is_set():
                break
            started, outcome = time.perf_counter(), "ok"
            try:
                self.reconcile(key)
            except CreateRefusedError as refused:  # logged when its Event is told: no traceback per resync
                outcome = "refused"
                log.log(logging.WARNING if refused.told else logging.DEBUG,
                        "ElasticJob %s waits: %s; trying again at every resync", key, refused)
            except Exception:  # one job's trouble (a bug, an API error) must never stop the others
                outcome = "error"
                log.exception("reconciling ElasticJob %s failed; trying again at the next resync", key)
            self.metrics.reconciles.labels(outcome).inc()
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        return len(dirty)

    def _apply(self, event: Event) -> None:
        if event.kind == "elasticjobs":
            if event.type == "SYNC":
                self.synced.add("elasticjobs")
                before, self.jobs = self.jobs, {object_key(obj): obj for obj in event.objects}
                self.dirty |= set(self.jobs)
                self.finished.prune(self.jobs)  # (deleted while unwatched: their records go)
                remembered = {*self.expectations, *self.writes.services, *self.job_events.told}
                for key in remembered:  # deleted while unwatched,
                    if key not in self.jobs or _uid(self.jobs[key]) != _uid(before.get(key)):  # or made again
                        self._forget(key)
                return
            key = object_key(event.obj)
            if event.type == "DELETED":
                self.jobs.pop(key, None)
                self._forget(key)
            else:
                if key in self.jobs and _uid(self.jobs[key]) != _uid(event.obj):  # another job under the name
                    self._forget(key)
                self.jobs[key] = event.obj
                self.dirty.add(key)
            return
        if event.type == "SYNC":
            self.synced.add("pods")
            self.pods, self.pods_of = {}, {}
            for pod in event.objects:
                self._keep_pod(pod)
            self.dirty |= {key for key in self.pods_of if key in self.jobs}
            return
        uid = str((event.obj.get("metadata") or {}).get("uid", ""))
        old = self.pods.pop(uid, None)
        if old is not None:
            old_key = readers.job_key(old) or ""
            members = self.pods_of.get(old_key)
            if members is not None:
                members.discard(uid)
                if not members:  # a label value never seen again leaves nothing behind
                    del self.pods_of[old_key]
        if event.type != "DELETED":
            self._keep_pod(event.obj)
        changed = readers.job_key(event.obj)
        if changed is not None:
            self.dirty.add(changed)

    def _forget(self, key: str) -> None:
        """Drop what the controller kept for the job under ``key`` (by name): gone, or another job made under its
        name. Kept for the new one, the old one's expectations stood for a minute (its workers counted as made,
        its Service as existing: the new job got neither) and its told Warnings were not told again."""
        for kept in (self.expectations, self.writes.services, self.job_events.told):
            kept.pop(key, None)
        self.finished.forget(key)
        self.stalls.forget(key)
        self.expiries.forget(key)

    def _keep_pod(self, pod: dict[str, Any]) -> None:
        key = readers.job_key(pod)
        uid = (pod.get("metadata") or {}).get("uid")
        if key is None or not uid:
            return
        self.pods[str(uid)] = pod
        self.pods_of.setdefault(key, set()).add(str(uid))

    def _final(self, key: str, obj: Mapping[str, Any]) -> Phase | None:
        """How the job ended, as this controller recorded it (never as its status says)."""
        uid = (obj.get("metadata") or {}).get("uid")
        return self.finished.phase_of(key, uid) if isinstance(uid, str) else None

    # --- one job ----------------------------------------------------------------------------------------

    def reconcile(self, key: str) -> None:
        obj = self.jobs.get(key)
        if obj is None:
            return
        meta = obj.get("metadata") or {}
        name, uid = str(meta.get("name", "")), meta.get("uid")
        if not name or not isinstance(uid, str):
            return
        if meta.get("deletionTimestamp"):
            # being deleted (a foreground deletion waits for the garbage collector to delete its Pods): nothing is
            # made or written again. Each Pod the collector deleted was taken for a lost worker and made again,
            # racing the deletion it kept from finishing.
            return
        now = self.clock()
        expect = self.expectations.setdefault(key, Expectations())
        expect.expire(now)
        self.finished.load(self.jobs)  # (read by the pass before: a no-op but where reconciled alone)
        previous, final = read_status(obj), self._final(key, obj)
        spec: ElasticJobSpec | None
        try:
            spec = read_elastic_job(obj)
            problem = None
        except ElasticJobSpecError as error:
            spec, problem = None, str(error)
        if spec is not None and not spec.replicas_stated and final is None:
            self._default_replicas(obj, spec)
            return  # the job comes back through the watch with spec.replicas set
        workers, pods_by_index, host, runs = self._observe(key, uid, expect)
        held = [found for pod in (*pods_by_index.values(), *((host,) if host is not None else ()))
                if (found := self._end_overdue(obj, pod, expect, now)) is not None]
        if held:
            self.job_events.tell_once(obj, Emit(True, "PodHeldByFinalizers", readers.held_message(held)))
        restarts, target = memory(self.finished.entry(key, uid), previous, runs.values())  # never the status'
        stale = frozenset(index for index, run in runs.items() if run != restarts)
        made_from = template_hash(spec.template) if spec is not None else None
        outdated = frozenset(index for index, pod in pods_by_index.items() if index not in stale
                             and (digest := readers.worker_template(pod)) is not None and digest != made_from)
        generation = count(meta.get("generation"), MAX_GENERATION)
        phase = previous.phase
        if spec is None:
            observation = Observation(target=0, min_replicas=0, workers=workers, previous_target=target,
                                      restarts=restarts, problem=problem,
                                      spec_changed=generation != previous.observed_generation,
                                      reason=previous.reason, message=previous.message, final=final)
        else:
            service = self.writes.service_exists(obj, spec, now)
            host_up = host is not None and not readers.ended(host) and not readers.terminating(host)
            observation = Observation(
                target=spec.replicas, min_replicas=spec.min_replicas, workers=workers,
                previous_target=target, restarts=restarts, max_restarts=spec.max_restarts,
                seconds_stalled=self.stalls.seconds(
                    key, uid, restarts, target, now=now,
                    short=counted(workers, spec.replicas, {Worker.READY}) < spec.min_replicas,
                    started=counted(workers, spec.replicas, STARTED) >= spec.min_replicas),
                rendezvous_timeout=float(spec.rendezvous_timeout_seconds),
                rendezvous_present=service and host_up, rendezvous_gone=not service and host is None,
                replacing=frozenset(expect.owed), stale=stale, outdated=outdated,
                spec_changed=generation != previous.observed_generation,
                reason=previous.reason, message=previous.message, final=final)
        decision = self._cannot_start(obj, step(phase, observation), pods_by_index, workers)
        if not self._write_status(key, obj, previous, decision, workers, spec, problem, generation, now):
            return
        if (said := disowned(previous, restarts, target, (decision.restarts, decision.established))) is not None:
            self.job_events.tell_once(obj, Emit(True, REASON_NOT_OBSERVED, said))
        ended = decision.phase if decision.phase in TERMINAL and final is None else final  # decided now, or before
        if not self.finished.keep(key, uid, ended, decision.restarts, decision.established, now=now):  # before acting
            message = (f"restart count {decision.restarts} / target {decision.established} not acted on: this "
                       "controller's record of its jobs refused them (see its log); tried again at every resync")
            raise CreateRefusedError(message, told=self.job_events.tell_once(obj, Emit(True, "RecordRefused", message)))
        self.expiries.track(key, obj, self.finished.entry(key, uid))
        if spec is not None:
            self._act(obj, spec, decision, pods_by_index, host, expect, now)
        else:
            for action in decision.actions:
                if isinstance(action, Emit):
                    self.job_events.send(obj, action)

    def _end_overdue(self, obj: Mapping[str, Any], pod: Mapping[str, Any], expect: Expectations,
                     now: float) -> tuple[str, tuple[str, ...]] | None:
        """A Pod of the job still Terminating ``stuck_seconds`` past its grace period: deleted at once (its node is
        lost). One already deleted at once is kept only by its finalizers, which no delete ends: not deleted
        again (each delete was one more Warning, every minute, for as long as they stayed); its name and
        finalizers are returned, to be told."""
        pod_uid = str(pod["metadata"]["uid"])
        if pod_uid in expect.deleted or not readers.overdue(pod, now, self.options.stuck_seconds):
            return None
        name = str(pod["metadata"]["name"])
        finalizers = readers.held_by(pod)
        if finalizers is not None:
            return name, finalizers
        if self.writes.delete_pod(pod, 0):
            expect.deleted[pod_uid] = now + self.options.expectation_seconds
            self.job_events.send(obj, Emit(True, "PodForceDeleted", f"pod {name} Terminating "
                                      f"{self.options.stuck_seconds:.0f} s past its grace period (its node is "
                                      "not answering): deleted at once, to be replaced"))
        return None

    def _cannot_start(self, obj: Mapping[str, Any], decision: Decision, pods_by_index: Mapping[int, Mapping[str, Any]],
                      workers: Mapping[int, Worker]) -> Decision:
        """Workers the kubelet cannot start (``readers.cannot_start_message``): named in one Warning and, while
        the job is Pending, in the status' message."""
        said = readers.cannot_start_message(pods_by_index, workers)
        if said is None:
            return decision
        self.job_events.tell_once(obj, Emit(True, "WorkerCannotStart", said))
        return replace(decision, message=f"{decision.message}; {said}") if decision.phase is Phase.PENDING else decision

    def _observe(self, key: str, uid: str, expect: Expectations
                 ) -> tuple[dict[int, Worker], dict[int, dict[str, Any]], dict[str, Any] | None, dict[int, int | None]]:
        """The job's workers by index (their states, their Pods), its rendezvous host Pod, and the rendezvous
        run of each worker, from the cache and the controller's own expectations."""
        job = key.split("/", 1)[1]
        workers: dict[int, Worker] = {}
        pods_by_index: dict[int, dict[str, Any]] = {}
        runs: dict[int, int | None] = {}
        host = None
        for pod_uid in sorted(self.pods_of.get(key, ())):
            pod = self.pods[pod_uid]
            if not readers.controlled_by(pod, uid):
                continue
            role = readers.role(pod)
            if role == ROLE_RENDEZVOUS and (pod.get("metadata") or {}).get("name") == rendezvous_name(job):
                host = pod
            elif role == ROLE_WORKER:
                index = worker_index(pod, job)
                if index is None:
                    continue
                pods_by_index[index] = pod
                runs[index] = readers.worker_run(pod)
                workers[index] = Worker.TERMINATING if pod_uid in expect.deleted else readers.worker_state(pod)
                expect.created.pop(index, None)
        for index in expect.created:
            workers.setdefault(index, Worker.UNSCHEDULED)
        return workers, pods_by_index, host, runs

    # --- writes -----------------------------------------------------------------------------------------

    def _default_replicas(self, obj: Mapping[str, Any], spec: ElasticJobSpec) -> None:
        """``spec.replicas`` absent: set it to minReplicas through ``/scale`` (the one spec field this
        controller may write), conditional on the version read, so a target the scheduler set meanwhile wins."""
        version = (obj.get("metadata") or {}).get("resourceVersion")
        body = {"metadata": {"resourceVersion": version}, "spec": {"replicas": spec.min_replicas}}
        try:
            self.kube.patch(f"{job_path(spec.namespace, spec.name)}/scale", body)
            log.info("ElasticJob %s: spec.replicas defaulted to minReplicas %d", spec.key, spec.min_replicas)
        except ApiError as error:
            if not (error.conflict or error.not_found):
                raise

    def _write_status(self, key: str, obj: Mapping[str, Any], previous: StatusView, decision: Decision,
                      workers: Mapping[int, Worker], spec: ElasticJobSpec | None, problem: str | None,
                      generation: int, now: float) -> bool:
        """Write the decision into the status when it changed; False when the write was refused (the job
        changed meanwhile: the next event decides again) or the job is gone."""
        meta = obj.get("metadata") or {}
        status = status_body(str(meta.get("name", "")), previous, decision, workers,
                             None if spec is None else spec.min_replicas, problem, generation,
                             rfc3339(_utc(now)))
        current = obj.get("status")
        if isinstance(current, Mapping) and all(current.get(k) == v for k, v in status.items()):
            return True
        body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": status}
        try:
            written = self.kube.patch(f"{job_path(str(meta.get('namespace', 'default')), str(meta['name']))}/status",
                                      body)
        except ApiError as error:
            if error.conflict or error.not_found:
                log.debug("ElasticJob %s changed meanwhile (%s); deciding again", key, error.status)
                return False
            raise
        self.jobs[key] = written
        return True

    def _act(self, obj: Mapping[str, Any], spec: ElasticJobSpec, decision: Decision,
             pods_by_index: Mapping[int, dict[str, Any]], host: Mapping[str, Any] | None, expect: Expectations,
             now: float) -> None:
        if decision.phase not in TERMINAL:  # before any new worker exists, so no member states an old headcount
            self.writes.align_gang(spec, pods_by_index)
        made, refused = 0, False
        for action in decision.actions:
            if isinstance(action, CreateWorker):
                if refused or made >= MAX_CREATES_PER_PASS:  # owed: made at the next resync
                    expect.owed.add(action.index)
                    continue
                made += 1
                refused = not self.writes.create_worker(obj, spec, action.index, decision.restarts, expect, now)
            elif isinstance(action, DeleteWorker):
                pod = pods_by_index.get(action.index)
                if pod is not None:
                    grace = spec.termination_grace_period_seconds if action.graceful else 0
                    if self.writes.delete_pod(pod, grace):
                        expect.deleted[str(pod["metadata"]["uid"])] = now + self.options.expectation_seconds
                    if decision.phase not in TERMINAL:
                        expect.owed.add(action.index)
            elif isinstance(action, EnsureRendezvous):
                self.writes.ensure_rendezvous(obj, spec, host, now)
            elif isinstance(action, RemoveRendezvous):
                self.writes.remove_rendezvous(spec, host, now)
            else:
                self.job_events.send(obj, action)


def _uid(obj: Mapping[str, Any] | None) -> str | None:
    meta = (obj or {}).get("metadata") or {}
    uid = meta.get("uid")
    return uid if isinstance(uid, str) else None


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC)
