"""Victim selection by simulation: whole gangs, fewest first, then least GPU-time lost.

Preempting pod by pod breaks gangs (Volcano #4607: one pod from each of ten gangs, ten failed jobs),
and freeing GPUs by count frees the wrong ones (Kueue #5243). Here victims are whole jobs, tried in cost
order on a snapshot of the allocation book until the preemptor's plan fits, then trimmed: every victim
whose return still lets the plan fit is spared (Volcano #5984 evicted ten pods where one was needed).
Most searches of a busy cluster find nothing, so the search first asks whether the plan would fit with
every candidate gone, and stops there if not. The book is restored afterwards; the caller evicts for real.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kubecell.core.book import AllocationBook
from kubecell.core.engine.job import Job, JobClass
from kubecell.core.errors import AllocationError
from kubecell.core.model import Allocation


@dataclass(frozen=True, slots=True)
class VictimSet:
    jobs: tuple[Job, ...]
    gpu_seconds_lost: float

    @property
    def cost(self) -> tuple[int, int, float]:
        """Compare victim sets: fewest non-opportunistic gangs, then fewest gangs, then least work lost."""
        protected = sum(1 for job in self.jobs if job.job_class != JobClass.OPPORTUNISTIC)
        return (protected, len(self.jobs), self.gpu_seconds_lost)


def gpu_seconds(job: Job, now: float) -> float:
    """Work a job loses if killed now: GPUs held times time since its current run started."""
    started = job.started_at if job.started_at is not None else now  # 0.0 is a valid start time
    return job.held_gpu_milli / 1000.0 * max(now - started, 0.0)


def select_victims(
    book: AllocationBook,
    fits: Callable[[], bool],
    candidates: Sequence[Job],
    now: float,
) -> VictimSet | None:
    """The cheapest sufficient set of ``candidates`` (already in cost order) to make ``fits()`` true."""
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
        for job, allocations in reversed(released[:-1]):
            restored: list[Allocation] = []
            try:
                for allocation in allocations:
                    restored.append(book.allocate(allocation.request, book.index[allocation.node],
                                                  allocation.gpu_indices))
            except AllocationError:
                for allocation in restored:
                    book.release(allocation.name)
                kept.append(job)
                continue
            if not fits():
                for allocation in restored:
                    book.release(allocation.name)
                kept.append(job)
        victims = (released[-1][0], *kept)
        return VictimSet(victims, sum(gpu_seconds(j, now) for j in victims))
    finally:
        book.restore(snapshot)
