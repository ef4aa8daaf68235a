"""The starvation backstop: nodes held for jobs that have waited too long.

A job pending longer than ``starvation_seconds`` reserves the nodes it needs (the ones that take the
most of it now, then the ones with the least work it must wait out, as few as cover it, inside one rack
when it needs one) among the nodes it can use and no other reservation holds: a job its guarantee could hold reserves
inside its VC's cells (bound, or free and bindable), where it will run; a job that can only borrow
reserves anywhere. From then on borrowed and opportunistic work, growth included, and work of its own
VC stop landing there; a job its guarantee could hold also holds the guarantee room it needs, so the
VC's other work borrows instead of starting inside it (otherwise the node drains and the job still
lacks the room). The region drains and the job starts (Volcano #13: large jobs starved by a stream of
small ones, here including the VC's own small jobs refilling its cells). A reservation never blocks
another VC's guaranteed work: a guarantee is a promise, a reservation a backstop. Each VC holds at most
``max_reservations`` at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.attempt import Attempt
from kubecell.core.engine.capacity import empty_capacity, member_capacity
from kubecell.core.engine.hetero import hardness
from kubecell.core.engine.job import Job, JobClass
from kubecell.core.engine.options import EngineOptions
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel


class Reservations:
    def __init__(self, book: AllocationBook, options: EngineOptions, rack_of: IntArray) -> None:
        self.book = book
        self.options = options
        self.rack_of = rack_of
        self.held: dict[str, BoolArray] = {}  # job -> the nodes held for it
        self.since: dict[str, float] = {}
        self.room: dict[str, int] = {}  # job -> guarantee (milli-GPU) held for it, when its guarantee holds it
        self.version = 0  # bumped whenever a reservation is made or dropped
        self._shadow_key: tuple[int, int, str] | None = None
        self._shadow: float | None = None

    def __contains__(self, name: object) -> bool:
        return name in self.held

    def drop(self, name: str) -> None:
        if name in self.held:
            self.version += 1
        self.held.pop(name, None)
        self.since.pop(name, None)
        self.room.pop(name, None)

    def room_held(self, vc: str, jobs: Mapping[str, Job], besides: Job | None = None) -> int:
        """Guarantee of ``vc`` held for its starving jobs (other than ``besides``): the VC's other work
        may not start inside it, or the starving job would drain a node and still lack the room."""
        return sum(milli for name, milli in self.room.items()
                   if jobs[name].vc == vc and (besides is None or name != besides.name))

    def note(self, name: str) -> str:
        """What a waiting job's reason adds while it holds a reservation."""
        since = self.since.get(name)
        return "" if since is None else f"; holding a reservation since {since:g} (starvation backstop)"

    def blocking(self, attempt: Attempt, jobs: Mapping[str, Job]) -> BoolArray | None:
        """Nodes ``attempt`` must leave alone: other jobs' reservations, unless it starts guaranteed work
        and the starving job belongs to another VC, or it backfills (``backfills``)."""
        if not self.held:
            return None
        blocked: BoolArray | None = None
        for name, nodes in self.held.items():
            if name == attempt.job.name:
                continue
            if attempt.job_class == JobClass.GUARANTEED and jobs[name].vc != attempt.job.vc:
                continue
            if self.backfills(attempt, name, jobs):
                continue
            blocked = nodes.copy() if blocked is None else blocked | nodes
        return blocked

    def backfills(self, attempt: Attempt, name: str, jobs: Mapping[str, Job]) -> bool:
        """EASY backfill by history (``EngineOptions.backfill_margin``): the job may use the nodes held for
        ``name`` when, by the run times its history gives, it ends before that region drains: ``now + margin x
        its expected run time`` is no later than the last expected end of the jobs running there. Unknown if
        any of them (or the job) has no estimate: then it waits, as without backfill. The margin pays for a
        median's error: a backfilled job that overruns delays the starving one it was let past."""
        margin = self.options.backfill_margin
        expected = attempt.job.spec.expected_seconds
        if margin is None or expected is None:
            return False
        drained = self._drained_by(name, jobs)
        return drained is not None and attempt.now + margin * expected <= drained

    def _drained_by(self, name: str, jobs: Mapping[str, Job]) -> float | None:
        """When the jobs running on the nodes held for ``name`` are expected to have ended (None: unknown)."""
        key = (self.book.clock, self.version, name)
        if self._shadow_key == key:
            return self._shadow
        nodes = self.held[name]
        book = self.book
        on_region: set[str] = set()
        for allocation in book.allocations.values():
            if nodes[book.index[allocation.node]]:
                on_region.add(allocation.name.rsplit("/", 1)[0])
        latest: float | None = 0.0
        for job_name in on_region:
            job = jobs.get(job_name)
            if job is None or job.started_at is None or job.spec.expected_seconds is None:
                latest = None  # a job another scheduler placed, or one without history: no shadow time
                break
            latest = max(latest or 0.0, job.started_at + job.spec.expected_seconds)
        self._shadow_key, self._shadow = key, latest
        return latest

    def starving_after(self, job: Job) -> float | None:
        """When the job starts starving (None: never, the backstop is off)."""
        threshold = self.options.starvation_seconds
        if threshold is None:
            return None
        return (job.queued_at or 0.0) + threshold

    def maybe_reserve(self, job: Job, now: float, jobs: Mapping[str, Job],
                      reach_of: Callable[[Job], BoolArray | None],
                      evictable_of: Callable[[], IntArray], allowed: BoolArray | None = None) -> float | None:
        """Reserve nodes for a starving job among ``reach_of(job)`` (None: anywhere) and the ``allowed`` nodes
        (``JobSpec.nodes``: nodes it can never take are never drained for it), and, when its guarantee
        could hold it (a reach is given), the guarantee room it needs. Returns the time to look again when
        it is not starving yet. ``evictable_of()``: GPUs per node held by work the job may evict."""
        starving = self.starving_after(job)
        if starving is None or job.name in self.held:
            return None
        if now < starving:
            return starving
        if sum(1 for name in self.held if jobs[name].vc == job.vc) >= self.options.max_reservations:
            return None
        reach = reach_of(job)
        where = reach if allowed is None else allowed if reach is None else reach & allowed
        nodes = self._region(job, where, evictable_of())
        if nodes is not None:
            self.version += 1
            self.held[job.name] = nodes
            self.since[job.name] = now
            if reach is not None:
                self.room[job.name] = job.min_milli
        return None

    def _region(self, job: Job, reach: BoolArray | None, evictable: IntArray) -> BoolArray | None:
        """The nodes the job should wait for: the ones that take the most members now, then the ones with
        the least work it must wait out (GPUs neither free nor evictable), as few as cover the job when
        empty, inside one rack when the job needs one. A heterogeneous gang is ordered by its hardest
        member and covered group by group (``_covers``)."""
        spec = job.spec
        needs = [(spec.member_request(spec.group_start(p)), c)
                 for p, c in enumerate(spec.first_counts(spec.minimum)) if c]
        member = min((m for m, _ in needs), key=hardness)
        book = self.book
        empty = empty_capacity(book, member)
        now = np.minimum(empty, member_capacity(book, member, None))
        usable = (empty > 0) & book.node_ok
        for nodes in self.held.values():  # never the nodes another starving job is draining
            usable &= ~nodes
        candidates = np.flatnonzero(usable if reach is None else usable & reach)
        if candidates.size == 0:
            return None
        if spec.topology is not None and TopologyLevel.RACK <= spec.topology < TopologyLevel.CLUSTER \
                and spec.members > 1:
            candidates = candidates[self.rack_of[candidates] >= 0]
            if candidates.size == 0:
                return None
            racks = self.rack_of[candidates]
            best_rack = max(set(racks.tolist()), key=lambda r: (now[candidates[racks == r]].sum(), -r))
            candidates = candidates[racks == best_rack]
        # The nodes that take the most members now, then the ones closest to taking one: the fewest GPUs
        # held by work that must end by itself (evictable work goes when the job reclaims it).
        waits = book.gpu_count - book.full_count - evictable if member.is_whole else -book.total_avail
        order = candidates[np.lexsort((candidates, waits[candidates], -now[candidates]))]
        chosen: list[int] = []
        total = 0
        left = [count for _, count in needs]
        empties = [empty_capacity(book, m) for m, _ in needs] if spec.heterogeneous else []
        for node in order:
            chosen.append(int(node))
            if spec.heterogeneous:
                left = self._covers(int(node), needs, empties, left)
                done = not any(left)
            else:
                total += int(empty[node])
                done = total >= spec.minimum
            if done or (spec.topology == TopologyLevel.NODE and spec.members > 1):
                break
        held = np.zeros(book.size, np.bool_)
        held[np.array(chosen, np.int64)] = True
        return held

    def _covers(self, node: int, needs: list[tuple[Request, int]], empties: list[IntArray],
                left: list[int]) -> list[int]:
        """The members per group still uncovered after an empty ``node`` takes what it can, the hardest
        groups first, its CPU, memory and GPUs shared among them (whole GPUs by count, shares by milli)."""
        book = self.book
        cpu, memory = int(book.cpu_capacity[node]), int(book.mem_capacity[node])
        gpus = int(book.gpu_present[node].sum())
        milli = gpus * MILLI_PER_GPU
        out = list(left)
        for position in sorted(range(len(needs)), key=lambda p: hardness(needs[p][0])):
            member = needs[position][0]
            take = min(out[position], int(empties[position][node]))
            if member.cpu_milli:
                take = min(take, cpu // member.cpu_milli)
            if member.memory_mib:
                take = min(take, memory // member.memory_mib)
            if member.is_whole:
                take = min(take, gpus // member.gpu_count)
            elif member.gpu_milli:
                take = min(take, milli // member.gpu_milli)
            take = max(take, 0)
            out[position] -= take
            cpu -= take * member.cpu_milli
            memory -= take * member.memory_mib
            if member.is_whole:
                gpus -= take * member.gpu_count
                milli -= take * member.gpu_count * MILLI_PER_GPU
            elif member.gpu_milli:
                milli -= take * member.gpu_milli
                gpus = min(gpus, milli // MILLI_PER_GPU)
        return out
