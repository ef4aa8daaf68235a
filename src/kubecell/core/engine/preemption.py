"""Victim selection by simulation: whole gangs, fewest first, then least GPU-time lost.

Preempting pod by pod breaks gangs (Volcano #4607: one pod from each of ten gangs, ten failed jobs),
and freeing GPUs by count frees the wrong ones (Kueue #5243). Here victims are whole jobs, tried in cost
order on a snapshot of the allocation book until the preemptor's plan fits, then trimmed: every victim
whose return still lets the plan fit is spared (Volcano #5984 evicted ten pods where one was needed),
and an elastic victim that cannot be spared is shrunk instead where that is enough (its members are
given back oldest first, each one the plan can spare; if they meet its minimums, it runs on with them).
Most searches of a busy cluster find nothing, so the search first asks whether the plan would fit with
every candidate gone, and stops there if not. The book is restored afterwards; the caller evicts for real.
The members above the minimums of elastic jobs are tried on their own first (``shrink.select_shrinks``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kubecell.core.book import AllocationBook
from kubecell.core.engine.job import Job, JobClass, member_index
from kubecell.core.errors import AllocationError
from kubecell.core.model import Allocation

Shrinkable = Callable[[Job], Sequence[str]]
"""A running job's members that may go without stopping it, newest first (``shrink.shrinkable``)."""


@dataclass(frozen=True, slots=True)
class VictimSet:
    jobs: tuple[Job, ...]
    """Evicted whole."""
    gpu_seconds_lost: float
    shrunk: tuple[tuple[Job, tuple[str, ...]], ...] = ()
    """Jobs that run on without these members (allocation names, newest first)."""
    age: int = 0
    """How old the members shrunk are: the sum of their places in their jobs' shrink order (0: newest)."""

    @property
    def cost(self) -> tuple[int, int, int, int, float]:
        """Compare victim sets: fewest non-opportunistic gangs evicted, then fewest gangs evicted (so any set
        that only shrinks comes first), then fewest members shrunk, the newest ones, then least work lost."""
        protected = sum(1 for job in self.jobs if job.job_class != JobClass.OPPORTUNISTIC)
        members = sum(len(names) for _, names in self.shrunk)
        return (protected, len(self.jobs), members, self.age, self.gpu_seconds_lost)


def gpu_seconds(job: Job, now: float) -> float:
    """Work a job loses if killed now: GPUs held times time since its current run started."""
    started = job.started_at if job.started_at is not None else now  # 0.0 is a valid start time
    return job.held_gpu_milli / 1000.0 * max(now - started, 0.0)


def members_seconds(job: Job, names: Sequence[str], now: float) -> float:
    """Work lost by stopping some members of a job now (their charge times the time since its run started)."""
    started = job.started_at if job.started_at is not None else now
    return sum(job.charge_of(name) for name in names) / 1000.0 * max(now - started, 0.0)


def _no_shrink(job: Job) -> Sequence[str]:
    return ()


def select_victims(
    book: AllocationBook,
    fits: Callable[[], bool],
    candidates: Sequence[Job],
    now: float,
    shrinkable: Shrinkable = _no_shrink,
) -> VictimSet | None:
    """The cheapest sufficient set of ``candidates`` (already in cost order) to make ``fits()`` true; a victim
    with ``shrinkable`` members is only shrunk where that is enough."""
    snapshot = book.snapshot()
    released: list[tuple[Job, list[Allocation]]] = []
    try:
        for job in candidates:
            for name in job.running_members:
                if name in book.allocations:
                    book.release(name)
        possible = fits()
    finally:
        book.restore(snapshot)
    if not possible:
        return None
    try:
        found = False
        for job in candidates:
            allocations = [book.allocations[name] for name in job.running_members if name in book.allocations]
            for allocation in allocations:
                book.release(allocation.name)
            released.append((job, allocations))
            if fits():
                found = True
                break
        if not found:
            return None
        # Trim: give back each victim (most recent additions last) if the plan still fits without it.
        kept: list[Job] = []
        shrunk: list[tuple[Job, tuple[str, ...]]] = []
        age = 0
        last = len(released) - 1
        for position in range(last, -1, -1):
            job, allocations = released[position]
            if position < last and give_back(book, fits, allocations):
                continue
            gone = _shrink_instead(book, fits, job, allocations) if shrinkable(job) else None
            if gone is None:
                kept.append(job)
            elif gone:
                shrunk.append((job, gone))
                newest_first = list(reversed(job.running_members))
                age += sum(newest_first.index(name) for name in gone)
        lost = sum(gpu_seconds(j, now) for j in kept) + sum(members_seconds(j, n, now) for j, n in shrunk)
        return VictimSet(tuple(kept), lost, tuple(shrunk), age)
    finally:
        book.restore(snapshot)


def give_back(book: AllocationBook, fits: Callable[[], bool], allocations: Sequence[Allocation]) -> bool:
    """Allocate ``allocations`` again as they were; keep them if the plan still fits, else release them and
    say so (False)."""
    restored: list[Allocation] = []
    try:
        for allocation in allocations:
            restored.append(book.allocate(allocation.request, book.index[allocation.node], allocation.gpu_indices))
    except AllocationError:
        for allocation in restored:
            book.release(allocation.name)
        return False
    if fits():
        return True
    for allocation in restored:
        book.release(allocation.name)
    return False


def _shrink_instead(book: AllocationBook, fits: Callable[[], bool], job: Job,
                    allocations: Sequence[Allocation]) -> tuple[str, ...] | None:
    """An elastic victim the plan needs: give back its members, oldest first, each one the plan can spare.
    The members still gone (newest first), or None when what could be given back does not meet its
    minimums (it is evicted whole, and the book is as before)."""
    kept: list[Allocation] = [a for a in allocations if give_back(book, fits, [a])]
    names = {a.name for a in kept}
    if not job.spec.meets_minimums(job.spec.counts_of(member_index(a.name) for a in kept)):
        for allocation in kept:
            book.release(allocation.name)
        return None
    return tuple(name for name in reversed(job.running_members) if name not in names)
