"""The scheduling engine: queues, tenancy classes, gang transactions, preemption, reservations.

One engine serves the simulator, the conformance scenarios and (later) the Kubernetes scheduler. Its
inputs are events (submit, finish, node health, configuration reload) and ``schedule(now)`` runs one
cycle. A cycle walks the pending jobs in queue order (priority, then the VC's weighted dominant share,
then age) and tries to start each one:

1. *Guaranteed*: the job fits its VC's remaining guarantee; it is placed inside the VC's cells, binding
   a free cell when needed (safe splits only). Borrowed and opportunistic work in the way is reclaimed:
   whole gangs, chosen by simulation. If the guarantee is full of lower-priority work of the same VC,
   those jobs are downgraded to borrowed (lazy preemption) and die only if their GPUs are needed.
2. *Borrowed*: beyond its guarantee, a job may use idle capacity (fair share decides who goes first,
   ``borrowLimitGpus`` caps it), preferring cells nobody has bound. It can be reclaimed by the owners.
3. *Opportunistic*: priority -1 jobs scavenge idle capacity and are reclaimed first.

A job that cannot start gets a reason (``explain``). A job pending longer than the starvation threshold
gets a reservation: the region it needs stops taking other work until it fits (backfill elsewhere).
Preemptors start in the same transaction that evicts their victims, so the freed capacity is theirs.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.gang import GangPlan, commit, member_capacity, plan_gang
from kubecell.core.engine.job import Job, JobClass, JobPhase, JobSpec
from kubecell.core.engine.options import EngineOptions
from kubecell.core.engine.preemption import gpu_seconds, select_victims
from kubecell.core.errors import AllocationError
from kubecell.core.model import Node, TopologyLevel
from kubecell.core.placement.filters import model_mask, never_fits
from kubecell.core.tenancy.config import Tenants, VirtualCluster
from kubecell.core.tenancy.state import TenancyState
from kubecell.core.topology import Cell, CellChain, CellForest

VICTIM_SEARCH_BACKOFF_SECONDS = 60.0
CANDIDATE_CELLS = 32
"""Free cells considered per decision for a new binding (the best ones by occupancy and buddy order)."""


@dataclass(slots=True)
class VcUsage:
    guaranteed_milli: int = 0
    borrowed_milli: int = 0
    opportunistic_milli: int = 0
    cpu_milli: int = 0
    admitted_milli: int = 0  # quota held by admitted jobs that are not placed yet (quota policy)

    @property
    def total_milli(self) -> int:
        return self.guaranteed_milli + self.borrowed_milli + self.opportunistic_milli


@dataclass(slots=True)
class CycleResult:
    started: list[Job] = field(default_factory=list)
    evicted: list[Job] = field(default_factory=list)
    downgraded: list[Job] = field(default_factory=list)
    grown: list[Job] = field(default_factory=list)


@dataclass(slots=True)
class _Region:
    """Where a job may go: a GPU mask, and the cell to bind first (guaranteed placements)."""

    mask: BoolArray | None
    binds: tuple[Cell, ...] = ()
    bound: bool = False
    label: str = "cluster"
    free_gpus: int = 0
    preference: tuple[int, int, int] = (0, 0, 0)


class Engine:
    def __init__(self, nodes: Sequence[Node], tenants: Tenants, options: EngineOptions,
                 *, forest: CellForest | None = None) -> None:
        self.book = AllocationBook(nodes)
        self.forest = forest or CellForest(nodes)
        self.options = options
        self.tenants = tenants
        self.tenancy = TenancyState(self.forest, tenants, self.book)
        self.jobs: dict[str, Job] = {}
        self.pending: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.owner_of: dict[str, str] = {}
        self.usage: dict[str, VcUsage] = {vc.name: VcUsage() for vc in tenants.vcs}
        self.guaranteed_use: IntArray = np.zeros((self.book.size, self.book.max_gpus), np.int64)
        self.total_gpu_milli = max(self.book.total_gpu_milli, 1)
        self.total_cpu_milli = max(int(self.book.cpu_capacity.sum()), 1)
        racks: dict[tuple[str, str], int] = {}
        zones: dict[str, int] = {}
        self.rack_of = np.array([racks.setdefault((n.zone, n.rack), len(racks)) for n in self.book.nodes], np.int64)
        self.zone_of = np.array([zones.setdefault(n.zone, len(zones)) for n in self.book.nodes], np.int64)
        self.reservations: dict[str, BoolArray] = {}
        self.pending_since: dict[str, float] = {}
        self.rejected: list[Job] = []
        self._dirty = True
        self._new: list[str] = []
        self._maybe_idle: set[Cell] = set()  # bound cells that lost guaranteed work this cycle
        self._growable: set[str] = set()  # running threshold gangs below their headcount
        self._reserved: set[str] = set()  # jobs holding capacity until their bind is confirmed
        self._classes: dict[tuple[object, ...], deque[Job]] = {}  # pending jobs by class, oldest first
        self._class_of: dict[str, tuple[object, ...]] = {}
        self._class_reason: dict[tuple[object, ...], str] = {}
        self._unsynced: dict[tuple[object, ...], list[Job]] = {}  # joined a class since it was last tried
        self._wake_at: float | None = None
        self._reclaimable_on: dict[int, set[str]] = {}  # node -> running borrowed jobs there
        self._opportunistic_on: dict[int, set[str]] = {}  # node -> running opportunistic jobs there
        self._guaranteed_priorities: dict[str, Counter[int]] = {}  # VC -> priorities of its guaranteed jobs
        self._guaranteed_of: dict[str, set[str]] = {}  # VC -> its running guaranteed jobs
        self._admitted: dict[str, int] = {}  # quota policy: job -> quota milli it holds while unplaced
        self._victim_backoff: dict[tuple[object, ...], tuple[float, tuple[int, int]]] = {}

    # ================================================================== events
    def submit(self, spec: JobSpec, now: float) -> Job:
        """Accept a job (PENDING) or reject it with a reason (REJECTED); never raises for bad jobs."""
        job = Job(spec)
        if spec.name in self.jobs:
            return self._reject(job, f"a job named {spec.name!r} already exists")
        self.jobs[spec.name] = job
        vc = self.tenants.get(spec.vc)
        if vc is None:
            return self._reject(job, f"unknown virtual cluster {spec.vc!r} (known: {', '.join(self.tenants.names)})")
        impossible = never_fits(self.book, spec.member_request(0))
        if impossible is not None:
            return self._reject(job, f"no node could ever hold a member: {impossible.reason}")
        if not self._cluster_could_hold(spec):
            return self._reject(job, f"the gang ({spec.minimum}+ members) is larger than the cluster could ever hold"
                                     + (f" within one {spec.topology.name.lower()}" if spec.topology else ""))
        if not spec.opportunistic and not self.options.borrowing:
            reason = self._never_guaranteed(vc, spec)
            if reason is not None:
                return self._reject(job, f"{reason}, and this policy does not borrow")
        limit = vc.borrow_limit_milli
        if not spec.opportunistic and self.options.borrowing and limit is not None and spec.min_gpu_milli > limit:
            reason = self._never_guaranteed(vc, spec)
            if reason is not None:
                return self._reject(job, f"{reason}, and it may borrow at most {limit / 1000:g} GPUs")
        job.wait_reason = "submitted; waiting for the next scheduling cycle"
        self._enqueue(job, now)
        return job

    def finish(self, name: str, now: float) -> Job:
        job = self.jobs[name]
        if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED):
            self._stop(job)
        if name in self.pending:
            self._dequeue(job)
        self._release_admission(job)
        self.reservations.pop(name, None)
        job.phase = JobPhase.FINISHED
        job.finished_at = now
        self._dirty = True
        return job

    def confirm(self, name: str, now: float) -> None:
        """The driver bound a RESERVED job's pods: it is running now."""
        job = self.jobs[name]
        if job.phase == JobPhase.RESERVED:
            job.phase = JobPhase.RUNNING
            job.reserved_until = None

    def set_node_health(self, node_name: str, healthy: bool, now: float) -> list[Job]:
        """Mark every GPU of a node healthy or not. Jobs with members there are stopped (hardware,
        not the scheduler, broke them) and go back to the queue."""
        node = self.book.node(node_name)
        for gpu in range(int(self.book.gpu_count[node])):
            self.book.set_gpu_health(node, gpu, healthy)
        killed: list[Job] = []
        if not healthy:
            for job in list(self.running.values()):
                if any(self.book.allocations[a].node == node_name for a in job.running_members):
                    self._stop(job)
                    self._requeue(job, now, f"stopped: node {node_name} failed")
                    killed.append(job)
        self.tenancy.refresh_health()
        self._dirty = True
        return killed

    def reload(self, tenants: Tenants, now: float) -> list[Job]:
        """Adopt a new tenant configuration as a diff: running jobs keep running. Guaranteed jobs whose
        cells the new guarantees still cover stay guaranteed; the others become borrowed (or
        opportunistic when their VC is gone) and are the first reclaimed. Waiting jobs of a removed VC
        are rejected (nothing could ever admit them); running ones keep running as opportunistic.
        Returns downgraded jobs."""
        self.tenants = tenants
        self.tenancy.reconfigure(tenants)
        for vc in tenants.vcs:
            self.usage.setdefault(vc.name, VcUsage())
        for job in [j for j in self.pending.values() if self.tenants.get(j.vc) is None]:
            self._dequeue(job)
            self._release_admission(job)
            self.reservations.pop(job.name, None)
            self._reject(job, self._removed_vc_reason(job))
        downgraded: list[Job] = []
        for job in sorted(self.running.values(), key=lambda j: (j.started_at if j.started_at is not None else 0.0,
                                                                j.name)):
            if self.tenants.get(job.vc) is None:
                if job.job_class != JobClass.OPPORTUNISTIC:
                    self._downgrade(job, JobClass.OPPORTUNISTIC)
                    downgraded.append(job)
                continue
            if job.job_class != JobClass.GUARANTEED:
                continue
            if not self._adopt_cells(job):
                self._downgrade(job, JobClass.BORROWED)
                downgraded.append(job)
        self._release_idle_cells(everything=True)
        self._dirty = True
        return downgraded

    # ================================================================== the cycle
    def schedule(self, now: float) -> CycleResult:
        """One cycle. Pending jobs are grouped into classes of identical jobs (same VC, priority, shape,
        gang size, constraint); only a class's oldest job is tried, and when it cannot start neither can
        the others, so a cycle costs O(classes), not O(pending jobs)."""
        result = CycleResult()
        self._expire_reservations(now)
        if self._wake_at is not None and now >= self._wake_at:
            self._dirty = True
            self._wake_at = None
        if self._dirty:
            active = [key for key, queue in self._classes.items() if queue]
        else:
            active = list(dict.fromkeys(self._class_of[n] for n in self._new if n in self.pending))
        self._dirty = False
        self._new = []
        while active:
            key = min(active, key=lambda k: self._queue_key(self._classes[k][0], now))
            queue = self._classes[key]
            job = queue[0]
            if self._try_start(job, now, result):
                if not queue:
                    active.remove(key)
                continue
            active.remove(key)
            self._class_waits(key, job.wait_reason)
            self._maybe_reserve(job, now)
        self._grow(now, result)
        self._release_idle_cells()
        return result

    def _class_waits(self, key: tuple[object, ...], reason: str) -> None:
        """Every job of a class waits for the same reason. The text goes to every member only when it
        changes; otherwise only to the members that joined since the class was last tried, so that a
        cycle costs O(classes + newcomers), not O(pending jobs)."""
        newcomers = self._unsynced.pop(key, [])
        if self._class_reason.get(key) == reason:
            for job in newcomers:
                if self._class_of.get(job.name) == key:  # still waiting in this class
                    job.wait_reason = reason
            return
        self._class_reason[key] = reason
        for job in self._classes[key]:
            job.wait_reason = reason

    def _enqueue(self, job: Job, now: float) -> None:
        key = self._shape_key(job)
        self.pending[job.name] = job
        self.pending_since[job.name] = now
        self._class_of[job.name] = key
        self._classes.setdefault(key, deque()).append(job)
        self._unsynced.setdefault(key, []).append(job)  # told why its class waits when the class is tried
        self._new.append(job.name)

    def _dequeue(self, job: Job) -> None:
        self.pending.pop(job.name, None)
        self.pending_since.pop(job.name, None)
        key = self._class_of.pop(job.name, None)
        if key is None:
            return
        queue = self._classes[key]
        if queue and queue[0] is job:
            queue.popleft()
        else:
            queue.remove(job)
        if not queue:
            del self._classes[key]
            self._class_reason.pop(key, None)
            self._unsynced.pop(key, None)

    def _wake_later(self, when: float) -> None:
        """Reconsider every waiting job at ``when`` (a protection expires or a job starts starving)."""
        if self._wake_at is None or when < self._wake_at:
            self._wake_at = when

    def _queue_key(self, job: Job, now: float) -> tuple[float, float, float, str]:
        share = self.dominant_share(job.vc) if self.options.fair_share else 0.0
        return (-job.spec.priority, share, self.pending_since.get(job.name, now), job.name)

    def dominant_share(self, vc_name: str) -> float:
        vc = self.tenants.get(vc_name)
        usage = self.usage.get(vc_name)
        if vc is None or usage is None:
            return float("inf")
        gpu = usage.total_milli / self.total_gpu_milli
        cpu = usage.cpu_milli / self.total_cpu_milli
        return max(gpu, cpu) / vc.weight

    def _shape_key(self, job: Job) -> tuple[object, ...]:
        spec = job.spec
        return (spec.vc, spec.priority, spec.member.shape, spec.members, spec.minimum, spec.topology,
                job.preemptions >= self.options.max_preemptions)

    # ================================================================== starting a job
    def _removed_vc_reason(self, job: Job) -> str:
        return (f"virtual cluster {job.vc!r} was removed by a configuration reload "
                f"(known: {', '.join(self.tenants.names) or 'none'})")

    def _try_start(self, job: Job, now: float, result: CycleResult) -> bool:
        spec = job.spec
        vc = self.tenants.get(spec.vc)
        if vc is None:  # requeued (node failure, eviction) after its VC was removed
            self._dequeue(job)
            self._release_admission(job)
            self._reject(job, self._removed_vc_reason(job))
            return True
        if spec.opportunistic:
            return self._try_scavenge(job, now, result, JobClass.OPPORTUNISTIC)
        if not spec.member.wants_gpu:
            return self._start_anywhere(job, now, result, JobClass.GUARANTEED)
        reason = self._never_guaranteed(vc, spec)
        if reason is None:
            room = self._guarantee_room(vc, job)
            if spec.min_gpu_milli <= room:
                if self._try_guaranteed(job, vc, now, result, room):
                    return True
            elif self._try_priority_preemption(job, vc, now, result):
                return True
        else:
            job.wait_reason = reason
        guaranteed_reason = job.wait_reason
        if not self.options.borrowing:
            job.wait_reason = guaranteed_reason + "; this policy does not borrow idle capacity"
            return False
        if job.preemptions >= self.options.max_preemptions:
            job.wait_reason = (f"{guaranteed_reason}; preempted {job.preemptions} times, so it now waits for "
                               "guaranteed capacity instead of borrowing")
            return False
        if job.name in self._admitted:
            return False  # admitted against its quota: it waits for a placement, it does not borrow
        if not self.options.cells:
            # A quota cohort lends only quota nobody holds: admitted-but-unplaced jobs keep theirs.
            held = sum(u.total_milli + u.admitted_milli for u in self.usage.values())
            if held + spec.min_gpu_milli > sum(v.guaranteed_milli for v in self.tenants.vcs):
                job.wait_reason = f"{guaranteed_reason}; no unused quota left in the cohort to borrow"
                return False
        limit = vc.borrow_limit_milli
        if limit is not None and self.usage[vc.name].borrowed_milli + spec.min_gpu_milli > limit:
            job.wait_reason = (f"{guaranteed_reason}; VC {vc.name} borrowing limit reached "
                               f"({self.usage[vc.name].borrowed_milli / 1000:g} of {limit / 1000:g} GPUs)")
            return False
        if self._try_scavenge(job, now, result, JobClass.BORROWED):
            return True
        job.wait_reason = f"{guaranteed_reason}; no idle capacity to borrow: {job.wait_reason}"
        return False

    def _effective_guarantee(self, vc: VirtualCluster) -> int:
        if not self.options.cells:
            return vc.guaranteed_milli
        return vc.guaranteed_milli - self.tenancy.doomed_gpus(vc.name) * 1000

    def _guarantee_room(self, vc: VirtualCluster, job: Job | None = None) -> int:
        """Guarantee not yet used by running guaranteed work or held by admitted jobs (other than ``job``)."""
        usage = self.usage[vc.name]
        own = self._admitted.get(job.name, 0) if job is not None else 0
        return self._effective_guarantee(vc) - usage.guaranteed_milli - usage.admitted_milli + own

    def _never_guaranteed(self, vc: VirtualCluster, spec: JobSpec) -> str | None:
        """Why this job can never run inside its VC's guarantee (None if it can)."""
        need = spec.min_gpu_milli
        if need > vc.guaranteed_milli:
            return f"VC {vc.name} guarantees {vc.guaranteed_gpus} GPUs; the job needs {need / 1000:g}"
        if not self.options.cells:
            return None
        level = self._container_level(spec)
        member_models = spec.member.gpu_models
        for (chain_name, cell_level), _ in {**vc.demand, **self._pinned_types(vc)}.items():
            chain = self.forest.chains[chain_name]
            if member_models is not None and chain.model not in member_models:
                continue
            if self._cell_holds(chain.sizes[cell_level], cell_level, chain, spec, level):
                return None
        return (f"VC {vc.name} has no cell type that holds this job "
                f"({spec.minimum} x {spec.member.gpu_count} GPU"
                + (f" within one {spec.topology.name.lower()}" if spec.topology else "") + ")")

    def guarantee_could_hold(self, vc: VirtualCluster, spec: JobSpec) -> bool:
        """Could this job ever run inside the VC's guarantee (size and cell shapes permitting)?"""
        return self._never_guaranteed(vc, spec) is None

    def _pinned_types(self, vc: VirtualCluster) -> dict[tuple[str, int], int]:
        types: dict[tuple[str, int], int] = {}
        for cell_id in vc.pinned:
            cell = self.forest.by_id[cell_id]
            types[(cell.chain.name, cell.level)] = types.get((cell.chain.name, cell.level), 0) + 1
        return types

    @staticmethod
    def _container_level(spec: JobSpec) -> TopologyLevel:
        if spec.topology is not None and spec.topology >= TopologyLevel.RACK and spec.members > 1:
            return TopologyLevel.RACK
        if spec.topology == TopologyLevel.NODE and spec.members > 1:
            return TopologyLevel.NODE
        return TopologyLevel.GPU

    @staticmethod
    def _cell_holds(size: int, cell_level: int, chain: CellChain, spec: JobSpec, level: TopologyLevel) -> bool:
        """Could a cell of this type hold the job's container (per member, one node, or one rack)?"""
        kind = chain.kinds[cell_level]
        member_gpus = spec.member.gpu_count
        if member_gpus > min(size, chain.node_gpus):
            return False
        if level == TopologyLevel.RACK:
            return kind == "rack" and size >= spec.minimum * member_gpus
        if level == TopologyLevel.NODE:
            return (kind != "rack" and size >= spec.minimum * member_gpus) or (
                kind == "rack" and chain.node_gpus >= spec.minimum * member_gpus)
        return True

    # ------------------------------------------------------------------ regions
    def _mask_of(self, cells: Iterable[Cell]) -> BoolArray:
        """GPU mask of some cells (built from their index lists; no per-cell cache, which would cost
        nodes x GPUs bytes per cell on large clusters)."""
        mask = np.zeros((self.book.size, self.book.max_gpus), np.bool_)
        gpus = [gpu for cell in cells for gpu in cell.gpus]
        if gpus:
            rows, cols = zip(*gpus, strict=True)
            mask[list(rows), list(cols)] = True
        return mask

    def _owned_mask(self, vc: VirtualCluster, models: frozenset[str] | None) -> BoolArray:
        """GPUs of every cell bound to the VC (of the allowed models)."""
        mask: BoolArray = self.tenancy.owner == self.tenancy.vc_index[vc.name]
        if models is not None:
            allowed = np.array([name in models for name in self.book.model_names], np.bool_)
            mask &= allowed[self.book.model_id][:, None]
        return mask

    def _reserved_for_others(self, job: Job) -> BoolArray | None:
        """GPUs held for starving jobs that ``job`` must leave alone. A reservation never blocks another
        VC's guaranteed work: it only holds back borrowed and opportunistic work, and work of its own VC."""
        if not self.reservations:
            return None
        others = [mask for name, mask in self.reservations.items()
                  if name != job.name and (job.job_class_hint != JobClass.GUARANTEED or self.jobs[name].vc == job.vc)]
        if not others:
            return None
        combined = others[0].copy()
        for mask in others[1:]:
            combined |= mask
        return combined

    def _allowed(self, region: _Region, job: Job) -> BoolArray | None:
        blocked = self._reserved_for_others(job)
        if blocked is None:
            return region.mask
        base = region.mask if region.mask is not None else np.ones_like(blocked)
        return base & ~blocked

    def _guaranteed_regions(self, vc: VirtualCluster, spec: JobSpec) -> list[_Region]:
        """Candidate regions for a guaranteed job, best first: the VC's bound cells, then free cells it may
        bind, preferring cells that split no free parent (buddy allocation) and hold the least borrowed
        work (fewest victims). Masks of new cells are built only when a candidate is tried."""
        if not self.options.cells:
            return [_Region(None, label="cluster")]
        models = spec.member.gpu_models
        bound = [c for c in self.tenancy.bound_cells(vc.name) if models is None or c.chain.model in models]
        level = self._container_level(spec)
        regions: list[_Region] = []
        if bound:
            if level == TopologyLevel.GPU:
                regions.append(_Region(self._owned_mask(vc, models), bound=True, label=f"{vc.name}'s bound cells"))
            else:
                for cell in bound:
                    if self._cell_holds(cell.size, cell.level, cell.chain, spec, level):
                        regions.append(_Region(self._mask_of([cell]), bound=True, label=cell.id))
        candidates = self._bindable_candidates(vc, spec, level, models)
        regions.extend(candidates)
        if level == TopologyLevel.GPU and spec.members > 1 and len(candidates) > 1:
            # Members may spread over several cells: add the VC's bound cells plus as many new cells
            # as the whole gang needs (each binding is checked for safety when the region is tried).
            need = spec.members * max(spec.member.gpu_count, 1) - self._bound_free(vc, spec)
            chosen: list[Cell] = []
            free_total = 0
            for candidate in candidates:
                if free_total >= need:
                    break
                chosen.extend(candidate.binds)
                free_total += candidate.free_gpus
            if len(chosen) > 1:
                regions.insert(len(regions) - len(candidates),
                               _Region(None, binds=tuple(chosen), label="+".join(c.id for c in chosen),
                                       free_gpus=free_total, preference=(1, 0, 0)))
        return regions

    def _bindable_candidates(self, vc: VirtualCluster, spec: JobSpec, level: TopologyLevel,
                             models: frozenset[str] | None) -> list[_Region]:
        """The best free cells the VC may bind for this job, at most ``CANDIDATE_CELLS`` of them: least
        occupied by borrowed work first (fewest victims), then cells whose parent is already split
        (buddy allocation keeps whole parents free), then by name. Scored with array operations per
        cell type, so a cluster of thousands of free nodes costs little per decision."""
        scored: list[tuple[int, int, str, Cell, int]] = []
        for (chain_name, cell_level), count in self.tenancy.remaining(vc.name).items():
            chain = self.forest.chains[chain_name]
            if count <= 0 or (models is not None and chain.model not in models):
                continue
            if not self._cell_holds(chain.sizes[cell_level], cell_level, chain, spec, level):
                continue
            cells, flags, rows, cols, parent_free = self.tenancy.type_arrays(chain.type_name(cell_level))
            index = np.flatnonzero(flags)
            if index.size == 0:
                continue
            free = self.book.gpu_full[rows[index], cols[index]].sum(axis=1)
            split = parent_free[index].astype(np.int64)
            occupancy = chain.sizes[cell_level] - free
            order = np.lexsort((index, split, occupancy))[:CANDIDATE_CELLS]
            scored.extend((int(occupancy[i]), int(split[i]), cells[index[i]].id, cells[index[i]], int(free[i]))
                          for i in order)
        scored.sort(key=lambda item: item[:3])
        return [_Region(None, binds=(cell,), label=cell_id, free_gpus=free, preference=(1, occupancy, split))
                for occupancy, split, cell_id, cell, free in scored[:CANDIDATE_CELLS]]

    def _region_mask(self, region: _Region, vc: VirtualCluster, spec: JobSpec) -> BoolArray | None:
        """Materialise a candidate's GPU mask (a new cell, plus the VC's bound cells for per-member jobs)."""
        if region.mask is not None or not region.binds:
            return region.mask
        mask = self._mask_of(region.binds)
        if self._container_level(spec) == TopologyLevel.GPU:
            mask |= self._owned_mask(vc, spec.member.gpu_models)
        region.mask = mask
        return region.mask

    def _can_bind_all(self, vc: str, cells: Sequence[Cell]) -> bool:
        """Could the VC bind all these cells, one after the other, keeping every guarantee safe?"""
        if len(cells) == 1:
            return self.tenancy.can_bind(vc, cells[0])
        done: list[Cell] = []
        try:
            for cell in cells:
                if not self.tenancy.can_bind(vc, cell):
                    return False
                self.tenancy.bind(vc, cell)
                done.append(cell)
            return True
        finally:
            for cell in reversed(done):
                self.tenancy.unbind(cell)

    def _bound_free(self, vc: VirtualCluster, spec: JobSpec) -> int:
        """Completely free GPUs in the VC's bound cells (they join a new cell for per-member jobs)."""
        if self._container_level(spec) != TopologyLevel.GPU:
            return 0
        mask = self.tenancy.owner == self.tenancy.vc_index[vc.name]
        return int((self.book.gpu_full & mask).sum())

    # ------------------------------------------------------------------ guaranteed placement
    def _plan(self, job: Job, region: _Region, most: int | None = None, least: int | None = None) -> GangPlan | None:
        domain = self.zone_of if job.spec.topology == TopologyLevel.ZONE else self.rack_of
        return plan_gang(self.book, job.spec, most=most, least=least, allowed=self._allowed(region, job),
                         domain_of=domain)

    def _try_guaranteed(self, job: Job, vc: VirtualCluster, now: float, result: CycleResult, room: int,
                        extra_victims: Sequence[Job] = ()) -> bool:
        spec = job.spec
        job.job_class_hint = JobClass.GUARANTEED
        most = max(spec.minimum, min(spec.members, room // max(spec.gpu_milli_per_member, 1)))
        regions = self._guaranteed_regions(vc, spec)
        if not regions:
            job.wait_reason = f"VC {vc.name} has no free cell that could hold it (all its cells are bound or doomed)"
            return False
        bound_free = self._bound_free(vc, spec) if spec.member.is_whole else 0
        # A threshold gang first looks for room for its whole headcount, then settles for its minimum.
        for least in dict.fromkeys((most, spec.minimum)):
            need_gpus = least * max(spec.member.gpu_count, 1)
            for region in regions:
                if region.binds:
                    if spec.member.is_whole and region.free_gpus + bound_free < need_gpus:
                        continue  # cannot fit without victims; considered below
                    if not self._can_bind_all(vc.name, region.binds):
                        continue
                    self._region_mask(region, vc, spec)
                plan = self._plan(job, region, most, least)
                if plan is not None:
                    self._start(job, plan, region, JobClass.GUARANTEED, now, result, victims=())
                    return True
        if not self.options.topology_aware_reclaim:
            return self._reclaim_by_count(job, vc, now, result, regions[0], most)
        # A victim search that failed is retried after a back-off, or at once when the VC's situation
        # changed (its cells or its guaranteed usage), like kube-scheduler's unschedulable back-off.
        key = self._class_of.get(job.name, (job.name,))
        state = (self.tenancy.version, self.usage[vc.name].guaranteed_milli)
        backoff = self._victim_backoff.get(key)
        if backoff is not None and now < backoff[0] and backoff[1] == state:
            job.wait_reason = self._no_room_reason(job, regions[0], "in its VC's cells")
            return False
        # Reclaim: borrowed and opportunistic work (and lazily downgraded jobs) in the way, chosen by
        # simulating the placement in each candidate region; the cheapest victim set wins.
        best: tuple[tuple[int, int, float], _Region, tuple[Job, ...]] | None = None
        tried = 0
        for region in regions:
            if tried >= self.options.victim_search_regions:
                break
            if region.binds:
                if not self._can_bind_all(vc.name, region.binds):
                    continue
                self._region_mask(region, vc, spec)
            candidates = self._victim_candidates(job, region, extra_victims, now)
            if not candidates:
                continue
            tried += 1
            found = self._victims_for(job, region, candidates, now, most)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], region, found[1])
        if best is None:
            self._victim_backoff[key] = (now + VICTIM_SEARCH_BACKOFF_SECONDS, state)
            job.wait_reason = self._no_room_reason(job, regions[0], "in its VC's cells")
            return False
        _, region, victims = best
        for victim in victims:
            self._evict(victim, now, result, f"preempted by {job.name} (VC {job.vc})")
        plan = self._plan(job, region, most)
        if plan is None:  # pragma: no cover - the simulation said it fits
            job.wait_reason = "waiting for capacity freed by preemption"
            self._dirty = True
            return False
        self._start(job, plan, region, JobClass.GUARANTEED, now, result, victims=victims)
        return True

    def _reclaim_by_count(self, job: Job, vc: VirtualCluster, now: float, result: CycleResult,
                          region: _Region, most: int) -> bool:
        """Quota-style reclaim (Kueue without topology-aware scheduling): the job is *admitted* against
        its VC's quota at once, which reserves the quota so borrowers cannot take it back, and the newest
        borrowed jobs of other VCs are evicted until enough GPUs are free by count, wherever they are.
        The job then starts only if the freed GPUs happen to fit its shape; otherwise it waits, admitted,
        holding quota it cannot use (Kueue #4329: quota admits, placement fails)."""
        if job.name not in self._admitted:
            self._admitted[job.name] = job.spec.min_gpu_milli
            self.usage[vc.name].admitted_milli += job.spec.min_gpu_milli
            need = job.spec.min_gpu_milli - int(self.book.total_avail.sum())
            victims: list[Job] = []
            for other in sorted(self.running.values(),
                                key=lambda j: (-(j.started_at if j.started_at is not None else 0.0), j.name)):
                if need <= 0:
                    break
                if other.job_class in (JobClass.BORROWED, JobClass.OPPORTUNISTIC) and other.vc != vc.name:
                    victims.append(other)
                    need -= other.held_gpu_milli
            for victim in victims:
                self._evict(victim, now, result, f"reclaimed by quota of VC {vc.name} for {job.name}")
        plan = self._plan(job, region, most)
        if plan is None:
            job.wait_reason = ("admitted by quota, but no placement fits its shape: "
                               + self._no_room_reason(job, region, "within its quota"))
            return False
        self._start(job, plan, region, JobClass.GUARANTEED, now, result, victims=())
        return True

    def _release_admission(self, job: Job) -> None:
        milli = self._admitted.pop(job.name, 0)
        if milli:
            self.usage[job.vc].admitted_milli -= milli

    def _victims_for(self, job: Job, region: _Region, candidates: list[Job], now: float,
                     most: int) -> tuple[tuple[int, int, float], tuple[Job, ...]] | None:
        def fits() -> bool:
            return self._plan(job, region, most) is not None

        chosen = select_victims(self.book, fits, candidates, now)
        if chosen is None:
            return None
        return chosen.cost, chosen.jobs

    def _victim_candidates(self, job: Job, region: _Region, extra: Sequence[Job], now: float) -> list[Job]:
        """Jobs that may be evicted for ``job`` and hold GPUs or CPU in the region, cheapest first:
        opportunistic before borrowed, then least GPU-time lost."""
        indexes = [self._opportunistic_on]
        if job.job_class_hint == JobClass.GUARANTEED:
            indexes.append(self._reclaimable_on)  # only guarantees reclaim borrowed work
        names: set[str] = set()
        for index in indexes:
            nodes = np.flatnonzero(region.mask.any(axis=1)).tolist() if region.mask is not None else list(index)
            for node in nodes:
                names |= index.get(node, set())
        out: list[tuple[tuple[int, float, str], Job]] = []
        for other in (self.jobs[n] for n in names):
            if other is job or not self._may_evict(job, other, now, extra):
                continue
            rank = 0 if other.job_class == JobClass.OPPORTUNISTIC else 1
            out.append(((rank, gpu_seconds(other, now), other.name), other))
        out.sort(key=lambda item: item[0])
        return [other for _, other in out]

    def _may_evict(self, preemptor: Job, victim: Job, now: float, extra: Sequence[Job]) -> bool:
        """Opportunistic work yields to everyone; borrowed work yields to guarantees (after the reclaim
        minimum runtime); a job preempted ``max_preemptions`` times is protected."""
        if victim.phase != JobPhase.RUNNING:
            return False
        if victim.job_class == JobClass.OPPORTUNISTIC:
            return True
        if preemptor.job_class_hint == JobClass.OPPORTUNISTIC:
            return False
        if victim.preemptions >= self.options.max_preemptions:
            return False
        if victim.job_class == JobClass.BORROWED and preemptor.job_class_hint == JobClass.GUARANTEED:
            started = victim.started_at if victim.started_at is not None else now
            if now - started < self.options.reclaim_min_runtime_seconds:
                self._wake_later(started + self.options.reclaim_min_runtime_seconds)
                return False
            return True
        return victim in extra

    def _try_priority_preemption(self, job: Job, vc: VirtualCluster, now: float, result: CycleResult) -> bool:
        """The VC's guarantee is full: downgrade lower-priority guaranteed jobs of the same VC. With lazy
        preemption their cells are released, so the preemptor may bind idle cells instead, and a victim
        dies only if its GPUs are needed; without it (HiveD's default) every chosen victim is killed."""
        spec = job.spec
        need = spec.min_gpu_milli - self._guarantee_room(vc)
        priorities = self._guaranteed_priorities.get(vc.name, Counter())
        if not any(count > 0 and priority < spec.priority for priority, count in priorities.items()):
            used = self.usage[vc.name].guaranteed_milli / 1000
            job.wait_reason = (f"VC {vc.name} guarantee in use ({used:g} of {self._effective_guarantee(vc) / 1000:g} "
                               "GPUs) by work of equal or higher priority")
            return False
        lower = [j for j in (self.jobs[n] for n in self._guaranteed_of.get(vc.name, ()))
                 if j.spec.priority < spec.priority]
        eligible: list[Job] = []
        protected_until: float | None = None
        for other in lower:
            started = other.started_at if other.started_at is not None else now
            if other.preemptions >= self.options.max_preemptions:
                continue
            if now - started < vc.min_runtime_seconds:
                until = started + vc.min_runtime_seconds
                protected_until = until if protected_until is None else min(protected_until, until)
                continue
            eligible.append(other)
        eligible.sort(key=lambda j: (j.spec.priority, -(j.started_at if j.started_at is not None else 0.0), j.name))
        chosen: list[Job] = []
        for victim in eligible:
            if need <= 0:
                break
            chosen.append(victim)
            need -= victim.held_gpu_milli
        used = self.usage[vc.name].guaranteed_milli / 1000
        total = self._effective_guarantee(vc) / 1000
        if need > 0:
            if protected_until is not None:
                self._wake_later(protected_until)
                job.wait_reason = (f"VC {vc.name} guarantee in use ({used:g} of {total:g} GPUs); its lower-priority "
                                   f"jobs are protected by minRuntime until t={protected_until:g}")
            else:
                job.wait_reason = (f"VC {vc.name} guarantee in use ({used:g} of {total:g} GPUs) "
                                   "by work of equal or higher priority")
            return False
        for victim in chosen:
            self._downgrade(victim, JobClass.BORROWED)
        if self.options.lazy_preemption:
            self._release_idle_cells()
        job.job_class_hint = JobClass.GUARANTEED
        started = self._try_guaranteed(job, vc, now, result, self._guarantee_room(vc), extra_victims=chosen)
        if not started:
            for victim in chosen:
                if victim.phase == JobPhase.RUNNING and victim.job_class == JobClass.BORROWED:
                    self._upgrade(victim)
                    if self.options.cells:
                        self._adopt_cells(victim)
            return False
        for victim in chosen:
            if victim.phase != JobPhase.RUNNING:
                continue
            if self.options.lazy_preemption:
                victim.lazily_preempted = True
                victim.wait_reason = f"lazily preempted by {job.name}: running as borrowed capacity"
                result.downgraded.append(victim)
            else:
                self._evict(victim, now, result, f"preempted by higher-priority {job.name} (VC {vc.name})")
        return True

    # ------------------------------------------------------------------ borrowed / opportunistic
    def _scavenge_regions(self) -> list[_Region]:
        if not self.options.cells:
            return [_Region(None)]
        unowned = self.tenancy.owner < 0
        return [_Region(unowned, label="unbound cells"), _Region(None, label="cluster")]

    def _try_scavenge(self, job: Job, now: float, result: CycleResult, job_class: JobClass) -> bool:
        job.job_class_hint = job_class
        regions = self._scavenge_regions()
        for region in regions:
            plan = self._plan(job, region)
            if plan is not None:
                self._start(job, plan, region, job_class, now, result, victims=())
                return True
        if job_class == JobClass.BORROWED:
            region = regions[-1]
            candidates = self._victim_candidates(job, region, (), now)
            if candidates:
                chosen = self._victims_for(job, region, candidates, now, job.spec.members)
                if chosen is not None:
                    for victim in chosen[1]:
                        self._evict(victim, now, result, f"opportunistic work reclaimed by {job.name}")
                    plan = self._plan(job, region)
                    if plan is not None:
                        self._start(job, plan, region, job_class, now, result, victims=chosen[1])
                        return True
        job.wait_reason = self._no_room_reason(job, regions[-1], "on idle capacity")
        return False

    def _start_anywhere(self, job: Job, now: float, result: CycleResult, job_class: JobClass) -> bool:
        region = _Region(None)
        plan = self._plan(job, region)
        if plan is None:
            job.wait_reason = self._no_room_reason(job, region, "anywhere")
            return False
        self._start(job, plan, region, job_class, now, result, victims=())
        return True

    def _no_room_reason(self, job: Job, region: _Region | None, where: str) -> str:
        spec = job.spec
        allowed = self._allowed(region, job) if region is not None else None
        cap = member_capacity(self.book, spec.member_request(0), allowed)
        best = int(cap.max(initial=0))
        shape = (f"{spec.member.gpu_count} GPU" if spec.member.is_whole
                 else f"{spec.member.gpu_milli} milli-GPU" if spec.member.wants_gpu else "CPU")
        what = f"{spec.minimum} member(s) of {shape}"
        if spec.topology is not None and spec.members > 1:
            what += f" within one {spec.topology.name.lower()}"
        blocked = " (some capacity is reserved for starving jobs)" if self._reserved_for_others(job) is not None else ""
        return f"needs {what} {where}; the roomiest node takes {best} member(s) now{blocked}"

    # ------------------------------------------------------------------ state changes
    def _start(self, job: Job, plan: GangPlan, region: _Region, job_class: JobClass, now: float,
               result: CycleResult, victims: Sequence[Job]) -> None:
        self._release_admission(job)
        for cell in region.binds:
            self.tenancy.bind(job.vc, cell)
        try:
            allocations = commit(self.book, job.spec, plan, allowed=self._allowed(region, job))
        except AllocationError:
            for cell in reversed(region.binds):
                self.tenancy.unbind(cell)
            raise
        if len(region.binds) > 1:
            used = {(self.book.index[a.node], g) for a in allocations for g in a.gpu_indices}
            for cell in reversed(region.binds):
                if not any(gpu in used for gpu in cell.gpus):
                    self.tenancy.unbind(cell)
        job.running_members = [a.name for a in allocations]
        for allocation in allocations:
            self.owner_of[allocation.name] = job.name
        job.job_class = job_class
        job.job_class_hint = job_class
        job.phase = JobPhase.RESERVED if victims else JobPhase.RUNNING
        if victims:
            self._reserved.add(job.name)
        job.reserved_until = now + self.options.reservation_timeout_seconds if victims else None
        job.started_at = now
        if job.first_started_at is None:
            job.first_started_at = now
        job.wait_reason = f"running ({job_class.value}) since {now:g}"
        self._account(job, +1)
        self._dequeue(job)
        self.reservations.pop(job.name, None)
        self.running[job.name] = job
        if job.size < job.spec.members:
            self._growable.add(job.name)
        result.started.append(job)

    def _account(self, job: Job, sign: int) -> None:
        usage = self.usage.setdefault(job.vc, VcUsage())
        milli = job.held_gpu_milli * sign
        if job.job_class == JobClass.GUARANTEED:
            usage.guaranteed_milli += milli
            members = self._guaranteed_of.setdefault(job.vc, set())
            priorities = self._guaranteed_priorities.setdefault(job.vc, Counter())
            if sign > 0:
                members.add(job.name)
                priorities[job.spec.priority] += 1
            else:
                members.discard(job.name)
                priorities[job.spec.priority] -= 1
            touched: list[tuple[int, int]] = []
            for name in job.running_members:
                allocation = self.book.allocations[name]
                node = self.book.index[allocation.node]
                for gpu in allocation.gpu_indices:
                    self.guaranteed_use[node, gpu] += sign
                    touched.append((node, gpu))
            if sign < 0 and self.options.cells:
                self._maybe_idle |= self.tenancy.cells_touching(touched)
        else:
            if job.job_class == JobClass.BORROWED:
                usage.borrowed_milli += milli
            else:
                usage.opportunistic_milli += milli
            index = self._reclaimable_on if job.job_class == JobClass.BORROWED else self._opportunistic_on
            for name in job.running_members:
                holders = index.setdefault(self.book.index[self.book.allocations[name].node], set())
                if sign > 0:
                    holders.add(job.name)
                else:
                    holders.discard(job.name)
        usage.cpu_milli += job.spec.member.cpu_milli * len(job.running_members) * sign

    def _stop(self, job: Job) -> None:
        self._account(job, -1)
        for name in job.running_members:
            self.book.release(name)
            self.owner_of.pop(name, None)
        job.running_members = []
        self.running.pop(job.name, None)
        self._growable.discard(job.name)
        self._dirty = True

    def _requeue(self, job: Job, now: float, reason: str) -> None:
        job.phase = JobPhase.PENDING
        job.job_class = None
        job.started_at = None
        job.lazily_preempted = False
        job.wait_reason = reason
        self._enqueue(job, now)

    def _evict(self, job: Job, now: float, result: CycleResult, reason: str) -> None:
        self._stop(job)
        job.preemptions += 1
        self._requeue(job, now, reason)
        result.evicted.append(job)

    def _downgrade(self, job: Job, job_class: JobClass) -> None:
        self._account(job, -1)
        job.job_class = job_class
        job.job_class_hint = job_class
        self._account(job, +1)

    def _upgrade(self, job: Job) -> None:
        self._downgrade(job, JobClass.GUARANTEED)
        job.lazily_preempted = False

    def _reject(self, job: Job, reason: str) -> Job:
        job.phase = JobPhase.REJECTED
        job.wait_reason = reason
        self.rejected.append(job)
        return job

    def _cell_has_guaranteed(self, cell: Cell) -> bool:
        return any(self.guaranteed_use[node, gpu] > 0 for node, gpu in cell.gpus)

    def _release_idle_cells(self, everything: bool = False) -> None:
        """Unbind preassigned cells no guaranteed job uses any more (HiveD frees bindings when idle)."""
        if not self.options.cells:
            return
        cells = list(self.tenancy.binding) if everything else list(self._maybe_idle)
        self._maybe_idle.clear()
        for cell in cells:
            if (cell in self.tenancy.binding and cell not in self.tenancy.pinned
                    and not self._cell_has_guaranteed(cell)):
                self.tenancy.unbind(cell)

    def _adopt_cells(self, job: Job) -> bool:
        """Bind, under the current configuration, cells that cover a running guaranteed job: one cell per
        member (or one for the whole gang when it must share a node or rack) that could have held it.
        Returns False, binding nothing, when some part fits no cell the VC may hold."""
        if not self.options.cells:
            vc = self.tenants.require(job.vc)
            return self.usage[job.vc].guaranteed_milli <= vc.guaranteed_milli
        owner = self.tenancy.vc_index.get(job.vc)
        if owner is None:
            return False
        spec = job.spec
        level = self._container_level(spec)
        members = [[(self.book.index[self.book.allocations[a].node], g) for g in self.book.allocations[a].gpu_indices]
                   for a in job.running_members]
        groups = members if level == TopologyLevel.GPU else [[gpu for member in members for gpu in member]]
        bound_now: list[Cell] = []
        for group in groups:
            if not group:
                continue
            wanted = set(group)
            cell: Cell | None = self.forest.gpu_cell.get(group[0])
            while cell is not None and not wanted.issubset(cell.gpus):
                cell = cell.parent
            while cell is not None:
                holder = self.tenancy.cell_bound_above(cell)
                if holder is not None and self.tenancy.binding[holder] == job.vc:
                    break
                if (holder is None and self._cell_holds(cell.size, cell.level, cell.chain, spec, level)
                        and self.tenancy.can_bind(job.vc, cell)):
                    self.tenancy.bind(job.vc, cell)
                    bound_now.append(cell)
                    break
                cell = cell.parent
            if cell is None:
                for done in reversed(bound_now):
                    self.tenancy.unbind(done)
                return False
        return True

    def _cluster_could_hold(self, spec: JobSpec) -> bool:
        member = spec.member_request(0)
        per_node = np.full(self.book.size, 1 << 30, np.int64)
        if member.cpu_milli:
            per_node = np.minimum(per_node, self.book.cpu_capacity // member.cpu_milli)
        if member.memory_mib:
            per_node = np.minimum(per_node, self.book.mem_capacity // member.memory_mib)
        if member.wants_gpu:
            present = self.book.gpu_present.sum(axis=1)
            gpu_cap = present // member.gpu_count if member.is_whole else present * (1000 // max(member.gpu_milli, 1))
            per_node = np.minimum(per_node, gpu_cap)
        level = spec.topology
        if level is not None and spec.members > 1 and level >= TopologyLevel.NODE:
            if level == TopologyLevel.NODE:
                return int(per_node.max(initial=0)) >= spec.minimum
            domain = self.zone_of if level == TopologyLevel.ZONE else self.rack_of
            if level >= TopologyLevel.CLUSTER:
                return int(per_node.sum()) >= spec.minimum
            sums = np.bincount(domain, weights=per_node)
            return float(sums.max(initial=0)) >= spec.minimum
        return int(per_node.sum()) >= spec.minimum

    # ------------------------------------------------------------------ reservations and growth
    def _expire_reservations(self, now: float) -> None:
        for name in list(self._reserved):
            job = self.jobs[name]
            if job.phase != JobPhase.RESERVED:
                self._reserved.discard(name)
            elif job.reserved_until is not None and now > job.reserved_until:
                self._reserved.discard(name)
                self._stop(job)
                self._requeue(job, now, "reservation timed out before the job was bound; requeued")

    def _maybe_reserve(self, job: Job, now: float) -> None:
        threshold = self.options.starvation_seconds
        if threshold is None or job.name in self.reservations:
            return
        since = self.pending_since.get(job.name, now)
        if now - since < threshold:
            self._wake_later(since + threshold)
            return
        if len(self.reservations) >= self.options.max_reservations:
            return
        mask = self._reservation_region(job)
        if mask is not None:
            self.reservations[job.name] = mask
            job.wait_reason += f"; holding a reservation since {now:g} (starvation backstop)"

    def _reservation_region(self, job: Job) -> BoolArray | None:
        """The nodes the job should wait for: the ones holding the most GPUs free or reclaimable soonest,
        as few as cover the job, inside one rack when the job needs one."""
        spec = job.spec
        member = spec.member_request(0)
        per_node = member_capacity(self.book, member, None)
        gpus = self.book.gpu_count.astype(np.float64)
        candidates = np.flatnonzero(gpus >= max(member.gpu_count, 1))
        if member.gpu_models is not None:
            candidates = candidates[model_mask(self.book, member)[candidates]]
        if candidates.size == 0:
            return None
        if spec.topology is not None and spec.topology >= TopologyLevel.RACK and spec.members > 1:
            racks = self.rack_of[candidates]
            best_rack = max(set(racks.tolist()), key=lambda r: (per_node[candidates[racks == r]].sum(), -r))
            candidates = candidates[racks == best_rack]
        order = candidates[np.lexsort((candidates, -per_node[candidates]))]
        per_member = max(member.gpu_count, 1)
        need = spec.minimum * per_member
        chosen: list[int] = []
        total = 0
        for node in order:
            chosen.append(int(node))
            total += int(self.book.gpu_count[node]) // per_member * per_member
            if total >= need or (spec.topology == TopologyLevel.NODE and spec.members > 1):
                break
        mask = np.zeros((self.book.size, self.book.max_gpus), np.bool_)
        mask[np.array(chosen, np.int64)] = self.book.gpu_present[np.array(chosen, np.int64)]
        return mask

    def _grow(self, now: float, result: CycleResult) -> None:
        for name in sorted(self._growable):
            job = self.jobs[name]
            spec = job.spec
            if job.size >= spec.members:
                self._growable.discard(name)
                continue
            if job.phase != JobPhase.RUNNING:
                continue
            nodes = {self.book.index[self.book.allocations[a].node] for a in job.running_members}
            mask = np.zeros((self.book.size, self.book.max_gpus), np.bool_)
            if spec.topology == TopologyLevel.NODE:
                scope = list(nodes)
            elif spec.topology is not None and spec.topology >= TopologyLevel.RACK:
                scope = np.flatnonzero(np.isin(self.rack_of, self.rack_of[list(nodes)])).tolist()
            else:
                scope = list(range(self.book.size))
            mask[scope] = True
            if job.job_class == JobClass.GUARANTEED:
                vc = self.tenants.require(job.vc)
                room = self._guarantee_room(vc) // max(spec.gpu_milli_per_member, 1)
                extra_most = min(spec.members - job.size, room)
            else:
                extra_most = spec.members - job.size
            if extra_most <= 0:
                continue
            fresh: list[Cell] = []
            if job.job_class == JobClass.GUARANTEED and self.options.cells:
                # Grow inside the VC's bound cells, binding free cells of the VC (safely) as needed.
                fresh = self._bind_for_growth(job, scope, extra_most)
                mask &= self.tenancy.owner == self.tenancy.vc_index[job.vc]
            plan = plan_gang(self.book, spec, most=extra_most, least=1, allowed=mask, domain_of=self.rack_of)
            if plan is None:
                for cell in reversed(fresh):
                    self.tenancy.unbind(cell)
                continue
            self._account(job, -1)
            allocations = commit(self.book, spec, plan, allowed=mask, first_index=self._next_index(job))
            if fresh:
                used = {(self.book.index[a.node], g) for a in allocations for g in a.gpu_indices}
                for cell in reversed(fresh):
                    if not any(gpu in used for gpu in cell.gpus):
                        self.tenancy.unbind(cell)
            job.running_members.extend(a.name for a in allocations)
            for allocation in allocations:
                self.owner_of[allocation.name] = job.name
            self._account(job, +1)
            if job.size >= spec.members:
                self._growable.discard(name)
            result.grown.append(job)

    def _bind_for_growth(self, job: Job, scope: Sequence[int], members: int) -> list[Cell]:
        """Bind free cells of the job's VC inside ``scope`` until they could hold ``members`` more."""
        spec = job.spec
        vc = self.tenants.require(job.vc)
        in_scope = set(scope)
        need = members * max(spec.member.gpu_count, 1) - self._bound_free(vc, spec)
        bound: list[Cell] = []
        for region in self._guaranteed_regions(vc, spec):
            if need <= 0:
                break
            if len(region.binds) != 1 or not in_scope.issuperset(region.binds[0].nodes):
                continue
            cell = region.binds[0]
            if self.tenancy.can_bind(job.vc, cell):
                self.tenancy.bind(job.vc, cell)
                bound.append(cell)
                need -= region.free_gpus
        return bound

    @staticmethod
    def _next_index(job: Job) -> int:
        used = {int(name.rsplit("/", 1)[1]) for name in job.running_members}
        index = 0
        while index in used:
            index += 1
        return index

    # ================================================================== queries
    def next_wake(self) -> float | None:
        """When a time-based rule (minimum runtime, starvation threshold) next needs a cycle."""
        return self._wake_at

    def explain(self, name: str) -> str:
        job = self.jobs.get(name)
        if job is None:
            return f"no job named {name!r}"
        return f"{job.name}: {job.phase.value}: {job.wait_reason}"

    def status(self) -> dict[str, dict[str, float]]:
        """Per VC: guaranteed, doomed, and used GPUs by class."""
        out: dict[str, dict[str, float]] = {}
        for vc in self.tenants.vcs:
            usage = self.usage[vc.name]
            out[vc.name] = {
                "guaranteed_gpus": vc.guaranteed_gpus,
                "doomed_gpus": self.tenancy.doomed_gpus(vc.name) if self.options.cells else 0,
                "guaranteed_used_gpus": usage.guaranteed_milli / 1000,
                "borrowed_gpus": usage.borrowed_milli / 1000,
                "opportunistic_gpus": usage.opportunistic_milli / 1000,
                "bound_cells": len(self.tenancy.bound_cells(vc.name)),
            }
        return out

    def counts(self) -> Counter[str]:
        return Counter(job.phase.value for job in self.jobs.values())
