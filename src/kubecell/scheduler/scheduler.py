"""The scheduler loop: mirror the API, keep the engine in step with it, act on the engine's decisions.

One thread owns all state. Watch threads (``kubecell.kube.watch``) feed it events; it applies them to a
mirror of Nodes, Pods, PodGroups and the tenant ConfigMap, then reconciles the engine with the mirror
(new pods become jobs, ended pods end jobs), runs a cycle when something changed or a wake-up is due,
and carries out the cycle's decisions. The engine is rebuilt from the mirror (allocation records first)
at start and whenever the nodes or the tenants change: its state is never the only copy of anything.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import numpy as np

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase
from kubecell.core.errors import KubecellError
from kubecell.core.placement.frag import TypicalPod
from kubecell.core.placement.registry import PolicyContext, make_policy
from kubecell.kube import pods, virtualclusters
from kubecell.kube.actions import Actions
from kubecell.kube.inventory import NodeView
from kubecell.kube.names import MANAGED_RESOURCES
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.watch import Collection, Event, Watcher
from kubecell.scheduler.binder import Binder, Settled
from kubecell.scheduler.claims import ClaimBroker
from kubecell.scheduler.cluster import Mirror, trimmed_node, without_managed_fields
from kubecell.scheduler.elastic import ElasticSizer
from kubecell.scheduler.elastic_ranks import rank_elastic_members
from kubecell.scheduler.intake import Intake
from kubecell.scheduler.nodes import NodeReader
from kubecell.scheduler.observe.capture import CaptureCache, capture
from kubecell.scheduler.observe.recorder import Recorder
from kubecell.scheduler.observe.snapshot import Snapshot
from kubecell.scheduler.options import SchedulerOptions, engine_options
from kubecell.scheduler.restore import Restorer
from kubecell.scheduler.teller import Teller
from kubecell.scheduler.tenants import TenantSources
from kubecell.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler")
T = TypeVar("T")

SNAPSHOT_INTERVAL = 0.5
"""Seconds between two published snapshots at most (taking one reads every GPU); a rebuild publishes at once."""
BIND_WORKERS = 16
"""Records and Bindings in flight at once (each is one round trip to the API server)."""

PODGROUP_APIS = (
    ("podgroups.scheduling.x-k8s.io", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups"),
    ("podgroups.scheduling.volcano.sh", "/apis/scheduling.volcano.sh/v1beta1/podgroups"),
    ("podgroups.scheduling.run.ai", "/apis/scheduling.run.ai/v2alpha2/podgroups"),
)


class Scheduler:
    """``kubecell scheduler``: places the pods whose ``schedulerName`` is ``options.name``."""

    def __init__(self, kube: Kube, options: SchedulerOptions | None = None) -> None:
        self.kube = kube
        self.options = options or SchedulerOptions()
        self.actions = Actions(kube, self.options.name)
        self.node_reader = NodeReader(self.actions)
        """The node views, read again only where a node changed (``nodes``)."""
        self.events: queue.Queue[Event] = queue.Queue()
        self.stop = threading.Event()
        self.mirror = Mirror()
        self.state: Tracking | None = None
        self.node_signature: tuple[Any, ...] = ()
        """The hardware of every node the engine was built from (``cluster.hardware``): a change rebuilds."""
        self._next_nodes: tuple[dict[str, NodeView], tuple[Any, ...]] | None = None

        o = self.options
        self.tenant_sources = TenantSources(kube, self.actions, o.name, o.tenants_namespace, o.tenants_configmap,
                                            o.tenants_key, o.default_vc)
        """Which tenants are in force, and the memory that decides it across rebuilds (``tenants``)."""
        extender = self.options.extender
        self.teller = Teller(self.actions, quiet=extender)
        self.intake = Intake(self.mirror, self.teller, scheduler_name=self.options.names,
                             default_vc=self.options.default_vc,
                             resources=frozenset(MANAGED_RESOURCES) if extender else None,
                             release_terminating=self.options.release_terminating)
        self.intake.knowledge = self.options.knowledge
        self.intake.place_by_use = self.options.place_by_use
        self.pool = ThreadPoolExecutor(max_workers=BIND_WORKERS, thread_name_prefix="kubecell-write")
        self.settled: queue.SimpleQueue[Settled] = queue.SimpleQueue()
        self.binder = Binder(self.actions, self.mirror, self.pool, self.options.name, self._on_settled,
                             scheduled_events=not extender)
        self.claims = ClaimBroker(self.mirror, kube)
        """DRA: pods' ResourceClaims read for the engine and allocated before their Bindings; claims others
        allocated on kubecell's devices held (``scheduler.claims``)."""
        self.intake.claims = self.claims
        self.binder.claims = self.claims
        self.elastic = ElasticSizer(kube, self.options.name, holds_namespace=self.options.tenants_namespace)
        """Moves ElasticJobs' targets after each cycle (``scheduler.elastic``)."""
        self.elastic.types.evict_pod = self.binder.evict_pod
        self.elastic.types.reform = self.intake.renew
        self.intake.pin = self.elastic.types.pin_model
        self.before_cycle: Callable[[], bool] | None = None
        """Run at each cycle before the engine may run (True asks for a run); set by a mode with work of its
        own over time before the loop runs (the extender gives back decisions kube-scheduler never bound)."""
        self.calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        """Work other threads hand to the scheduler thread (the extender's verbs), run after each step."""
        self.needs_rebuild = True
        self.dirty = True
        self.cycles = 0
        self.ready = threading.Event()
        self.recorder = Recorder()
        """Counters and histograms of what the cycles did (attempts, latency, preemptions, gang outcomes),
        and the last decisions; bumped from ``cycle`` and from writer threads, read by ``/metrics``."""
        self.elastic.recorder = self.recorder
        self.snapshot: Snapshot | None = None
        """The latest picture of the scheduler's state for other threads (metrics, the dashboard): replaced
        whole, never modified, at most every ``SNAPSHOT_INTERVAL`` s and at once after a rebuild; None
        until the first step ends."""
        self.snapshot_changed = threading.Condition()
        """Notified (``notify_all``) each time ``snapshot`` is replaced. A reader that streams updates (the
        dashboard's server-sent events) waits with a bound and compares identities::

            with scheduler.snapshot_changed:
                scheduler.snapshot_changed.wait_for(lambda: scheduler.snapshot is not last, timeout=15)
        """
        self._capture_cache = CaptureCache()
        self._published_at = float("-inf")
        self._published_state: Tracking | None = None
        self._publish_timer: threading.Timer | None = None
        self.binder.settled = self._count_settled
        self.binder.release_terminating = self.options.release_terminating

    @property
    def engine(self) -> Engine | None:
        return self.state.engine if self.state is not None else None

    @property  # the read-only view observers take snapshots through (``kubecell.scheduler.observe.view``)
    def mirrored_pods(self) -> Mapping[str, Mapping[str, Any]]:
        """Every pod the mirror holds, by uid (read on the scheduler thread only)."""
        return self.mirror.pods

    @property
    def typical_pods(self) -> Sequence[TypicalPod]:
        """The typical pod shapes the options name (fragmentation's fallback when the policy knows none)."""
        return self.options.typical_pods

    @property
    def api_writes(self) -> int:
        """Writes to the API server that carried decisions so far (an int: safe to read from any thread)."""
        return self.actions.writes

    def shutdown(self) -> None:
        """Stop the loop now (a wake-up event ends the wait for the next event)."""
        self.stop.set()
        self.events.put(Event("wake", "SYNC"))

    def call(self, work: Callable[[], T], timeout: float) -> T:
        """Run ``work`` on the scheduler thread, after the events that arrived before it, and return its
        result (from any other thread). Raises ``TimeoutError`` when the loop does not get to it in time
        (it is then skipped), or what ``work`` raised."""
        future: Future[T] = Future()
        self.calls.put((work, future))
        self.events.put(Event("wake", "SYNC"))
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"the scheduler loop did not answer within {timeout:.1f} s") from None

    def _run_calls(self) -> None:
        while not self.calls.empty():
            work, future = self.calls.get_nowait()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except ApiError as error:
                self.needs_rebuild = True
                future.set_exception(error)
            except Exception as error:  # the caller (an HTTP request) reports it; the loop goes on
                log.exception("a call on the scheduler thread failed")
                future.set_exception(error)

    # ================================================================== watching
    def collections(self) -> list[Collection]:
        o = self.options
        found = [Collection("nodes", "/api/v1/nodes", transform=trimmed_node),
                 Collection("pods", "/api/v1/pods", transform=pods.trimmed),
                 Collection("tenants", f"/api/v1/namespaces/{o.tenants_namespace}/configmaps",
                            (("fieldSelector", f"metadata.name={o.tenants_configmap}"),))]
        found += [Collection(kind, path, optional=True) for kind, path in PODGROUP_APIS]
        found.append(Collection("virtualclusters", virtualclusters.PATH, optional=True,
                                transform=virtualclusters.trimmed))
        found += [Collection(kind, f"/apis/resource.k8s.io/v1/{kind}", optional=True, transform=without_managed_fields)
                  for kind in ("resourceclaims", "resourceslices", "deviceclasses")]
        return found

    def run(self, *, sync_timeout: float = 60.0) -> None:
        """Watch, rebuild, and schedule until ``stop`` is set."""
        watchers = [Watcher(self.kube, collection, self.events, self.stop) for collection in self.collections()]
        for watcher in watchers:
            watcher.start()
        deadline = time.monotonic() + sync_timeout
        for watcher in watchers:  # in slices: a stop during the first lists must not wait for them
            while not watcher.synced.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
                if self.stop.is_set():
                    break  # the loop below returns at once, letting go of the writers
                if time.monotonic() >= deadline:
                    log.warning("%s not listed after %.0f s; starting anyway", watcher.collection.kind,
                                sync_timeout)
                    break
        self.loop()

    def loop(self) -> None:
        """Step until ``stop`` is set, on whatever arrives in ``events`` (``run`` feeds it from the watches;
        a bench or test that feeds it itself runs only this), then let go of the writers."""
        try:
            while not self.stop.is_set():
                self.step(wait=self._wait())
        finally:
            while not self.calls.empty():
                self.calls.get_nowait()[1].cancel()
            self.pool.shutdown(wait=False)
            self.binder.announce.close()

    def _wait(self) -> float:
        if self.dirty or self.needs_rebuild or (self.state is not None and self.intake.deferred):
            return 0.0  # (pods whose claims' selectors go on at the next pass: no event will wake the loop)
        wake = self.engine.queries.next_wake() if self.engine is not None else None
        idle = self.options.idle_cycle_seconds
        return idle if wake is None else max(0.0, min(idle, wake - time.time()))

    def _on_settled(self, outcome: Settled) -> None:
        """From a writer thread: queue a Binding's outcome for the scheduler thread (a failure wakes it)."""
        self.settled.put(outcome)
        if outcome[-1] is not None:
            self.events.put(Event("wake", "SYNC"))

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
        if kinds - {"wake"}:  # a wake-up alone changes nothing: an extender call, the publish timer, a stop
            self.dirty = True  # (each made a whole cycle before: 200 binds of made-up pods, 200 cycles)
        outcomes = []
        while not self.settled.empty():
            outcomes.append(self.settled.get_nowait())
        if kinds & {"nodes", "tenants"} and not self.needs_rebuild:
            self.needs_rebuild = self._cluster_changed()  # once per batch: it reads every node
        try:
            if self.needs_rebuild:
                self._catch_up_with_binds(outcomes)
                self.rebuild()
            if outcomes and self.binder.settle(self.state, outcomes):
                self.dirty = True
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
        self._run_calls()
        self.publish()

    def _catch_up_with_binds(self, outcomes: list[Settled], *, timeout: float = 5.0) -> None:
        """Before a rebuild: wait for the Bindings still on their way, then read events until the mirror
        shows the pods they bound (bounded). Without this a rebuild could take a pod bound a moment ago
        for a waiting one and place it a second time."""
        self.binder.wait_in_flight(30.0)
        while not self.settled.empty():
            outcomes.append(self.settled.get_nowait())
        bound = {uid for _, _, uid, _, error in outcomes if error is None}
        deadline = time.monotonic() + timeout
        while bound and time.monotonic() < deadline:
            bound = {uid for uid in bound if uid in self.mirror.pods and not pods.node_of(self.mirror.pods[uid])}
            try:
                event = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if self.mirror.apply(event) in ("nodes", "tenants"):
                self._next_nodes = None  # read the nodes afresh in the rebuild

    def _cluster_changed(self) -> bool:
        """Whether nodes or tenants changed in a way that needs a new engine (the views read here are kept
        for that rebuild, so a node event reads every node once, not twice). A node that was only cordoned,
        uncordoned, became (Not)Ready or changed labels or taints is brought up to date in place."""
        self._next_nodes = self.node_reader.read(self.mirror.nodes)
        if self._next_nodes[1] != self.node_signature or self.tenant_sources.changed(self.mirror):
            return True
        views, _ = self._next_nodes
        self._next_nodes = None
        self._update_nodes(views)
        return False

    def _update_nodes(self, views: dict[str, NodeView]) -> None:
        """Bring the engine's view of nodes whose hardware is unchanged up to date: close or open them, and
        let every waiting job judge their labels and taints afresh (its allowed nodes are part of its spec,
        so it is formed again from its pods). Running work is untouched."""
        state = self.state
        changed = self.node_reader.changed(views)
        if state is None or not changed:
            self.node_reader.applied_now(views)
            return
        for name in changed:
            view = views[name]
            if view.node is not None and name in state.engine.book.index:
                state.engine.set_node_open(name, not view.excluded)
        state.views = views
        state.node_generation += 1
        state.isolation_nodes.clear()
        waiting = [name for name in state.tracked if state.engine.jobs[name].phase == JobPhase.PENDING]
        for name in waiting:
            self.intake.renew(state, name)
        self.node_reader.applied_now(views)
        self.dirty = True
        log.info("nodes changed in place (%s): %d waiting job(s) judge them again", ", ".join(changed[:5])
                 + (" ..." if len(changed) > 5 else ""), len(waiting))

    # ================================================================== rebuilding
    def rebuild(self) -> None:
        """A new engine from the mirror: nodes, tenants, then every recorded allocation."""
        views, self.node_signature = self._next_nodes or self.node_reader.read(self.mirror.nodes)
        self._next_nodes = None
        nodes = [view.node for view in views.values() if view.node is not None]
        self.state = None
        self.mirror.take_changed()
        self.needs_rebuild = False
        if not nodes:
            return
        chosen = self.tenant_sources.in_force(self.mirror, nodes)
        tenants, forest = chosen.tenants, chosen.forest
        if tenants is None or forest is None:  # the nodes' topology cannot be built: pods are told, nothing runs
            log.error("no engine: %s", "; ".join(chosen.warnings) or chosen.summary)
            self.dirty = True
            return
        nodes = list(forest.nodes)  # with the ghosts of nodes lost since the tenants were accepted, if any
        o = self.options
        policy = make_policy(o.placement, PolicyContext(list(o.typical_pods)) if o.typical_pods else None)
        ranks = np.array([o.tie_ranks.get(node.name, len(o.tie_ranks) + i) for i, node in enumerate(nodes)],
                         np.int64)
        engine = Engine(nodes, tenants, engine_options(o), forest=forest, placement=policy, tie_rank=ranks)
        self.state = Tracking(engine, views)
        self.node_reader.applied_now(views)
        Restorer(self.mirror, self.actions, self.intake, self.binder.gate, self.options.names).restore(self.state)
        for view in views.values():  # closed after the restore: what runs there is adopted first
            if view.node is not None and view.excluded:
                engine.set_node_open(view.name, False)
        for ghost in chosen.ghosts:
            engine.hold_lost_node(ghost.name)
        self.mirror.changed.update(dict.fromkeys(self.mirror.pods))  # a new engine looks at every pod once
        self.mirror.claims_changed.update(dict.fromkeys(self.mirror.claims))  # and holds others' claims again
        self.dirty = True
        log.info("rebuilt: %d nodes, %d VCs, %d running jobs", len(nodes), len(tenants.vcs), len(engine.running))

    # ================================================================== cycles
    def reconcile(self) -> None:
        """Bring the engine in step with the pods that changed since the last step."""
        changed, groups_changed = self.mirror.take_changed()
        if self.state is None:
            return
        if self.intake.reconcile(self.state, changed, groups_changed, time.time()):
            self.dirty = True

    def cycle(self) -> None:
        """Run the engine if anything changed or a wake-up is due, and carry out what it decided."""
        state = self.state
        if state is None:
            if self.dirty and not self.needs_rebuild:
                self.dirty = False
                self._tell_without_engine()
            return
        engine, now = state.engine, time.time()
        wake = engine.queries.next_wake()
        if self.binder.bind_reserved_when_victims_are_gone(state):
            self.dirty = True
        if state.deferred:
            self.binder.pump(state)
        if self.before_cycle is not None and self.before_cycle():
            self.dirty = True
        if not self.dirty and (wake is None or wake > now):
            self.elastic.grow(state, self.mirror, now)  # reports arrive and resize intervals pass while idle
            return
        self.dirty = False
        self.cycles += 1
        began = time.perf_counter()
        rank_elastic_members(state, self.mirror)  # a shrink takes the workers their controller would remove
        result = engine.schedule(now)
        decided = time.perf_counter()
        victims: set[str] = set()
        self.elastic.shrunk(state, [cut.job for cut in result.shrunk])
        for cut in result.shrunk:  # first: a job shrunk and then evicted in one cycle loses the rest after
            victims |= self.binder.shrink(state, cut, f"shrunk by kubecell: {cut.reason}")
        for job in result.evicted:
            victims |= self.binder.evict(state, job, f"preempted by kubecell: {job.wait_reason}")
        for job in result.downgraded:
            log.info("%s now runs as %s", job.name, job.job_class.value if job.job_class else "?")
        if self.binder.start(state, [*result.started, *result.grown], victims):
            self.dirty = True
        if self.binder.bind_reserved_when_victims_are_gone(state):
            self.dirty = True
        for job in engine.pending.values():
            tracked = state.tracked.get(job.name)
            if tracked is None:
                continue
            message = engine.queries.explain(job.name)
            excluded = state.excluded_by_constraints.get(job.name)
            if excluded:
                message += f" (its node constraints rule out {excluded})"
            for uid in tracked.pod_uids:
                pod = self.mirror.pods.get(uid)
                if pod is not None:
                    self.teller.tell(pod, message)
        self.elastic.grow(state, self.mirror, now)
        failed = [job for job in [*result.started, *result.grown] if job.phase == JobPhase.PENDING]
        self.recorder.cycle(result, engine.book, now=now, decide_seconds=decided - began,
                            act_seconds=time.perf_counter() - decided, failed=failed, waiting=len(engine.pending))

    def _tell_without_engine(self) -> None:
        """No node kubecell can place on exists (none at all, or none whose inventory it can read): there is no
        engine to ask, but every waiting pod is still told why, as kube-scheduler's FitError would."""
        views = self.node_reader.views()
        unreadable = [view for view in views if view.node is None]
        if not views:
            message = "0/0 nodes are available: the cluster has no nodes"
        else:
            message = (f"0/{len(views)} nodes are available: {len(unreadable)} node(s) kubecell cannot read "
                       f"(e.g. {unreadable[0].name}: {unreadable[0].excluded})")
        for pod in self.mirror.pods.values():
            if self.intake.ours(pod) and not pods.node_of(pod) and not pods.is_done(pod) and not pods.gated(pod):
                self.teller.tell(pod, message)

    # ================================================================== observing
    def publish(self) -> None:
        """Replace ``snapshot`` (on the scheduler thread) if ``SNAPSHOT_INTERVAL`` has passed or the engine
        was rebuilt; a skipped one is taken by a wake-up once the interval is over, so the last change
        of a burst is never left unpublished. A failure to take one is logged, never raised: scheduling
        goes on with the previous picture."""
        clock = time.monotonic()
        rebuilt = self.state is not self._published_state
        if not rebuilt and clock - self._published_at < SNAPSHOT_INTERVAL:
            if self._publish_timer is None or not self._publish_timer.is_alive():
                self._publish_timer = threading.Timer(SNAPSHOT_INTERVAL - (clock - self._published_at),
                                                      self.events.put, (Event("wake", "SYNC"),))
                self._publish_timer.daemon = True
                self._publish_timer.start()
            return
        try:
            taken = capture(self, cache=self._capture_cache, previous=self.snapshot)
        except (KubecellError, ValueError, KeyError, IndexError) as error:
            log.exception("could not take a snapshot (%s); the previous one stays published", error)
            return
        self._published_at, self._published_state = clock, self.state
        self._publish_timer = None
        with self.snapshot_changed:
            self.snapshot = taken
            self.snapshot_changed.notify_all()

    def _count_settled(self, outcome: Settled) -> None:
        """From a writer thread: count a refused Binding sent without waiting, then queue its outcome."""
        state, name, _, _, error = outcome
        if error is not None and not error.not_found:
            job = state.engine.jobs.get(name)
            self.recorder.binding_refused(name, job.vc if job is not None else "", now=time.time(), detail=str(error),
                                          gang=job is not None and job.spec.members > 1)
        self._on_settled(outcome)

