"""Carrying out the engine's decisions: allocation records, Bindings and evictions.

A job whose new members are several (a gang) gets every record written before its first Binding, so a
crash in between leaves records without bindings that the next instance rolls back or forward (see
``kubecell.k8s.scheduler.restore``). A single new member needs no such step: its Binding carries the record as an
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
from typing import Any

from kubecell.core.engine.job import Job, JobClass, JobPhase
from kubecell.core.errors import KubecellError
from kubecell.core.model import Allocation
from kubecell.k8s.records import AllocationRecord, record_for
from kubecell.k8s.rest import ApiError
from kubecell.k8s.scheduler import pods
from kubecell.k8s.scheduler.actions import Actions, EventSink, retry
from kubecell.k8s.scheduler.cluster import Mirror
from kubecell.k8s.scheduler.gate import BindItem, NodeGate
from kubecell.k8s.scheduler.jobs import Tracked
from kubecell.k8s.scheduler.tracking import Held, Planned, Tracking

log = logging.getLogger("kubecell.scheduler")

Outcome = tuple[str, str, bool, ApiError | None]
"""A Binding's answer: (job name, pod uid, whether the Binding carried the record, the error or None)."""
Settled = tuple[Tracking, str, str, bool, ApiError | None]
"""The outcome of a Binding sent without waiting: (the engine's tracking it was decided in, job name, pod
uid, whether the Binding carried the record, the error or None)."""


class Binder:
    """Writes what the engine decided, and tells the engine what could not be written."""

    def __init__(self, actions: Actions, mirror: Mirror, pool: ThreadPoolExecutor, scheduler_name: str,
                 settled: Callable[[Settled], None], *, hold: bool = False) -> None:
        self.actions = actions
        self.hold = hold
        """Extender mode: decisions wait in ``Tracking.held`` for kube-scheduler's bind call."""
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

    def evict(self, state: Tracking, job: Job, reason: str) -> set[str]:
        """Evict the pods holding the job's members; returns their uids (its preemptor waits for them)."""
        tracked = state.tracked.get(job.name)
        if tracked is None:
            return set()
        evicted = set()
        for uid in tracked.members.values():
            pod = self.mirror.pods.get(uid)
            if pod is None:
                continue
            bound = bool(pods.node_of(pod))
            if (bound and not pods.holds(pod, release_terminating=self.release_terminating)) or (
                    not bound and pods.is_done(pod)):
                continue  # ended, or leaving before it ever ran: nothing to wait for
            if not pods.terminating(pod):
                retry("evict", lambda pod=pod: self.actions.evict(pod, reason))
            evicted.add(uid)  # a pod already terminating still holds its GPUs until it is gone
        tracked.members.clear()
        tracked.bound.clear()
        return evicted

    def start(self, state: Tracking, jobs: Sequence[Job], victims: set[str]) -> bool:
        """Record and bind every member the jobs newly hold (a preemptor waits for its victims first).

        In extender mode (``hold``) nothing is written: the decisions are kept as ``state.held`` until
        kube-scheduler asks to bind (``commit``). Returns True when a failure changed the engine (another
        cycle is due); raises the ``ApiError`` of an unavailable API server after telling the engine, so
        the caller rebuilds once it is back."""
        plans, dirty = self._decide(state, jobs, victims)
        if self.hold:
            for job, planned, direct in plans:
                for index, uid, _, _ in planned:
                    state.tracked[job.name].members[index] = uid
                if job.phase == JobPhase.RESERVED and victims:
                    state.waiting_victims[job.name] = set(victims)
                state.held[job.name] = Held(planned, direct, time.monotonic())
            return dirty
        return self._write(state, plans, victims, wait=False) or dirty

    def commit(self, state: Tracking, name: str) -> str | Future[Outcome] | None:
        """Extender mode: write the decision held for job ``name`` now (kube-scheduler asked to bind one of
        its pods): a gang's records on every member, then every member's Binding, so kube-scheduler never
        binds part of a gang. Returns why it could not, or None once every member is bound; for a pod
        alone, the Binding (carrying its record) is sent without blocking the scheduler thread and its
        future returned (the caller waits on it; the outcome reaches the engine through ``settled``)."""
        held = state.held.get(name)
        job = state.engine.jobs.get(name)
        if held is None or job is None or job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED):
            state.held.pop(name, None)
            return f"kubecell holds no placement for {name} (it was released; kube-scheduler will ask again)"
        if state.waiting_victims.get(name):
            return f"{name} waits for {len(state.waiting_victims[name])} preempted pod(s) to leave"
        if held.direct and job.phase == JobPhase.RUNNING:
            (_, uid, pod, record), = held.planned
            waiting = self.gate.holding(state, record.node, pod)
            if waiting is not None:  # kube-scheduler asks again after its back-off; the decision stays held
                held.touched = time.monotonic()
                return (f"{record.node} serves one GPU pod at a time: waiting for its node agent to acknowledge "
                        f"{waiting}")
            del state.held[name]
            item = (name, uid, pod, record.node, record)
            self.gate.admit(state, [item])  # free: it goes now, and marks the node in flight if it serialises
            return self._send(state, item)
        del state.held[name]
        self._write(state, [(job, held.planned, held.direct)], set(), wait=True)
        tracked = state.tracked.get(name)
        missing = [uid for _, uid, _, _ in held.planned if tracked is None or uid not in tracked.bound]
        return f"{len(missing)} of {len(held.planned)} member(s) of {name} could not be bound" if missing else None

    def _decide(self, state: Tracking, jobs: Sequence[Job], victims: set[str]
                ) -> tuple[list[tuple[Job, list[Planned], bool]], bool]:
        """Each job's new members with their records, and whether its Binding can carry the record (a
        single member not waiting for victims)."""
        plans: list[tuple[Job, list[Planned], bool]] = []
        dirty = False
        for job in jobs:
            planned = self._plan(state, job)
            if planned is None:
                dirty = True
                continue
            waits = job.phase == JobPhase.RESERVED and bool(victims)
            plans.append((job, planned, len(planned) == 1 and not waits))
        return plans, dirty

    def _write(self, state: Tracking, plans: Sequence[tuple[Job, list[Planned], bool]], victims: set[str], *,
               wait: bool) -> bool:
        """Records (a gang's, all before any Binding), then Bindings; ``wait``: even a single member's
        Binding is waited for (the extender answers kube-scheduler with its outcome)."""
        dirty = False
        records = [item for _, planned, direct in plans if not direct for item in planned]
        failures = {uid: error for uid, error in self.pool.map(self._write_one, records) if error is not None}
        to_bind = []
        for job, planned, direct in plans:
            tracked = state.tracked[job.name]
            broken = [failures[uid] for _, uid, _, _ in planned if uid in failures]
            if broken:
                for _, uid, pod, _ in planned:
                    if uid not in failures:
                        retry("roll back a record", lambda pod=pod: self.actions.clear_record(pod))
                self._requeue(state, job.name, str(broken[0]))
                dirty = True
                if any(isinstance(e, ApiError) and e.unavailable for e in broken):
                    raise broken[0]
                continue
            for index, uid, _, _ in planned:
                tracked.members[index] = uid
            if job.phase == JobPhase.RESERVED and victims:
                state.waiting_victims[job.name] = set(victims)
            elif direct and job.phase == JobPhase.RUNNING and not wait:
                (_, uid, pod, record), = planned
                for item in self.gate.admit(state, [(job.name, uid, pod, record.node, record)]):
                    self._send(state, item)
            else:
                to_bind.append((job.name, {uid: record for _, uid, _, record in planned} if direct else {}))
        return self.bind(state, to_bind) or dirty

    def _requeue(self, state: Tracking, name: str, reason: str) -> None:
        """The engine takes the job back to the queue; its pods hold no member any more (the next start
        plans every member again)."""
        state.engine.bind_failed(name, time.time(), reason)
        state.held.pop(name, None)
        tracked = state.tracked.get(name)
        if tracked is not None:
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

    def release_stale(self, state: Tracking, max_age: float) -> bool:
        """Extender mode: give back decisions kube-scheduler has not asked to bind for ``max_age`` seconds
        (its filter chose no node of ours, the pod went elsewhere, or kube-scheduler is gone), so GPUs
        are never held for a pod that will not come. Returns True when one was released."""
        now, released = time.monotonic(), False
        for name, held in list(state.held.items()):
            job = state.engine.jobs.get(name)
            if job is None or job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED):
                del state.held[name]
            elif now - held.touched > max_age and not state.waiting_victims.get(name):
                self._requeue(state, name, f"kube-scheduler did not bind it within {max_age:.0f} s")
                released = True
        return released

    def _bind_without_waiting(self, state: Tracking, name: str, uid: str, pod: dict[str, Any],
                              record: AllocationRecord) -> Future[Outcome]:
        """A single member's Binding (carrying its record) goes out while the next cycle is decided: the
        engine already counts the member as running, and a failure comes back through ``settled``."""
        return self._send(state, (name, uid, pod, record.node, record))

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
            self._send(state, item)

    def _send(self, state: Tracking, item: BindItem) -> Future[Outcome]:
        """One Binding sent without waiting; its outcome comes back through ``settled``."""
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
                    self._requeue(state, name, str(error))
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
        held = {member_index(a): a for a in engine.allocations_of(job.name)}
        new = sorted(index for index in held if index not in tracked.members)
        pairs = pods_for(job, tracked, new)
        if pairs is None:
            self._requeue(state, job.name, f"{len(new)} members placed but not as many of its pods free for them")
            return None
        created = datetime.datetime.now(datetime.UTC)
        planned = []
        try:
            for index, uid in pairs:
                pod = self.mirror.pods[uid]
                allocation = held[index]
                planned.append((index, uid, pod, record_for(
                    allocation, state.views[allocation.node], pod=pods.key(pod), pod_uid=uid,
                    attempt=job.preemptions, job=job.name, vc=job.vc, job_class=job.job_class or JobClass.BORROWED,
                    member=index, scheduler=self.scheduler_name, created_at=created, batch=len(new),
                    isolation=tracked.isolation_for(uid))))
        except (KubecellError, KeyError) as error:
            self._requeue(state, job.name, str(error))
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
            nodes = {member_index(a): a.node for a in engine.allocations_of(name)}
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
        try:
            retry("bind", lambda: self.actions.bind(pod, node, record))
        except ApiError as error:
            if not (error.conflict and self.actions.bound_to(pod, node)):
                return name, uid, record is not None, error
            log.info("%s was already bound to %s (an earlier bind whose answer was lost)", pods.key(pod), node)
            return name, uid, record is not None, None
        if not self.hold:  # kube-scheduler announces the pods it asked its extender to bind
            self.announce.scheduled(pod, node)
        return name, uid, record is not None, None

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
            if name in state.held:  # extender mode: kube-scheduler binds it when it asks again
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
