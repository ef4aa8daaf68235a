"""The scheduling engine: what a driver talks to. It orchestrates; the rules live in the action modules.

One engine serves the dynamic simulator, the conformance scenarios and the Kubernetes scheduler. Its
inputs are events (submit, cancel, finish, a bind confirmed or failed, node health, a configuration
reload) and ``schedule(now)`` runs one cycle:

1. binds that timed out go back to the queue with their age; cells idle since the last cycle are
   released (so every VC sees what it may bind before anyone is tried);
2. every class of waiting jobs gets its turn *within its guarantee* (``turn.within_guarantee``:
   ``guaranteed``, ``reclaim``, ``priority``), in queue order (``queue``);
3. then the jobs that may borrow take idle capacity, and opportunistic jobs scavenge it
   (``turn.beyond_guarantee``: ``scavenge``);
4. threshold gangs grow (``growth``); cells that went idle are released, and if that happened while
   jobs waited, the waiting classes get another round;
5. a class that still waits records why, and a starving job reserves nodes (``reservations``).

A preemptor shrinks elastic jobs (members above their minimums) before it evicts any whole job
(``shrink``), and a job is resized at most once per ``resize_min_interval_seconds`` (a guarantee may
always shrink it).

Every placement goes through the placement framework with the configured policy (``placement``), so the
packing experiment, the dynamic simulator and the Kubernetes scheduler make the same decision for the
same state. The driver binds what a cycle started (``CycleResult``), stops the members it shrank, and
reports back: ``confirm`` when a RESERVED job's pods are bound, ``bind_failed`` when they could not be,
``limit_growth`` when it has fewer pods than a job's headcount to grow into.
What it may ask without changing anything (where a job runs, why it waits, how far it could grow) is
``Engine.queries`` (``queries``).
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.admission import charge
from kubecell.core.engine.attempt import Attempt, CycleResult, Outcome
from kubecell.core.engine.bindings import adopt_cells, release_idle_cells
from kubecell.core.engine.growth import grow
from kubecell.core.engine.invariants import check_invariants
from kubecell.core.engine.job import Job, JobClass, JobPhase, JobSpec, member_index
from kubecell.core.engine.ledger import VcUsage
from kubecell.core.engine.node_state import set_node_lost, set_node_open
from kubecell.core.engine.options import EngineOptions
from kubecell.core.engine.queries import EngineQueries, job_named
from kubecell.core.engine.queue import ClassKey
from kubecell.core.engine.restore import RunningMember, hold_external, release_external, restore_job
from kubecell.core.engine.session import Session
from kubecell.core.engine.turn import beyond_guarantee, removed_vc_reason, within_guarantee
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import is_whole
from kubecell.core.model import MILLI_PER_GPU, Allocation, Node, Request
from kubecell.core.placement.policy import Policy
from kubecell.core.placement.registry import DEFAULT_POLICY, make_policy
from kubecell.core.shown import shown
from kubecell.core.tenancy.config import Tenants
from kubecell.core.tenancy.state import TenancyState
from kubecell.core.topology import CellForest

MAX_ROUNDS = 4
"""Rounds of one cycle at most: another round runs only when cells were released while jobs waited."""

__all__ = ["CycleResult", "Engine"]


class Engine:
    def __init__(self, nodes: Sequence[Node], tenants: Tenants, options: EngineOptions, *,
                 forest: CellForest | None = None, placement: Policy | str | None = None,
                 tie_rank: IntArray | None = None, rng: np.random.Generator | None = None) -> None:
        """``placement``: the placement policy (an instance, a registered name, or the default policy).
        ``tie_rank`` orders nodes whose scores tie (default: by name); ``rng`` drives random policies."""
        policy = placement if isinstance(placement, Policy) else make_policy(placement or DEFAULT_POLICY)
        self.session = Session(nodes, tenants, options, forest, policy, tie_rank, rng)
        self.book: AllocationBook = self.session.book
        self.forest: CellForest = self.session.forest
        self.tenancy: TenancyState = self.session.tenancy
        self.options = options
        self.jobs: dict[str, Job] = self.session.jobs
        self.running: dict[str, Job] = self.session.running
        self.rejected: list[Job] = self.session.rejected
        self.queries = EngineQueries(self.session)
        """The read-only questions (where a job runs, why it waits, how far it could grow)."""

    @property
    def tenants(self) -> Tenants:
        return self.session.tenants

    @property
    def pending(self) -> dict[str, Job]:
        return self.session.queue.pending

    @property
    def usage(self) -> dict[str, VcUsage]:
        return self.session.ledger.usage

    @property
    def policy(self) -> Policy:
        return self.session.placer.policy

    # ================================================================== events
    def submit(self, spec: JobSpec, now: float) -> Job:
        """Accept a job (PENDING) or reject it with a reason (REJECTED); never raises for bad jobs."""
        check_time(now)
        s = self.session
        job = Job(spec)
        if spec.name in s.jobs:
            return s.reject(job, f"a job named {spec.name!r} already exists")
        s.jobs[spec.name] = job
        charge(s.book, job)
        reason = s.admission.rejection(job, s.tenants)
        if reason is not None:
            return s.reject(job, reason)
        job.wait_reason = "submitted; waiting for the next scheduling cycle"
        s.queue.enqueue(job, now)
        for position, group in enumerate(spec.member_groups):  # the arrivals an online policy learns
            request = spec.member_request(spec.group_start(position))
            s.placer.policy.observe(request, min(group.count, self._could_hold(request)))
        return job

    def _could_hold(self, request: Request) -> int:
        """How many members of ``request``'s shape the whole cluster could hold at most (by GPUs; by CPU, a missing
        request counted as 100m, and the kubelet's default 110 pods per node for a member without GPUs): the
        arrivals a gang can stand for. A pod may state a headcount of millions, and as
        many arrivals of its shape would have made every other tenant's shapes vanish from what the placement
        policy learned."""
        book = self.session.book
        if request.wants_gpu:
            per = max(request.gpu_count, 1) * max(request.gpu_milli, 1)
            return int(book.gpu_count.sum()) * MILLI_PER_GPU // per
        return min(int(book.cpu_capacity.sum()) // max(request.cpu_milli, 100), book.size * MAX_PODS_PER_NODE)

    def cancel(self, name: str, now: float) -> Job:
        """The user withdrew the job, waiting or running: it releases everything it holds."""
        check_time(now)
        job = job_named(self.session, name)
        if job.phase in (JobPhase.FINISHED, JobPhase.CANCELLED, JobPhase.REJECTED):
            return job
        self._end(job, now)
        job.phase = JobPhase.CANCELLED
        job.wait_reason = f"cancelled at t={now:g}"
        return job

    def finish(self, name: str, now: float) -> Job:
        """The job completed (or, if it was still waiting, is withdrawn)."""
        check_time(now)
        job = job_named(self.session, name)
        self._end(job, now)
        job.phase = JobPhase.FINISHED
        return job

    def _end(self, job: Job, now: float) -> None:
        s = self.session
        if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED):
            s.stop(job)
        if job.name in s.queue:
            s.withdraw(job)
        s.release_admission(job)
        s.reservations.drop(job.name)
        job.finished_at = now
        s.queue.mark_dirty()

    def confirm(self, name: str, now: float) -> None:
        """The driver bound every member of a RESERVED job: it is running now."""
        check_time(now)
        job = job_named(self.session, name)
        if job.phase == JobPhase.RESERVED:
            job.phase = JobPhase.RUNNING
            job.reserved_until = None
            self.session.binding.discard(name)

    def bind_failed(self, name: str, now: float, reason: str) -> Job:
        """The driver could not bind the job's pods: it releases what it holds and waits again, keeping its
        age in the queue (not counted as a preemption)."""
        check_time(now)
        job = job_named(self.session, name)
        if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED):
            self.session.stop(job)
            self.session.requeue(job, now, f"binding failed: {reason}; waiting again", keep_age=True)
        return job

    def limit_growth(self, name: str, spare: Sequence[int] | None) -> None:
        """The driver can bind at most ``spare[g]`` more members of the job's group ``g`` (the pods it has
        for them; a homogeneous job has one group): growth adds no more, and counts them down as it adds.
        None lifts the limit. A waiting job starts with no more members than that (an elastic gang whose
        headcount is its maximum but whose driver made pods for fewer); its next run after a stop starts
        without a limit."""
        job = job_named(self.session, name)
        if job.phase == JobPhase.PENDING and _short_of_pods(job):
            self.session.queue.mark_dirty()  # it waited for its pods: it may start now
        if spare is None:
            job.spare = None
            return
        groups = len(job.spec.member_groups)
        values = tuple(spare)
        if len(values) != groups or any(not is_whole(v) or v < 0 for v in values):
            raise InvalidInputError(f"spare members {list(values)}", location=f"job {name!r}", field="spare",
                                    accepted=f"{groups} non-negative integer(s), one per member group")
        if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED, JobPhase.PENDING):
            job.spare = tuple(int(v) for v in values)

    def rank_members(self, name: str, ranks: Mapping[str, int]) -> None:
        """The driver's order for giving up a running homogeneous job's members: a shrink takes the highest
        rank first (``shrink.shrinkable``), unranked members before any. Where a preemptor needs a member
        that sits where it must go, the trim still keeps another (the place decides). Replaces earlier ranks;
        names that are not running members are ignored."""
        job = job_named(self.session, name)
        if any(not is_whole(rank) for rank in ranks.values()):
            raise InvalidInputError(f"member ranks {shown(dict(ranks))}", location=f"job {name!r}", field="ranks",
                                    accepted="an integer per member")
        running = set(job.running_members)
        job.ranks = {member: int(rank) for member, rank in ranks.items() if member in running}

    def release_members(self, name: str, members: Sequence[str], now: float, reason: str) -> bool:
        """The driver lost the pods of some members of running job ``name`` (an elastic job's controller
        deleted workers after its target was lowered, or replaced one that failed): their capacity is free
        again, and the job runs on with the rest, in its class, and may grow again. Only while the rest keep
        the job's minimums (else False and nothing changes: a job below its minimum has ended or restarts,
        which its driver tells as a finish or a cancel)."""
        check_time(now)
        job = job_named(self.session, name)
        gone = [member for member in dict.fromkeys(members) if member in job.running_members]
        if job.phase != JobPhase.RUNNING or not gone:
            return False
        kept = [member for member in job.running_members if member not in gone]
        if not job.spec.meets_minimums(job.spec.counts_of(member_index(member) for member in kept)):
            return False
        s = self.session
        before = job.size
        s.ledger.remove(job)
        for member in gone:
            s.book.release(member)
        job.running_members = kept
        s.ledger.add(job)
        s.growable.add(job.name)
        job.resized(now, f"{before} -> {job.size} members at t={now:g}: {reason}")
        s.queue.mark_dirty()
        return True

    def set_node_health(self, node_name: str, healthy: bool, now: float) -> list[Job]:
        """Mark a node healthy or not. Jobs with members on a failed node are stopped (hardware, not the
        scheduler, broke them; not a preemption) and go back to the queue. A failed node takes no new work."""
        check_time(now)
        s = self.session
        node = s.book.node(node_name)
        s.book.set_node_health(node, healthy)
        killed: list[Job] = []
        if not healthy:
            for job in list(s.running.values()):
                if any(s.book.allocations[a].node == node_name for a in job.running_members):
                    s.stop(job)
                    s.requeue(job, now, f"stopped: node {node_name} failed")
                    killed.append(job)
        s.tenancy.refresh_health()
        s.queue.mark_dirty()
        return killed

    def set_node_open(self, node_name: str, open_: bool) -> bool:
        """Open or close a node to new work, keeping what runs there (a cordoned or NotReady Kubernetes node);
        see ``node_state``. Returns whether anything changed."""
        return set_node_open(self.session, node_name, open_)

    def hold_lost_node(self, node_name: str) -> None:
        """Hold a node the cluster no longer has as failed hardware, stopping nothing (``node_state``)."""
        set_node_lost(self.session, node_name)

    def reload(self, tenants: Tenants, now: float) -> list[Job]:
        """Adopt a new tenant configuration as a diff: running jobs keep running. Guaranteed jobs whose
        cells the new guarantees still cover, oldest first within the guaranteed count, stay guaranteed; the
        others become borrowed (or opportunistic when their VC is gone) and are the first reclaimed. Jobs a
        reload lowered before go back up where the new guarantees cover them (``_raise_classes``). Waiting
        jobs of a removed VC are rejected (nothing could ever admit them). Nothing is evicted. Returns
        downgraded jobs."""
        check_time(now)
        s = self.session
        s.tenants = tenants
        s.tenancy.reconfigure(tenants)
        for vc in tenants.vcs:
            s.ledger.of(vc.name)
        for job in [j for j in s.queue.pending.values() if tenants.get(j.vc) is None]:
            s.withdraw(job)
            s.reject(job, removed_vc_reason(s, job.vc))
        downgraded: list[Job] = []
        kept: Counter[str] = Counter()  # without cells: guaranteed milli-GPUs kept so far, oldest jobs first
        oldest_first = sorted(s.running.values(), key=lambda j: (j.started_at if j.started_at is not None else 0.0,
                                                                 j.name))
        for job in oldest_first:
            tenant = tenants.get(job.vc)
            if tenant is None:
                if job.job_class != JobClass.OPPORTUNISTIC:
                    s.set_class(job, JobClass.OPPORTUNISTIC)
                    downgraded.append(job)
                continue
            if job.job_class != JobClass.GUARANTEED:
                continue
            # a count, judged against what the older jobs kept (not the VC's whole use, newer jobs included); with
            # cells, the cells too: shares charged by memory can sum past their GPUs' cells (1.016 GPUs of 1)
            covered = kept[tenant.name] + job.held_gpu_milli <= tenant.guaranteed_milli and (
                not s.options.cells or adopt_cells(s, job))
            kept[tenant.name] += job.held_gpu_milli if covered else 0
            if not covered:
                s.set_class(job, JobClass.BORROWED)
                downgraded.append(job)
        self._raise_classes(oldest_first, kept)
        release_idle_cells(s, everything=True)
        s.queue.mark_dirty()
        return downgraded

    def _raise_classes(self, oldest_first: Sequence[Job], kept: Counter[str]) -> None:
        """After a reload lowered what it must: a running job below the class its VC now gives it goes back up,
        oldest first, within the guarantee room the guaranteed jobs left (``kept``) and the borrowing limit.

        Why: a reload only lowered classes. A VC removed by a bad configuration push and restored by the next
        left its running jobs opportunistic for good, though its guarantee covered them again; a borrower then
        evicted one as opportunistic work, which restarted guaranteed and evicted its own VC's next job, which
        evicted the borrower: three evictions in two cycles where none was needed (found by a hostile review).
        A guarantee that shrank and grew back left its jobs borrowed, and reclaimable, the same way. A job that
        asked to be opportunistic stays so."""
        s = self.session
        for job in oldest_first:
            tenant = s.tenants.get(job.vc)
            if tenant is None or job.job_class == JobClass.GUARANTEED or job.spec.opportunistic:
                continue
            before = job.job_class
            if kept[tenant.name] + job.held_gpu_milli <= tenant.guaranteed_milli:
                s.set_class(job, JobClass.GUARANTEED)
                if not s.options.cells or adopt_cells(s, job):
                    kept[tenant.name] += job.held_gpu_milli
                    continue
                s.set_class(job, before if before is not None else JobClass.BORROWED)
            limit = tenant.borrow_limit_milli
            if job.job_class == JobClass.OPPORTUNISTIC and s.options.borrowing and (
                    limit is None or s.ledger.of(tenant.name).borrowed_milli + job.held_gpu_milli <= limit):
                s.set_class(job, JobClass.BORROWED)

    def restore(self, spec: JobSpec, members: Sequence[RunningMember], job_class: JobClass, *, started_at: float,
                preemptions: int = 0) -> Job:
        """Adopt a job that already runs in the cluster (a restarted scheduler rebuilding its state from the
        allocation records); see ``restore``. Raises InvalidInputError, changing nothing, if it cannot."""
        check_time(started_at, "started_at")
        return restore_job(self.session, spec, members, job_class, started_at=started_at, preemptions=preemptions)

    def hold_external(self, request: Request, node: str, gpus: tuple[int, ...] | None = None) -> Allocation:
        """Capacity held by work another scheduler placed (see ``restore.hold_external``)."""
        return hold_external(self.session, request, node, gpus)

    def release_external(self, name: str) -> None:
        release_external(self.session, name)

    # ================================================================== the cycle
    def schedule(self, now: float) -> CycleResult:
        check_time(now)
        s = self.session
        result = CycleResult()
        self._expire_binds(now)
        release_idle_cells(s)
        keys = s.queue.begin_cycle(now)
        for _ in range(MAX_ROUNDS):
            waited = self._round(keys, now, result)
            grow(s, now, result)
            if not release_idle_cells(s) or not waited:
                break
            keys = s.queue.all_classes()
        return result

    def _round(self, keys: list[ClassKey], now: float, result: CycleResult) -> bool:
        """Both passes over ``keys``; True if some class still waits."""
        reasons: dict[ClassKey, str] = {}
        waited: set[ClassKey] = set()
        deferred = self._pass(keys, now, result, reasons, waited, beyond=False)
        self._pass(deferred, now, result, reasons, waited, beyond=True)
        return bool(waited)

    def _pass(self, keys: list[ClassKey], now: float, result: CycleResult, reasons: dict[ClassKey, str],
              waited: set[ClassKey], *, beyond: bool) -> list[ClassKey]:
        s = self.session
        active = list(keys)
        deferred: list[ClassKey] = []
        # A class's place in the order changes only when its head does or its VC's usage does, so the
        # keys are kept and refreshed for exactly those classes (a pick is then one pass of min()).
        order = {key: s.queue.order_key(self._head(key), s.share) for key in active}
        seen = dict(s.ledger.changes)
        while active:
            key = min(active, key=order.__getitem__)
            job = self._head(key)
            attempt = Attempt(job, now, result)
            short = _short_of_pods(job)
            if short:  # nothing is reclaimed, preempted or reserved for a job that could not be bound
                active.remove(key)
                reasons[key] = attempt.reason = short
                waited.add(key)
                s.queue.class_waits(key, short)
                continue
            outcome = (beyond_guarantee(s, attempt, reasons.get(key, "")) if beyond
                       else within_guarantee(s, attempt))
            if s.ledger.changes != seen:
                moved = {vc for vc, count in s.ledger.changes.items() if seen.get(vc) != count}
                seen = dict(s.ledger.changes)
                for other in active:
                    head = s.queue.head(other)
                    if other[0] in moved and head is not None:
                        order[other] = s.queue.order_key(head, s.share)
            if outcome in (Outcome.STARTED, Outcome.REJECTED):
                if s.queue.head(key) is None:
                    active.remove(key)
                else:
                    order[key] = s.queue.order_key(self._head(key), s.share)
                continue
            active.remove(key)
            reasons[key] = attempt.reason
            # A starving job holds its nodes from now on, even while it tries to borrow in the next pass.
            wake = s.reservations.maybe_reserve(job, now, s.jobs, self._reach, self._evictable_gpus,
                                                s.allowed_nodes(job))
            if wake is not None:
                s.queue.wake_later(job, wake)
            if outcome == Outcome.DEFERRED:
                deferred.append(key)
                continue
            waited.add(key)
            s.queue.class_waits(key, attempt.reason)
            job.wait_reason += s.reservations.note(job.name)
        return deferred

    def _reach(self, job: Job) -> BoolArray | None:
        """Where a starving job may reserve: inside its VC's cells when its guarantee could hold it."""
        s = self.session
        vc = s.tenants.get(job.vc)
        if (vc is None or not s.options.cells or job.spec.opportunistic or not job.spec.wants_gpu
                or s.admission.never_guaranteed(vc, job) is not None):
            return None
        return s.regions.reach(vc, job.spec)

    def _evictable_gpus(self) -> IntArray:
        """GPUs per node held by borrowed and opportunistic work (what a guarantee may reclaim)."""
        s = self.session
        counts = np.zeros(s.book.size, np.int64)
        for job_class in (JobClass.BORROWED, JobClass.OPPORTUNISTIC):
            for name in s.ledger.holders(job_class, None):
                for member in s.jobs[name].running_members:
                    allocation = s.book.allocations[member]
                    counts[s.book.index[allocation.node]] += len(allocation.gpu_indices)
        return counts

    def _head(self, key: ClassKey) -> Job:
        job = self.session.queue.head(key)
        assert job is not None
        return job

    def _expire_binds(self, now: float) -> None:
        """RESERVED jobs whose bind was not confirmed in time go back to the queue with their age, so the
        capacity they freed goes back to them, not to the work they displaced."""
        s = self.session
        for name in sorted(s.binding):
            job = s.jobs[name]
            if job.phase != JobPhase.RESERVED:
                s.binding.discard(name)
            elif job.reserved_until is not None and now > job.reserved_until:
                s.stop(job)
                s.requeue(job, now, "reservation timed out before the job was bound; requeued", keep_age=True)

    # ================================================================== checks
    def check_invariants(self) -> None:
        """Raise ``EngineInvariantError`` if the engine's state broke any of its invariants."""
        check_invariants(self.session)


MAX_PODS_PER_NODE = 110
"""The kubelet's default ``maxPods``."""


def check_time(now: object, field: str = "now") -> None:
    """Refuse a time that is no finite number before anything changes. A NaN compares false with every
    deadline: a cycle at NaN reclaimed borrowed work still inside its minimum run time."""
    if isinstance(now, bool) or not isinstance(now, numbers.Real) or not math.isfinite(now):
        raise InvalidInputError(f"time {shown(now)}", location="engine", field=field,
                                accepted="a finite number of seconds")


def _short_of_pods(job: Job) -> str:
    """Why ``job`` cannot start whatever is freed for it: its driver has pods for fewer members than its minimum
    (``limit_growth``; pods still being created). Before, reclaim evicted borrowed work for such a job at every
    retry of the queue, and the job then could not start: the same victim was preempted again and again."""
    minimum = job.spec.minimum
    if job.spare is None:
        return ""
    bindable = job.bindable_first(minimum)
    if bindable >= minimum:
        return ""
    return (f"has pods for {bindable} of the {minimum} members it needs to start; nothing is freed for it until "
            "it has them")
