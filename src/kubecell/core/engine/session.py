"""The session: the state one engine decides on, and the only code that changes a job's state.

Like a KAI-Scheduler session, it bundles what every action reads (the allocation book, the cell forest
and its bindings, the tenants, the placement policy, the queue, the usage ledger, the reservations) so
that each action (``guaranteed``, ``reclaim``, ``priority``, ``scavenge``, ``growth``) is a small module
of rules over one object. Every transition of a job (start, stop, requeue, evict, shrink, downgrade,
reject) happens here, so the ledger, the queue, the book and the bindings move together.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.admission import Admission
from kubecell.core.engine.attempt import Attempt, Shrink
from kubecell.core.engine.job import Job, JobClass, JobPhase
from kubecell.core.engine.ledger import UsageLedger
from kubecell.core.engine.options import EngineOptions
from kubecell.core.engine.placement import GangPlacer
from kubecell.core.engine.queue import ClassKey, JobQueue
from kubecell.core.engine.regions import Region, Regions
from kubecell.core.engine.reservations import Reservations
from kubecell.core.model import Node
from kubecell.core.placement.colocation import ColocationGuard
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.policy import Policy
from kubecell.core.tenancy.config import Tenants, VirtualCluster
from kubecell.core.tenancy.state import TenancyState
from kubecell.core.topology import CellForest

NODE_MASK_CACHE = 4096
"""Distinct node sets whose masks are kept for jobs still to come (forgotten all at once when full)."""
GPU_MASK_CACHE = 256
"""The same for GPU sets (``JobSpec.gpus``); fewer, as a GPU mask is eight or more times a node mask's size."""
K = TypeVar("K", bound=Hashable)


def domain_ids(labels: Sequence[tuple[str, ...]]) -> IntArray:
    """Dense ids for labelled domains; -1 for a node without the label (it belongs to no such domain)."""
    ids: dict[tuple[str, ...], int] = {}
    return np.array([ids.setdefault(label, len(ids)) if label[-1] else -1 for label in labels], np.int64)


def shared_mask(cache: dict[K, BoolArray], key: K, limit: int, build: Callable[[K], BoolArray]) -> BoolArray:
    """The read-only mask for ``key`` from ``cache``, built on first use (jobs with equal restrictions share one;
    the cache starts over when it holds ``limit``)."""
    mask = cache.get(key)
    if mask is None:
        mask = build(key)
        mask.flags.writeable = False
        if len(cache) >= limit:
            cache.clear()
        cache[key] = mask
    return mask


class Session:
    def __init__(self, nodes: Sequence[Node], tenants: Tenants, options: EngineOptions, forest: CellForest | None,
                 policy: Policy, tie_rank: IntArray | None, rng: np.random.Generator | None) -> None:
        self.book = AllocationBook(nodes)
        self.forest = forest or CellForest(nodes)
        self.options = options
        self.tenants = tenants
        self.tenancy = TenancyState(self.forest, tenants, self.book)
        self.placer = Placer(self.book, policy, rng=rng, tie_rank=tie_rank)
        self.colocation = ColocationGuard(options.colocation) if options.colocation is not None else None
        self.rack_of = domain_ids([(n.zone, n.rack) for n in self.book.nodes])
        self.zone_of = domain_ids([(n.zone,) for n in self.book.nodes])
        self.gangs = GangPlacer(self.book, self.placer, self.rack_of, self.zone_of)
        self.regions = Regions(self.book, self.forest, self.tenancy, options, self.rack_of)
        self.admission = Admission(self.book, self.forest, options, self.rack_of, self.zone_of)
        self.queue = JobQueue(options.max_preemptions, shortest_expected=options.queue_order == "shortest-expected")
        self.ledger = UsageLedger(self.book, tenants.names)
        self.reservations = Reservations(self.book, options, self.rack_of)
        self.jobs: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.rejected: list[Job] = []
        self.growable: set[str] = set()  # running threshold gangs below their headcount
        self.binding: set[str] = set()  # RESERVED jobs whose bind the driver has not confirmed yet
        self.external: set[str] = set()  # allocations of work another scheduler placed (never evicted)
        self.admitted: dict[str, int] = {}  # quota policy: job -> quota milli it holds while unplaced
        self.victim_backoff: dict[ClassKey, tuple[float, tuple[int, int, int]]] = {}
        self._node_masks: dict[frozenset[str], BoolArray] = {}  # JobSpec.nodes -> its node mask
        self._gpu_masks: dict[frozenset[tuple[str, int]], BoolArray] = {}  # JobSpec.gpus -> its GPU mask

    # ------------------------------------------------------------------ shared queries
    def share(self, vc: str) -> float:
        """The VC's weighted dominant share when fair sharing orders the queue, else 0 (no order)."""
        if not self.options.fair_share:
            return 0.0
        config = self.tenants.get(vc)
        return float("inf") if config is None else self.ledger.dominant_share(vc, config.weight)

    def effective_guarantee(self, vc: VirtualCluster) -> int:
        if not self.options.cells:
            return vc.guaranteed_milli
        return vc.guaranteed_milli - self.tenancy.doomed_gpus(vc.name) * 1000

    def guarantee_room(self, vc: VirtualCluster, job: Job | None = None) -> int:
        """Guarantee not yet used by running guaranteed work, nor held by admitted jobs or for starving jobs
        (other than ``job``)."""
        usage = self.ledger.of(vc.name)
        own = self.admitted.get(job.name, 0) if job is not None else 0
        held = self.reservations.room_held(vc.name, self.jobs, job)
        return self.effective_guarantee(vc) - usage.guaranteed_milli - usage.admitted_milli + own - held

    def allowed_nodes(self, job: Job) -> BoolArray | None:
        """The nodes the job may use (``JobSpec.nodes``, and the nodes of ``JobSpec.gpus``) as a read-only node
        mask; None: any node. Made once per job and shared by jobs with the same set (pods of one deployment),
        so an unrestricted job costs one attribute test and a restricted one an ``&`` per filter."""
        spec = job.spec
        names = spec.nodes
        if spec.gpus is not None:
            holders = frozenset(node for node, _ in spec.gpus)
            names = holders if names is None else names & holders
        if names is None:
            return None
        if job.node_mask is None:
            job.node_mask = shared_mask(self._node_masks, names, NODE_MASK_CACHE, self._node_mask)
        return job.node_mask

    def _node_mask(self, names: frozenset[str]) -> BoolArray:
        mask = np.zeros(self.book.size, np.bool_)
        index = self.book.index
        mask[[index[name] for name in names if name in index]] = True
        return mask

    def allowed_gpus(self, job: Job) -> BoolArray | None:
        """``JobSpec.gpus`` as a read-only GPU mask (nodes x GPU slots), made on first use and shared by jobs with
        the same set (the pods of one claim template); None: any GPU. Indices past a node's GPUs, and unknown
        nodes, match nothing."""
        gpus = job.spec.gpus
        if gpus is None:
            return None
        if job.gpu_mask is None:
            job.gpu_mask = shared_mask(self._gpu_masks, gpus, GPU_MASK_CACHE, self._gpu_mask)
        return job.gpu_mask

    def _gpu_mask(self, gpus: frozenset[tuple[str, int]]) -> BoolArray:
        book = self.book
        mask = np.zeros((book.size, book.max_gpus), np.bool_)
        for node, gpu in gpus:
            row = book.index.get(node)
            if row is not None and gpu < book.max_gpus:
                mask[row, gpu] = True
        return mask

    def members_on(self, job: Job, nodes: BoolArray) -> int:
        """How many of a running job's members sit on the ``nodes`` (what evicting it frees there)."""
        book = self.book
        return sum(1 for name in job.running_members if nodes[book.index[book.allocations[name].node]])

    def milli_on(self, job: Job, nodes: BoolArray) -> int:
        """GPU units a running job's members on the ``nodes`` are charged (what evicting it frees there)."""
        if not job.spec.heterogeneous:
            return job.member_milli * self.members_on(job, nodes)
        book = self.book
        return sum(job.charge_of(name) for name in job.running_members
                   if nodes[book.index[book.allocations[name].node]])

    def filters(self, region: Region, attempt: Attempt) -> tuple[BoolArray | None, BoolArray | None]:
        """The region's GPU and node masks, within the nodes the job may use and without the nodes other
        jobs' reservations hold against it. Every placement, fit test and victim simulation reads its
        masks here, so a job's node restriction holds wherever a member gets capacity. With interference-aware
        sharing on, a share's GPU mask also leaves out the GPUs where its rule refuses it beside the shares
        already there (members of one gang are judged against those, not against each other); a job limited to
        some GPUs (``JobSpec.gpus``, a DRA claim's selectors) gets only those."""
        mask = region.mask
        spec = attempt.job.spec
        if self.colocation is not None and not spec.heterogeneous and spec.member.is_share:
            queued = len(self.queue.pending) > (attempt.job.name in self.queue.pending)  # others than this job
            mask = self.colocation.restrict(self.book, spec.member_request(0), mask, queued=queued)
        gpus = self.allowed_gpus(attempt.job)
        if gpus is not None:
            mask = gpus if mask is None else mask & gpus
        nodes = region.nodes
        allowed = self.allowed_nodes(attempt.job)
        if allowed is not None:
            nodes = allowed if nodes is None else nodes & allowed
        blocked = self.reservations.blocking(attempt, self.jobs)
        if blocked is None:
            return mask, nodes
        nodes = ~blocked if nodes is None else nodes & ~blocked
        return mask, nodes

    def fits(self, attempt: Attempt, region: Region, most: int, least: int) -> bool:
        mask, nodes = self.filters(region, attempt)
        return self.gangs.fits(attempt.job.spec, mask, nodes, most, least)

    # ------------------------------------------------------------------ transitions
    def start(self, attempt: Attempt, region: Region, job_class: JobClass, *, most: int, least: int,
              victims: Sequence[Job] = ()) -> bool:
        """Bind the region's cells, place the gang through the policy, and account it; with victims the
        job is RESERVED until the driver confirms the bind. False (nothing changed) if it does not fit."""
        job = attempt.job
        attempt.job_class = job_class
        if job.spare is not None:  # the driver has pods for only so many members (``Engine.limit_growth``)
            most = min(most, job.bindable_first(most))
            if most < least:
                return False
        victims = (*victims, *attempt.shrunk)  # capacity a shrink frees is as much in the way until confirmed
        for cell in region.binds:
            self.tenancy.bind(job.vc, cell)
        mask, nodes = self.filters(region, attempt)
        allocations = self.gangs.place(job.spec, mask, nodes, most, least)
        if allocations is None:
            for cell in reversed(region.binds):
                self.tenancy.unbind(cell)
            return False
        if region.binds:
            used = {(self.book.index[a.node], g) for a in allocations for g in a.gpu_indices}
            for cell in reversed(region.binds):
                if not any(gpu in used for gpu in cell.gpus):
                    self.tenancy.unbind(cell)
        self.release_admission(job)
        job.placement_score = self.gangs.last_score
        job.running_members = [a.name for a in allocations]
        if job.spare is not None:
            job.spare = job.spare_after(allocations)
        job.job_class = job_class
        job.phase = JobPhase.RESERVED if victims else JobPhase.RUNNING
        job.reserved_until = attempt.now + self.options.reservation_timeout_seconds if victims else None
        if victims:
            self.binding.add(job.name)
        job.started_at = attempt.now
        if job.first_started_at is None:
            job.first_started_at = attempt.now
        job.wait_reason = f"running ({job_class.value}) since {attempt.now:g}"
        self.queue.dequeue(job)
        self.reservations.drop(job.name)
        self.enter_running(job)
        attempt.result.started.append(job)
        return True

    def enter_running(self, job: Job) -> None:
        """Account a job that now holds its members (started here, or restored from the cluster)."""
        self.ledger.add(job)
        self.running[job.name] = job
        if job.size < job.spec.members:
            self.growable.add(job.name)

    def stop(self, job: Job) -> None:
        """Release everything a running job holds (it leaves the running set; the caller says where to)."""
        self.ledger.remove(job)
        for name in job.running_members:
            self.book.release(name)
        job.running_members = []
        job.short_of_minimum = False  # it starts again from its minimums
        job.resized_at, job.spare = None, None  # a new run is resized and bounded afresh
        job.resizes.clear()
        job.ranks = {}  # its members' names are given to other pods in a new run
        self.running.pop(job.name, None)
        self.growable.discard(job.name)
        self.binding.discard(job.name)
        job.reserved_until = None
        self.queue.mark_dirty()

    def requeue(self, job: Job, now: float, reason: str, *, keep_age: bool = False) -> None:
        """Back to the queue; ``keep_age``: with the age of its last wait (a bind that failed, not a new wait)."""
        since = job.queued_at if keep_age else None
        job.phase = JobPhase.PENDING
        job.job_class = None
        job.started_at = None
        job.lazily_preempted = False
        job.wait_reason = reason
        self.queue.enqueue(job, now, since=since)

    def evict(self, job: Job, attempt: Attempt, reason: str) -> None:
        self.stop(job)
        job.preemptions += 1
        self.requeue(job, attempt.now, reason)
        attempt.result.evicted.append(job)

    def shrink(self, job: Job, members: Sequence[str], attempt: Attempt, reason: str) -> None:
        """Release some members of a running elastic job (never below its minimums, ``shrink.shrinkable``):
        it runs on with the rest, in its class, and may grow again. Not a preemption of the job."""
        before = job.size
        gone = set(members)
        self.ledger.remove(job)
        for name in members:
            self.book.release(name)
        job.running_members = [name for name in job.running_members if name not in gone]
        self.ledger.add(job)
        self.growable.add(job.name)
        job.resized(attempt.now, f"shrunk {before} -> {job.size} members at t={attempt.now:g}: {reason}")
        attempt.shrunk.append(job)
        attempt.result.shrunk.append(Shrink(job, tuple(members), reason))
        self.queue.mark_dirty()

    def set_class(self, job: Job, job_class: JobClass) -> None:
        """Change a running job's class (lazy preemption, reload) without moving it."""
        self.ledger.remove(job)
        job.job_class = job_class
        self.ledger.add(job)
        if job_class == JobClass.GUARANTEED:
            job.lazily_preempted = False

    def reject(self, job: Job, reason: str) -> Job:
        job.phase = JobPhase.REJECTED
        job.wait_reason = reason
        self.rejected.append(job)
        return job

    def withdraw(self, job: Job) -> None:
        """Take a waiting job out of the queue and out of everything it holds while waiting."""
        self.queue.dequeue(job)
        self.release_admission(job)
        self.reservations.drop(job.name)

    def release_admission(self, job: Job) -> None:
        milli = self.admitted.pop(job.name, 0)
        if milli:
            self.ledger.of(job.vc).admitted_milli -= milli
