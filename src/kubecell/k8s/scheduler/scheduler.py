"""The scheduler loop: mirror the API, keep the engine in step with it, act on the engine's decisions.

One thread owns all state. Watch threads (``kubecell.k8s.watch``) feed it events; it applies them to a
mirror of Nodes, Pods, PodGroups and the tenant ConfigMap, then reconciles the engine with the mirror
(new pods become jobs, ended pods end jobs), runs a cycle when something changed or a wake-up is due,
and carries out the cycle's decisions. The engine is rebuilt from the mirror (allocation records first)
at start and whenever the nodes or the tenants change: its state is never the only copy of anything.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import Job, JobClass, JobPhase
from kubecell.core.engine.options import PRESETS
from kubecell.core.engine.restore import RunningMember
from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.model import MILLI_PER_GPU, Node, Request
from kubecell.core.placement.frag import TypicalPod
from kubecell.core.placement.registry import DEFAULT_POLICY, PolicyContext, make_policy
from kubecell.core.tenancy.config import Tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.tenants import parse_tenants
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.k8s.dialects import DemandError, PodDemand, pod_demand
from kubecell.k8s.inventory import NodeView
from kubecell.k8s.records import AllocationRecord, RecordError, record_for
from kubecell.k8s.rest import ApiError, Kube
from kubecell.k8s.scheduler import pods
from kubecell.k8s.scheduler.actions import Actions, retry
from kubecell.k8s.scheduler.cluster import Mirror, node_view_safe, whole_cluster_tenants
from kubecell.k8s.scheduler.jobs import Tracked, gang_ready, job_name, job_spec
from kubecell.k8s.watch import Collection, Event, Watcher

log = logging.getLogger("kubecell.scheduler")

BIND_WORKERS = 16
"""Records and Bindings in flight at once (each is one round trip to the API server)."""

PODGROUP_APIS = (
    ("podgroups.scheduling.x-k8s.io", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups"),
    ("podgroups.scheduling.volcano.sh", "/apis/scheduling.volcano.sh/v1beta1/podgroups"),
)


@dataclass(frozen=True)
class SchedulerOptions:
    name: str = "kubecell"
    """The ``schedulerName`` of the pods this scheduler places."""
    tenancy: str = "kubecell"
    placement: str = DEFAULT_POLICY
    tenants_namespace: str = "kubecell-system"
    tenants_configmap: str = "kubecell-tenants"
    tenants_key: str = "tenants.yaml"
    default_vc: str = "default"
    """The VC of pods that name none; the default tenants (no ConfigMap) guarantee it the whole cluster."""
    idle_cycle_seconds: float = 5.0
    """Longest wait between cycles when nothing happens (time-based rules: starvation, minimum runtime)."""
    typical_pods: tuple[TypicalPod, ...] = ()
    """The workload's typical pod shapes, given to the placement policy in advance (FGD needs them; the
    kubecell policy starts from them and keeps learning). Empty: the policy learns from arrivals only."""
    tie_ranks: Mapping[str, int] = field(default_factory=dict)
    """Node name -> rank breaking ties between equal scores (lower first); unnamed nodes rank after, by
    name. A replay sets the packing experiment's seeded order so both make the same decision."""


class Scheduler:
    """``kubecell scheduler``: places the pods whose ``schedulerName`` is ``options.name``."""

    def __init__(self, kube: Kube, options: SchedulerOptions | None = None) -> None:
        self.kube = kube
        self.options = options or SchedulerOptions()
        self.actions = Actions(kube, self.options.name)
        self.events: queue.Queue[Event] = queue.Queue()
        self.stop = threading.Event()
        self.mirror = Mirror()
        self.engine: Engine | None = None
        self.views: dict[str, NodeView] = {}
        self.node_signature: tuple[Any, ...] = ()
        self._next_nodes: tuple[dict[str, NodeView], tuple[Any, ...]] | None = None
        self.tenants_text: str | None = None
        self.tracked: dict[str, Tracked] = {}
        self.pod_job: dict[str, str] = {}
        self.generations: dict[str, int] = {}
        self.told: dict[str, str] = {}  # pod uid -> the last reason it was told (one Event per new reason)
        self.waiting_victims: dict[str, set[str]] = {}  # RESERVED job -> uids of victim pods still present
        self.external: dict[str, str] = {}  # uid of a pod another scheduler bound -> its allocation name
        self.needs_rebuild = True
        self.dirty = True
        self.cycles = 0
        self.ready = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=BIND_WORKERS, thread_name_prefix="kubecell-write")

    def shutdown(self) -> None:
        """Stop the loop now (a wake-up event ends the wait for the next event)."""
        self.stop.set()
        self.events.put(Event("wake", "SYNC"))

    # ================================================================== watching
    def collections(self) -> list[Collection]:
        o = self.options
        found = [Collection("nodes", "/api/v1/nodes"), Collection("pods", "/api/v1/pods"),
                 Collection("tenants", f"/api/v1/namespaces/{o.tenants_namespace}/configmaps",
                            (("fieldSelector", f"metadata.name={o.tenants_configmap}"),))]
        found += [Collection(kind, path, optional=True) for kind, path in PODGROUP_APIS]
        return found

    def run(self, *, sync_timeout: float = 60.0) -> None:
        """Watch, rebuild, and schedule until ``stop`` is set."""
        watchers = [Watcher(self.kube, collection, self.events, self.stop) for collection in self.collections()]
        for watcher in watchers:
            watcher.start()
        deadline = time.monotonic() + sync_timeout
        for watcher in watchers:
            if not watcher.synced.wait(max(0.0, deadline - time.monotonic())):
                log.warning("%s not listed after %.0f s; starting anyway", watcher.collection.kind, sync_timeout)
        try:
            while not self.stop.is_set():
                self.step(wait=self._wait())
        finally:
            self.pool.shutdown(wait=False)

    def _wait(self) -> float:
        if self.dirty or self.needs_rebuild:
            return 0.0
        wake = self.engine.next_wake() if self.engine is not None else None
        idle = self.options.idle_cycle_seconds
        return idle if wake is None else max(0.0, min(idle, wake - time.time()))

    def step(self, *, wait: float = 0.0) -> None:
        """Apply pending events (waiting up to ``wait`` for the first), then rebuild or cycle as needed."""
        try:
            first = self.events.get(timeout=wait) if wait > 0 else self.events.get_nowait()
        except queue.Empty:
            first = None
        batch = [first] if first is not None else []
        while len(batch) < 10_000:
            try:
                batch.append(self.events.get_nowait())
            except queue.Empty:
                break
        kinds = {self.mirror.apply(event) for event in batch}
        if batch:
            self.dirty = True
        if kinds & {"nodes", "tenants"} and not self.needs_rebuild:
            self.needs_rebuild = self._cluster_changed()  # once per batch: it reads every node
        try:
            if self.needs_rebuild:
                self.rebuild()
            self.reconcile()
            self.cycle()
            self.ready.set()
        except ApiError as error:
            log.warning("API error during a cycle (%s); the state is rebuilt from the API server", error)
            self.needs_rebuild = True
            self.stop.wait(1.0)
        except KubecellError as error:  # a bug or an input no check caught: never die with the cluster waiting
            log.exception("cycle failed (%s); the state is rebuilt from the API server", error)
            self.needs_rebuild = True
            self.stop.wait(1.0)

    def _read_nodes(self) -> tuple[dict[str, NodeView], tuple[Any, ...]]:
        """Every node as the core sees it, by name, and a signature that changes when any of them does."""
        views = {name: node_view_safe(obj) for name, obj in sorted(self.mirror.nodes.items())}
        return views, tuple((name, view.node, view.excluded) for name, view in views.items())

    def _cluster_changed(self) -> bool:
        """Whether nodes or tenants changed in a way that needs a new engine (the views read here are kept
        for that rebuild, so a node event reads every node once, not twice)."""
        self._next_nodes = self._read_nodes()
        text = ((self.mirror.tenants or {}).get("data") or {}).get(self.options.tenants_key)
        return self._next_nodes[1] != self.node_signature or text != self.tenants_text

    # ================================================================== rebuilding
    def rebuild(self) -> None:
        """A new engine from the mirror: nodes, tenants, then every recorded allocation."""
        self.views, self.node_signature = self._next_nodes or self._read_nodes()
        self._next_nodes = None
        nodes = [view.node for view in self.views.values() if view.node is not None]
        self.tracked.clear()
        self.pod_job.clear()
        self.waiting_victims.clear()
        self.external.clear()
        if not nodes:
            self.engine = None
            self.needs_rebuild = False
            return
        forest = CellForest(nodes)
        tenants = self._tenants(nodes, forest)
        o = self.options
        policy = make_policy(o.placement, PolicyContext(list(o.typical_pods)) if o.typical_pods else None)
        ranks = np.array([o.tie_ranks.get(node.name, len(o.tie_ranks) + i) for i, node in enumerate(nodes)],
                         np.int64)
        self.engine = Engine(nodes, tenants, PRESETS[o.tenancy], forest=forest, placement=policy, tie_rank=ranks)
        self._restore_records()
        self._sync_external()
        self.needs_rebuild = False
        self.dirty = True
        log.info("rebuilt: %d nodes, %d VCs, %d running jobs", len(nodes), len(tenants.vcs),
                 len(self.engine.running))

    def _tenants(self, nodes: Sequence[Node], forest: CellForest) -> Tenants:
        o = self.options
        text = ((self.mirror.tenants or {}).get("data") or {}).get(o.tenants_key)
        self.tenants_text = text
        if text:
            source = f"configmap {o.tenants_namespace}/{o.tenants_configmap} key {o.tenants_key}"
            try:
                return parse_tenants(YamlDocument(Path(source), text), forest)
            except InvalidInputError as error:
                log.error("tenant configuration rejected, using the whole-cluster default: %s", error)
        return whole_cluster_tenants(forest, o.default_vc)

    def _restore_records(self) -> None:
        """Running work first: every pod with a record is restored (a gang whose records were not all
        written before a crash is rolled back; one whose records all exist is bound the rest of the way)."""
        assert self.engine is not None
        by_job: dict[str, list[tuple[dict[str, Any], AllocationRecord]]] = {}
        for pod in self.mirror.pods.values():
            if not pods.ours(pod, self.options.name) or pods.is_done(pod):
                continue
            try:
                record = pods.record_of(pod)
            except RecordError as error:
                self.actions.unschedulable(pod, f"allocation record ignored: {error}", reason="InvalidRecord")
                continue
            if record is not None:
                by_job.setdefault(record.job, []).append((pod, record))
        for name, members in sorted(by_job.items()):
            self._restore_job(name, members)

    def _restore_job(self, name: str, members: list[tuple[dict[str, Any], AllocationRecord]]) -> None:
        assert self.engine is not None
        pod, record = members[0]
        try:
            demand = pod_demand(pod, pod_groups=self.mirror.all_podgroups())
        except DemandError as error:
            log.warning("cannot restore %s: %s", name, error)
            return
        batch = max(r.batch for _, r in members)
        bound = [p for p, _ in members if pods.node_of(p)]
        if len(members) < batch and len(bound) < len(members):  # the crash came before every record existed
            for p, _ in members:
                if not pods.node_of(p):
                    retry("roll back a record", lambda p=p: self.actions.clear_record(p))
            members = [(p, r) for p, r in members if pods.node_of(p)]
            if not members:
                return
        group = demand.group
        size = group.size if group is not None and group.size is not None else len(members)
        minimum = group.minimum if group is not None and group.minimum is not None else None
        spec = job_spec(name, demand, max(size, len(members)), minimum and min(minimum, len(members)),
                        record.vc, pods.created(pod))
        running = [RunningMember(r.member, r.node, tuple(g.index for g in r.gpus)) for _, r in members]
        started = min(r.created_at for _, r in members).timestamp()
        try:
            self.engine.restore(spec, running, JobClass(record.job_class), started_at=started)
        except InvalidInputError as error:
            log.error("cannot restore %s as recorded: %s", name, error)
            return
        tracked = Tracked(name, group.key if group else None, [pods.uid(p) for p, _ in members],
                          {r.member: pods.uid(p) for p, r in members})
        self._track(tracked)
        for p, r in members:
            if not pods.node_of(p):  # records all written before the crash: finish the binds
                retry("bind", lambda p=p, r=r: self.actions.bind(p, r.node))
            tracked.bound.add(pods.uid(p))

    def _track(self, tracked: Tracked) -> None:
        self.tracked[tracked.name] = tracked
        for uid in tracked.pod_uids:
            self.pod_job[uid] = tracked.name
        if tracked.group is not None:
            generation = int(tracked.name.rsplit("#", 1)[-1]) if "#" in tracked.name else 0
            self.generations[tracked.group] = max(self.generations.get(tracked.group, 0), generation)

    # ================================================================== reconciling pods and jobs
    def reconcile(self) -> None:
        """End jobs whose pods ended, cancel jobs whose pods are gone, submit pods nobody tracks yet."""
        if self.engine is None:
            return
        engine, now = self.engine, time.time()
        for name, tracked in list(self.tracked.items()):
            job = engine.jobs[name]
            present = [self.mirror.pods.get(uid) for uid in tracked.pod_uids]
            alive = [pod for pod in present if pod is not None and not pods.is_done(pod)]
            if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED):
                holders = [self.mirror.pods.get(uid) for uid in tracked.members.values()]
                if not any(pod is not None and not pods.is_done(pod) for pod in holders):
                    engine.finish(name, now)
                    self._untrack(name)
                    self.dirty = True
            elif job.phase == JobPhase.PENDING and len(alive) < len(tracked.pod_uids):
                engine.cancel(name, now)  # a pod of a waiting job is gone: form the job again from what is left
                self._untrack(name)
                self.dirty = True
            elif job.phase in (JobPhase.REJECTED, JobPhase.FINISHED, JobPhase.CANCELLED) and not alive:
                self._untrack(name)
        self._sync_external()
        self._submit_new_pods(now)

    def _sync_external(self) -> None:
        """Hold what pods bound by anyone else take (CPU, memory, and their GPUs as whole GPUs: a share
        another scheduler granted is not one kubecell can see), and free it when they end."""
        assert self.engine is not None
        wanted: dict[str, dict[str, Any]] = {}
        for uid, pod in self.mirror.pods.items():
            if pods.node_of(pod) and not pods.is_done(pod) and uid not in self.pod_job:
                wanted[uid] = pod  # bound by another scheduler, or created with spec.nodeName
        for uid in [u for u in self.external if u not in wanted]:
            self.engine.release_external(self.external.pop(uid))
            self.dirty = True
        for uid, pod in wanted.items():
            if uid in self.external or pods.node_of(pod) not in self.engine.book.index:
                continue
            try:
                demand = pod_demand(pod)
                request = demand.request
                gpus = max(request.gpu_count, 1) if (request.gpu_count or request.gpu_memory_mib) else 0
            except DemandError:
                request, gpus = Request("x"), 0
            held = Request(f"external:{pods.key(pod)}@{uid[:8]}", cpu_milli=request.cpu_milli,
                           memory_mib=request.memory_mib, gpu_count=gpus, gpu_milli=MILLI_PER_GPU if gpus else 0)
            try:
                self.external[uid] = self.engine.hold_external(held, pods.node_of(pod)).name
                self.dirty = True
            except InvalidInputError as error:
                log.warning("cannot account %s bound by another scheduler: %s", pods.key(pod), error)

    def _untrack(self, name: str) -> None:
        tracked = self.tracked.pop(name, None)
        self.waiting_victims.pop(name, None)
        if tracked is not None:
            for uid in tracked.pod_uids:
                if self.pod_job.get(uid) == name:
                    del self.pod_job[uid]

    def _submit_new_pods(self, now: float) -> None:
        assert self.engine is not None
        groups: dict[str, list[tuple[dict[str, Any], PodDemand]]] = {}
        pod_groups = self.mirror.all_podgroups()
        for uid, pod in self.mirror.pods.items():
            if uid in self.pod_job or not pods.ours(pod, self.options.name) or pods.is_done(pod) or pods.node_of(pod):
                continue
            unsupported = pods.unsupported_node_constraints(pod)
            if unsupported is not None:
                self._tell(pod, f"pod {pods.key(pod)}: {unsupported}", reason="Unsupported")
                continue
            try:
                demand = pod_demand(pod, pod_groups=pod_groups)
            except DemandError as error:
                self._tell(pod, str(error), reason="InvalidRequest")
                continue
            if demand.group is None:
                self._submit([(pod, demand)], 1, None)
            else:
                groups.setdefault(demand.group.key, []).append((pod, demand))
        for key, members in groups.items():
            members.sort(key=lambda item: pods.key(item[0]))
            ready = gang_ready([demand for _, demand in members])
            if ready is None:
                group = members[0][1].group
                assert group is not None
                waiting = (f"waiting for PodGroup {group.waiting_for}" if group.waiting_for
                           else f"gang {key}: {len(members)} of {group.size or group.minimum} pods exist")
                for pod, _ in members:
                    self._tell(pod, waiting, reason="GangIncomplete", event=False)
                continue
            self._submit(members, *ready)

    def _submit(self, members: list[tuple[dict[str, Any], PodDemand]], size: int, minimum: int | None) -> None:
        assert self.engine is not None
        pod, demand = members[0]
        generation = 0
        if demand.group is not None:
            generation = self.generations.get(demand.group.key, 0) + 1
            self.generations[demand.group.key] = generation
        name = job_name(demand, pod, generation)
        vc = demand.vc or self.options.default_vc
        try:
            spec = job_spec(name, demand, size, minimum, vc, min(pods.created(p) for p, _ in members))
        except InvalidInputError as error:  # a gang whose pods ask for something no job can be
            for p, _ in members:
                self._tell(p, f"cannot be scheduled: {error}", reason="InvalidRequest")
            return
        job = self.engine.submit(spec, spec.submit_time)
        self._track(Tracked(name, demand.group.key if demand.group else None, [pods.uid(p) for p, _ in members]))
        if job.phase == JobPhase.REJECTED:
            for p, _ in members:
                self._tell(p, f"rejected: {job.wait_reason}", reason="Rejected")
        self.dirty = True

    def _tell(self, pod: Mapping[str, Any], message: str, *, reason: str = "Unschedulable",
              event: bool = True) -> None:
        """Say why a pod waits, once per distinct reason (as kube-scheduler does not repeat itself)."""
        uid = pods.uid(pod)
        if self.told.get(uid) == message:
            return
        self.told[uid] = message
        retry("explain", lambda: self.actions.unschedulable(pod, message, reason=reason, event=event))

    # ================================================================== cycles
    def cycle(self) -> None:
        """Run the engine if anything changed or a wake-up is due, and carry out what it decided."""
        engine = self.engine
        if engine is None:
            return
        now = time.time()
        wake = engine.next_wake()
        self._bind_reserved_when_victims_are_gone(now)
        if not self.dirty and (wake is None or wake > now):
            return
        self.dirty = False
        self.cycles += 1
        result = engine.schedule(now)
        victims: set[str] = set()
        for job in result.evicted:
            victims |= self._evict(job, f"preempted by kubecell: {job.wait_reason}")
        for job in result.downgraded:
            log.info("%s now runs as %s", job.name, job.job_class.value if job.job_class else "?")
        self._start_all([*result.started, *result.grown], victims)
        self._bind_reserved_when_victims_are_gone(now)
        for job in engine.pending.values():
            tracked = self.tracked.get(job.name)
            if tracked is not None:
                for uid in tracked.pod_uids:
                    pod = self.mirror.pods.get(uid)
                    if pod is not None:
                        self._tell(pod, engine.explain(job.name))

    def _evict(self, job: Job, reason: str) -> set[str]:
        tracked = self.tracked.get(job.name)
        if tracked is None:
            return set()
        evicted = set()
        for uid in tracked.members.values():
            pod = self.mirror.pods.get(uid)
            if pod is not None and not pods.is_done(pod):
                retry("evict", lambda pod=pod: self.actions.evict(pod, reason))
                evicted.add(uid)
        tracked.members.clear()
        tracked.bound.clear()
        return evicted

    def _start_all(self, jobs: Sequence[Job], victims: set[str]) -> None:
        """Write the records of every member the jobs newly hold, then bind them (a preemptor waits for its
        victims first). Records before bindings is what makes a crash in between recoverable; within each
        step the writes go out in parallel, because one round trip after another is what limits throughput."""
        assert self.engine is not None
        plans: list[tuple[Job, list[tuple[int, str, dict[str, Any], AllocationRecord]]]] = []
        for job in jobs:
            planned = self._plan(job)
            if planned is not None:
                plans.append((job, planned))
        outcomes = self.pool.map(self._write_one, [item for _, planned in plans for item in planned])
        failures = {uid: error for uid, error in outcomes if error is not None}
        to_bind = []
        for job, planned in plans:
            tracked = self.tracked[job.name]
            broken = [failures[uid] for _, uid, _, _ in planned if uid in failures]
            if broken:
                for _, uid, pod, _ in planned:
                    if uid not in failures:
                        retry("roll back a record", lambda pod=pod: self.actions.clear_record(pod))
                self.engine.bind_failed(job.name, time.time(), str(broken[0]))
                self.dirty = True
                if any(isinstance(e, ApiError) and e.unavailable for e in broken):
                    raise broken[0]
                continue
            for index, uid, _, _ in planned:
                tracked.members[index] = uid
            if job.phase == JobPhase.RESERVED and victims:
                self.waiting_victims[job.name] = set(victims)
            else:
                to_bind.append(job.name)
        self._bind(to_bind)

    def _plan(self, job: Job) -> list[tuple[int, str, dict[str, Any], AllocationRecord]] | None:
        """(member index, pod uid, pod, record) for every member the job holds without a pod yet."""
        assert self.engine is not None
        tracked = self.tracked[job.name]
        held = {int(a.name.rsplit("/", 1)[-1]): a for a in self.engine.allocations_of(job.name)}
        new = sorted(index for index in held if index not in tracked.members)
        free = tracked.free_pods()
        if len(free) < len(new):
            self.engine.bind_failed(job.name, time.time(), f"{len(new)} members placed but {len(free)} pods free")
            return None
        created = datetime.datetime.now(datetime.UTC)
        planned = []
        try:
            for index, uid in zip(new, free, strict=False):
                pod = self.mirror.pods[uid]
                allocation = held[index]
                planned.append((index, uid, pod, record_for(
                    allocation, self.views[allocation.node], pod=pods.key(pod), pod_uid=uid,
                    attempt=job.preemptions, job=job.name, vc=job.vc, job_class=job.job_class or JobClass.BORROWED,
                    member=index, scheduler=self.options.name, created_at=created, batch=len(new))))
        except (KubecellError, KeyError) as error:
            self.engine.bind_failed(job.name, time.time(), str(error))
            self.dirty = True
            return None
        return planned

    def _write_one(self, item: tuple[int, str, dict[str, Any], AllocationRecord]) -> tuple[str, Exception | None]:
        _, uid, pod, record = item
        try:
            retry("write a record", lambda: self.actions.write_record(pod, record))
        except (ApiError, KubecellError) as error:
            return uid, error
        return uid, None

    def _bind(self, names: Sequence[str]) -> None:
        """Bind every recorded, unbound member of the jobs ``names`` (in parallel), then confirm preemptors."""
        assert self.engine is not None
        work = []
        for name in names:
            tracked = self.tracked[name]
            for index, uid in sorted(tracked.members.items()):
                pod = self.mirror.pods.get(uid)
                allocation = next((a for a in self.engine.allocations_of(name) if a.name.endswith(f"/{index}")), None)
                if uid not in tracked.bound and pod is not None and allocation is not None:
                    work.append((name, uid, pod, allocation.node))
        unavailable: ApiError | None = None
        for name, uid, error in self.pool.map(self._bind_one, work):
            if error is None or error.conflict:
                if error is not None:
                    log.info("%s was already bound (an earlier bind whose answer was lost)", uid)
                self.tracked[name].bound.add(uid)
            elif not error.not_found:  # the API server is gone: rebuild from the records once it is back
                unavailable = error
        if unavailable is not None:
            raise unavailable
        for name in names:
            job, tracked = self.engine.jobs[name], self.tracked[name]
            if job.phase == JobPhase.RESERVED and len(tracked.bound) >= len(tracked.members):
                self.engine.confirm(name, time.time())

    def _bind_one(self, item: tuple[str, str, dict[str, Any], str]) -> tuple[str, str, ApiError | None]:
        name, uid, pod, node = item
        try:
            retry("bind", lambda: self.actions.bind(pod, node))
        except ApiError as error:
            return name, uid, error
        return name, uid, None

    def _bind_reserved_when_victims_are_gone(self, now: float) -> None:
        assert self.engine is not None
        for name, victims in list(self.waiting_victims.items()):
            job = self.engine.jobs.get(name)
            if job is None or job.phase != JobPhase.RESERVED:
                self.waiting_victims.pop(name, None)
                continue
            remaining = {uid for uid in victims if uid in self.mirror.pods}
            if remaining:
                self.waiting_victims[name] = remaining
                continue
            del self.waiting_victims[name]
            self._bind([name])
