"""Carrying out the engine's decisions: allocation records, Bindings and evictions.

A job whose new members are several (a gang) gets every record written before its first Binding, so a
crash in between leaves records without bindings that the next instance rolls back or forward (see
``kubecell.scheduler.restore``). A single new member needs no such step: its Binding carries the record as an
annotation (the API server copies a Binding's annotations onto the pod in the same write), which is
atomic by itself and halves the round trips of the common case. Within each step the writes go out in
parallel, because one round trip after another is what limits a scheduler's throughput.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple, Protocol

from kubecell.core.engine.attempt import Shrink
from kubecell.core.engine.job import Job, JobClass, JobPhase
from kubecell.core.engine.job import member_index as member_index_of
from kubecell.core.errors import KubecellError
from kubecell.core.model import Allocation
from kubecell.kube import pods
from kubecell.kube.actions import Actions, EventSink, retry
from kubecell.kube.claim_writes import ClaimConflict
from kubecell.kube.records import AllocationRecord, record_for
from kubecell.kube.rest import ApiError
from kubecell.scheduler.claims import ClaimBroker, ClaimUse
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.gate import BindItem, NodeGate
from kubecell.scheduler.jobs import Tracked
from kubecell.scheduler.tracking import Planned, Tracking

log = logging.getLogger("kubecell.scheduler")

Outcome = tuple[str, str, bool, ApiError | None]
"""A Binding's answer: (job name, pod uid, whether the Binding carried the record, the error or None)."""
Settled = tuple[Tracking, str, str, bool, ApiError | None]
"""The outcome of a Binding sent without waiting: (the engine's tracking it was decided in, job name, pod
uid, whether the Binding carried the record, the error or None)."""


class Plan(NamedTuple):
    """One job's new members as decided, with their records, ready to be written."""

    job: Job
    planned: list[Planned]
    direct: bool
    """A single member not waiting for victims: its Binding carries its record (one write)."""


class DecisionSink(Protocol):
    """Where the binder hands the engine's new decisions, once planned (records made), instead of writing them.

    Without a sink the binder writes every decision at once (the standalone scheduler). A sink may keep them
    and write them later through the binder's public operations (``write``, ``send``, ``admit``,
    ``holding``, ``requeue``): the extender keeps each decision until kube-scheduler asks to bind it. A sink
    serves one loop and knows its current ``Tracking``, the one every binder call works on. The binder asks
    it before binding on its own a job it handed over, and tells it when it undoes a decision, so nothing
    kept outlives its decision."""

    def take(self, plans: Sequence[Plan], victims: set[str]) -> bool:
        """Carry out or keep the ``plans`` (``victims``: pods a preemptor among them waits for). Returns
        True when a failure changed the engine (another cycle is due)."""
        ...

    def keeps(self, name: str) -> bool:
        """Whether the sink keeps job ``name``'s decision, so the binder must not bind it on its own (a
        preemptor whose victims are gone)."""
        ...

    def dropped(self, name: str) -> None:
        """The binder gave job ``name`` back to the queue: whatever the sink kept of its decision is void."""
        ...

    def released(self, name: str, uids: set[str]) -> None:
        """A shrink released the members of job ``name`` that these pods were to hold: the sink drops them
        from the decision it keeps (it must never bind them)."""
        ...


class Binder:
    """Writes what the engine decided, and tells the engine what could not be written."""

    def __init__(self, actions: Actions, mirror: Mirror, pool: ThreadPoolExecutor, scheduler_name: str,
                 settled: Callable[[Settled], None], *, scheduled_events: bool = True) -> None:
        self.actions = actions
        self.sink: DecisionSink | None = None
        """Who takes new decisions (``start``); None: they are written at once. A mode sets it before the
        loop runs (the extender keeps them until kube-scheduler's bind call)."""
        self.scheduled_events = scheduled_events
        """Announce each pod bound with kube-scheduler's ``Scheduled`` Event; off in extender mode, where
        kube-scheduler announces the pods it asked its extender to bind."""
        self.gate = NodeGate(mirror)
        """Bindings to nodes served by kubecell's device plugin go out one at a time per node."""
        self.announce = EventSink(actions)
        self.mirror = mirror
        self.pool = pool
        self.scheduler_name = scheduler_name
        self.settled = settled
        """Called from a writer thread with the outcome of each Binding sent without waiting."""
        self.in_flight: set[Future[Outcome]] = set()
        self.release_terminating = False
        """Terminating pods hold nothing (``pods.holds``): a preemptor need not wait for them to be gone."""
        self.claims: ClaimBroker | None = None
        """Writes the DRA claims' allocations of the pods that have claims (None: claims are not read)."""
        self.claim_plans: dict[str, list[tuple[ClaimUse, dict[str, Any]]]] = {}
        """Pod uid -> its claims' allocations as decided, written just before its Binding (``_bind_one``)."""

    def evict(self, state: Tracking, job: Job, reason: str) -> set[str]:
        """Evict the pods holding the job's members; returns their uids (its preemptor waits for them)."""
        tracked = state.tracked.get(job.name)
        if tracked is None:
            return set()
        evicted = {uid for uid in tracked.members.values() if self._evict_pod(uid, reason)}
        tracked.members.clear()
        tracked.bound.clear()
        return evicted

    def shrink(self, state: Tracking, cut: Shrink, reason: str) -> set[str]:
        """Evict exactly the pods holding the members a shrink released, through the same Eviction path; the
        rest of the gang's pods keep running with their records. The released pods never hold a member again
        (``Tracked.released``; a Binding of one still waiting at its node gate is dropped by ``pump``, one kept
        by the sink is dropped there), and the engine grows the job only into pods it still has
        (``limit_growth``). Returns the uids evicted (its preemptor waits for them)."""
        tracked = state.tracked.get(cut.job.name)
        if tracked is None:
            return set()
        evicted, released = set(), set()
        for name in cut.members:
            uid = tracked.members.pop(member_index_of(name), None)
            if uid is None:
                continue
            tracked.bound.discard(uid)
            tracked.released.add(uid)
            released.add(uid)
            if self._evict_pod(uid, reason):
                evicted.add(uid)
        if self.sink is not None and released:
            self.sink.released(cut.job.name, released)
        if cut.job.phase in (JobPhase.RUNNING, JobPhase.RESERVED):
            state.engine.limit_growth(cut.job.name, tracked.spare(cut.job.spec))
        return evicted

    def evict_pod(self, uid: str, reason: str) -> bool:
        """Evict one pod of a job that stays as it is until the pod is gone (an ElasticJob's worker moved to
        another GPU model, ``scheduler.elastic_types``); whether it still holds what it has."""
        return self._evict_pod(uid, reason)

    def _evict_pod(self, uid: str, reason: str) -> bool:
        """Evict one member's pod unless it holds nothing any more; whether a preemptor must wait for it."""
        pod = self.mirror.pods.get(uid)
        if pod is None:
            return False
        bound = bool(pods.node_of(pod))
        if (bound and not pods.holds(pod, release_terminating=self.release_terminating)) or (
                not bound and pods.is_done(pod)):
            return False  # ended, or leaving before it ever ran: nothing to wait for
        if not pods.terminating(pod):
            retry("evict", lambda: self.actions.evict(pod, reason))
        return True  # a pod already terminating still holds its GPUs until it is gone

    def start(self, state: Tracking, jobs: Sequence[Job], victims: set[str]) -> bool:
        """Record and bind every member the jobs newly hold (a preemptor waits for its victims first), or
        whatever the decision ``sink`` does with them. Returns True when a failure changed the engine
        (another cycle is due); raises the ``ApiError`` of an unavailable API server after telling the
        engine, so the caller rebuilds once it is back."""
        plans, dirty = self._decide(state, jobs, victims)
        if self.sink is not None:
            return self.sink.take(plans, victims) or dirty
        return self.write(state, plans, victims, wait=False) or dirty

    def _decide(self, state: Tracking, jobs: Sequence[Job], victims: set[str]) -> tuple[list[Plan], bool]:
        """Each job's new members with their records, and whether its Binding can carry the record (a
        single member not waiting for victims)."""
        plans: list[Plan] = []
        dirty = False
        for job in jobs:
            planned = self._plan(state, job)
            if planned is None:
                dirty = True
                continue
            waits = job.phase == JobPhase.RESERVED and bool(victims)
            plans.append(Plan(job, planned, len(planned) == 1 and not waits))
        return plans, dirty

    def assign(self, state: Tracking, job: Job, planned: Sequence[Planned], victims: set[str]) -> bool:
        """The planned pods hold the job's new members from now on, and a preemptor waits for its
        ``victims``' pods to be gone; returns whether it waits (a sink that keeps decisions calls this when
        it takes them, as ``write`` does once the records are written)."""
        tracked = state.tracked[job.name]
        for index, uid, _, _ in planned:
            tracked.members[index] = uid
        if job.phase == JobPhase.RESERVED and victims:
            state.waiting_victims[job.name] = set(victims)
            return True
        return False

    def write(self, state: Tracking, plans: Sequence[Plan], victims: set[str], *, wait: bool) -> bool:
        """Records (a gang's, all before any Binding), then Bindings; ``wait``: even a single member's
        Binding is waited for (the extender answers kube-scheduler with its outcome). Returns True when a
        failure changed the engine; raises the ``ApiError`` of an unavailable API server."""
        dirty = False
        records = [item for _, planned, direct in plans if not direct for item in planned]
        failures = {uid: error for uid, error in self.pool.map(self._write_one, records) if error is not None}
        to_bind = []
        for job, planned, direct in plans:
            broken = [failures[uid] for _, uid, _, _ in planned if uid in failures]
            if broken:
                for _, uid, pod, _ in planned:
                    if uid not in failures:
                        retry("roll back a record", lambda pod=pod: self.actions.clear_record(pod))
                self.requeue(state, job.name, str(broken[0]))
                dirty = True
                if any(isinstance(e, ApiError) and e.unavailable for e in broken):
                    raise broken[0]
                continue
            if self.assign(state, job, planned, victims):
                continue  # it binds once its victims are gone (``bind_reserved_when_victims_are_gone``)
            if direct and job.phase == JobPhase.RUNNING and not wait:
                (_, uid, pod, record), = planned
                for item in self.gate.admit(state, [(job.name, uid, pod, record.node, record)]):
                    self.send(state, item)
            else:
                to_bind.append((job.name, {uid: record for _, uid, _, record in planned} if direct else {}))
        return self.bind(state, to_bind) or dirty

    def requeue(self, state: Tracking, name: str, reason: str) -> None:
        """The engine takes the job back to the queue; its pods hold no member any more (the next start
        plans every member again), and the sink forgets whatever it kept of the decision."""
        state.engine.bind_failed(name, time.time(), reason)
        if self.sink is not None:
            self.sink.dropped(name)
        tracked = state.tracked.get(name)
        if tracked is not None:
            for uid in tracked.pod_uids:
                self.claim_plans.pop(uid, None)  # decided again, and planned again, from scratch
            self.gate.forget(state, set(tracked.pod_uids))
            tracked.members.clear()
            tracked.bound.clear()

    def _roll_back_unbound(self, state: Tracking, name: str) -> None:
        """A gang member's Binding was refused: remove the records of its members not bound yet, so nothing
        reads them as decisions still to carry out. Members already bound keep theirs (they run as recorded;
        the job's pods are looked at again once it is back in the queue)."""
        tracked = state.tracked.get(name)
        if tracked is None:
            return
        for uid in tracked.members.values():
            pod = self.mirror.pods.get(uid)
            if pod is not None and uid not in tracked.bound and not pods.node_of(pod):
                try:
                    retry("roll back a record", lambda pod=pod: self.actions.clear_record(pod))
                except ApiError as error:
                    log.warning("record of %s not removed (%s); the next rebuild rolls it back", pods.key(pod), error)

    def holding(self, state: Tracking, node: str, pod: dict[str, Any]) -> str | None:
        """Whether a Binding of ``pod`` to ``node`` would have to wait at the node gate, and for which pod;
        None when it may go now. Changes nothing (``NodeGate.holding``)."""
        return self.gate.holding(state, node, pod)

    def admit(self, state: Tracking, items: list[BindItem]) -> list[BindItem]:
        """The Bindings the node gate lets go now; the others wait for their node (``NodeGate.admit``)."""
        return self.gate.admit(state, items)

    def pump(self, state: Tracking) -> None:
        """Send the Bindings the node gate lets go now (their node's agent acknowledged the pod before),
        unless their decision was undone while they waited (the job went back to the queue or ended)."""
        for item in self.gate.release(state):
            name, uid = item[0], item[1]
            job, tracked = state.engine.jobs.get(name), state.tracked.get(name)
            live = job is not None and job.phase in (JobPhase.RUNNING, JobPhase.RESERVED)
            if not live or tracked is None or uid not in tracked.members.values():
                self.gate.forget(state, {uid})
                continue
            self.send(state, item)

    def send(self, state: Tracking, item: BindItem) -> Future[Outcome]:
        """One Binding sent without waiting (the engine already counts the member as running); its outcome
        comes back through ``settled``, and the returned future lets a caller off the scheduler thread
        wait for it."""
        name, uid = item[0], item[1]

        def done(future: Future[Outcome]) -> None:
            try:
                outcome = future.result()
            except Exception as error:  # whatever broke, a rebuild reads the truth from the API server
                outcome = (name, uid, True, ApiError(0, "Unavailable", f"bind of {uid} failed: {error}"))
            self.settled((state, *outcome))

        self.in_flight = {future for future in self.in_flight if not future.done()}
        future = self.pool.submit(self._bind_one, item)
        future.add_done_callback(done)
        self.in_flight.add(future)
        return future

    def wait_in_flight(self, timeout: float) -> None:
        """Wait (bounded) for the Bindings sent without waiting: a rebuild must not decide again for a pod
        whose Binding is on its way."""
        wait(list(self.in_flight), timeout=timeout)
        self.in_flight = {future for future in self.in_flight if not future.done()}

    def settle(self, state: Tracking | None, outcomes: Sequence[Settled]) -> bool:
        """Apply the outcomes of Bindings sent without waiting (outcomes of an engine since rebuilt are
        moot: the rebuild read the truth from the API server). Returns True when the engine was told of a
        failed bind; raises the ``ApiError`` of an unavailable API server so the caller rebuilds."""
        if state is None:
            return False
        return self._take_outcomes(state, [(name, uid, direct, error) for owner, name, uid, direct, error in outcomes
                                           if owner is state and name in state.tracked])

    def _take_outcomes(self, state: Tracking, outcomes: Sequence[tuple[str, str, bool, ApiError | None]]) -> bool:
        """What every Binding's answer means, waited for or not: bound (``_bind_one`` turned a 409 into success
        only after reading the pod bound to that very node: an earlier bind of the same decision whose answer
        was lost); a pod deleted meanwhile (its deletion event ends the job); a pod alone refused (a 409 for a
        pod not bound there, a 422...): nothing was written, the engine takes the job back; a gang member
        refused: the records of its unbound members are removed and the error raised, so the caller rebuilds
        from what is bound; or an unavailable API server, raised so the caller rebuilds from the records."""
        dirty, unavailable = False, None
        for name, uid, direct, error in outcomes:
            if error is None:
                state.tracked[name].bound.add(uid)
            elif error.not_found:
                continue
            elif direct and not error.unavailable:
                if state.engine.jobs[name].phase in (JobPhase.RUNNING, JobPhase.RESERVED):
                    self.requeue(state, name, str(error))
                    dirty = True
            else:
                if not error.unavailable:  # a gang member refused: what is bound runs, the rest is undone
                    self._roll_back_unbound(state, name)
                unavailable = error
        if unavailable is not None:
            raise unavailable
        for name in {name for name, _, _, error in outcomes if error is None}:
            job, tracked = state.engine.jobs.get(name), state.tracked.get(name)
            complete = tracked is not None and len(tracked.bound) >= len(tracked.members)
            if job is not None and job.phase == JobPhase.RESERVED and complete and not state.waiting_victims.get(name):
                state.engine.confirm(name, time.time())  # its last member waited at a node gate
        return dirty

    def _plan(self, state: Tracking, job: Job) -> list[Planned] | None:
        engine, tracked = state.engine, state.tracked[job.name]
        allocated = {member_index(a): a for a in engine.queries.allocations_of(job.name)}
        new = sorted(index for index in allocated if index not in tracked.members)
        pairs = pods_for(job, tracked, new)
        if pairs is None:
            self.requeue(state, job.name, f"{len(new)} members placed but not as many of its pods free for them")
            return None
        created = datetime.datetime.now(datetime.UTC)
        planned = []
        try:
            for index, uid in pairs:
                pod = self.mirror.pods[uid]
                allocation = allocated[index]
                record = record_for(
                    allocation, state.views[allocation.node], pod=pods.key(pod), pod_uid=uid,
                    attempt=job.preemptions, job=job.name, vc=job.vc, job_class=job.job_class or JobClass.BORROWED,
                    member=index, scheduler=self.scheduler_name, created_at=created, batch=len(new),
                    isolation=tracked.isolation_for(uid))
                if self.claims is not None:
                    claimed = self.claims.plan(pod, record, state.views)
                    if claimed:
                        self.claim_plans[uid] = claimed
                planned.append((index, uid, pod, record))
        except (KubecellError, KeyError) as error:
            self.requeue(state, job.name, str(error))
            return None
        return planned

    def _write_one(self, item: Planned) -> tuple[str, Exception | None]:
        _, uid, pod, record = item
        try:
            retry("write a record", lambda: self.actions.write_record(pod, record))
        except (ApiError, KubecellError) as error:
            return uid, error
        return uid, None

    def bind(self, state: Tracking, jobs: Sequence[tuple[str, dict[str, AllocationRecord]]]) -> bool:
        """Bind every recorded, unbound member of the ``jobs`` (in parallel), then confirm preemptors.

        Each job comes with the records its Bindings carry (a single new member), or none (the records
        are on the pods already). Returns True when the engine was told of a failed bind."""
        engine = state.engine
        work = []
        for name, carried in jobs:
            tracked = state.tracked[name]
            nodes = {member_index(a): a.node for a in engine.queries.allocations_of(name)}
            for index, uid in sorted(tracked.members.items()):
                pod = self.mirror.pods.get(uid)
                if uid not in tracked.bound and pod is not None and index in nodes:
                    work.append((name, uid, pod, nodes[index], carried.get(uid)))
        work = self.gate.admit(state, work)
        dirty = self._take_outcomes(state, list(self.pool.map(self._bind_one, work)))
        for name, _ in jobs:
            job, current = engine.jobs[name], state.tracked.get(name)
            if current is not None and job.phase == JobPhase.RESERVED and len(current.bound) >= len(current.members):
                engine.confirm(name, time.time())
        return dirty

    def _bind_one(self, item: tuple[str, str, dict[str, Any], str, AllocationRecord | None]
                  ) -> tuple[str, str, bool, ApiError | None]:
        name, uid, pod, node, record = item
        claimed = self.claim_plans.get(uid, [])
        if claimed and self.claims is not None:  # the claims' allocations go before the Binding
            try:
                broker = self.claims
                retry("allocate claims", lambda: broker.allocate(pod, claimed))
            except ClaimConflict as conflict:
                return name, uid, record is not None, ApiError(409, "Conflict", str(conflict))
            except ApiError as error:
                return name, uid, record is not None, error
        try:
            retry("bind", lambda: self.actions.bind(pod, node, record))
        except ApiError as error:
            if not (error.conflict and self.actions.bound_to(pod, node)):
                if claimed and self.claims is not None:
                    self._take_back(pod, claimed)
                return name, uid, record is not None, error
            log.info("%s was already bound to %s (an earlier bind whose answer was lost)", pods.key(pod), node)
            self.claim_plans.pop(uid, None)
            return name, uid, record is not None, None
        self.claim_plans.pop(uid, None)
        if self.scheduled_events:
            self.announce.scheduled(pod, node)
        return name, uid, record is not None, None

    def _take_back(self, pod: dict[str, Any], claimed: list[tuple[ClaimUse, dict[str, Any]]]) -> None:
        """A Binding refused after the pod's claims were allocated: the claims are free again (else the next
        look at the pod does it, ``ClaimBroker.apply``)."""
        assert self.claims is not None
        try:
            self.claims.take_back(pod, claimed)
        except (ApiError, KubecellError) as error:
            log.warning("claims of %s not taken back (%s); the next look at the pod does it", pods.key(pod), error)

    def bind_reserved_when_victims_are_gone(self, state: Tracking) -> bool:
        ready: list[tuple[str, dict[str, AllocationRecord]]] = []
        for name, victims in list(state.waiting_victims.items()):
            job = state.engine.jobs.get(name)
            if job is None or job.phase != JobPhase.RESERVED:
                state.waiting_victims.pop(name, None)
                self.mirror.changed.update(dict.fromkeys(victims))  # held again while they terminate
                continue
            remaining = {uid for uid in victims if uid in self.mirror.pods}
            if remaining:
                state.waiting_victims[name] = remaining
                continue
            del state.waiting_victims[name]
            if self.sink is not None and self.sink.keeps(name):  # the sink binds it (when kube-scheduler asks)
                continue
            ready.append((name, {}))
        return self.bind(state, ready) if ready else False


def pods_for(job: Job, tracked: Tracked, indices: Sequence[int]) -> list[tuple[int, str]] | None:
    """Which free pod takes each new member index: any, for a homogeneous job; one of the index's own member
    group for a heterogeneous gang (a launcher's index never goes to a worker's pod). None when a group has
    fewer free pods than new members."""
    free = tracked.free_pods()
    if not tracked.part_of:
        return list(zip(indices, free, strict=False)) if len(free) >= len(indices) else None
    by_part: dict[int, list[str]] = {}
    for uid in free:
        by_part.setdefault(tracked.part_of.get(uid, -1), []).append(uid)
    pairs = []
    for index in indices:
        waiting = by_part.get(job.spec.group_position(index))
        if not waiting:
            return None
        pairs.append((index, waiting.pop(0)))
    return pairs


def member_index(allocation: Allocation) -> int:
    """The member an engine allocation belongs to (its name ends ``/<index>``)."""
    return int(allocation.name.rsplit("/", 1)[-1])
