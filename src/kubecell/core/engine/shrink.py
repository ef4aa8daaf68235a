"""Shrinking elastic jobs: members above a gang's minimum go before any whole job is preempted.

A threshold gang (``min_members < members``) runs with any count between its minimum and its headcount,
so when a preemptor needs capacity (``reclaim`` for a guarantee, a borrowed start reclaiming opportunistic
work, ``priority`` inside a VC) the members it could lose without stopping are tried first, as Volcano's
and KAI-Scheduler's elastic gangs are: only the jobs the preemptor may evict under the existing rules
(``reclaim.may_evict``, the priority rules), cheapest job first in the existing cost order, and inside a
job its newest members first (the ones growth added last). A job is never shrunk below its minimum, nor a
heterogeneous gang below any group's minimum: members are given up in reverse of the order it grew in,
skipping a member whose group is at its minimum (``shrinkable``).

The choice is simulated on a snapshot of the allocation book exactly as ``preemption.select_victims``
chooses whole jobs: members are released in that order until the preemptor's plan fits, then the set is
trimmed (every member whose return still lets the plan fit is spared). The members a job's minimums keep
come last in that order, so where the plan needs one of them (it sits where the preemptor must go) the
trim keeps a newer member instead, as long as every job still holds its minimums (else the plan is no
shrink). Only when shrinking cannot make the preemptor fit does whole-job victim selection run, and it
still shrinks an elastic victim instead of evicting it where that is enough.

No thrash: a job is resized at most once per ``EngineOptions.resize_min_interval_seconds`` (``may_resize``)
except that another VC's guarantee may always shrink it (a guarantee prevails); growth waits out the
interval and the engine wakes up when it ends (``growth``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from kubecell.core.book import AllocationBook
from kubecell.core.engine.job import Job, JobPhase, member_index
from kubecell.core.engine.preemption import VictimSet, give_back, members_seconds
from kubecell.core.model import Allocation

Released = Sequence[tuple[Job, str]]
"""Members released so far in a simulation, in order: (job, allocation name)."""


def shrinkable(job: Job) -> list[str]:
    """The members a running job may give up, newest first: down to its minimum and, for a heterogeneous
    gang, never below a group's minimum (a member whose group is at its minimum is skipped). A gang restored
    short of its minimums gives up nothing. Where the driver ranked a homogeneous job's members
    (``Engine.rank_members``), the highest rank goes first instead: an ElasticJob's controller keeps workers
    0..target-1, so a shrink that took another worker than the highest cost a second one (the controller
    replaced the worker taken and removed the highest)."""
    spec = job.spec
    if job.phase != JobPhase.RUNNING or job.size <= spec.minimum or job.short_of_minimum:
        return []
    if not spec.heterogeneous:
        order = job.running_members
        if job.ranks:  # unranked members first, then the highest rank; newest first among equals
            joined = {name: i for i, name in enumerate(order)}
            order = sorted(order, key=lambda name: (name not in job.ranks, job.ranks.get(name, 0), joined[name]))
        return list(reversed(order[spec.minimum:]))
    counts = list(job.running_counts())
    left = job.size - spec.minimum
    chosen: list[str] = []
    for name in reversed(job.running_members):
        if not left:
            break
        position = spec.group_position(member_index(name))
        if counts[position] > spec.member_groups[position].minimum:
            counts[position] -= 1
            left -= 1
            chosen.append(name)
    return chosen


def may_resize(job: Job, now: float, interval: float) -> bool:
    """Has the resize interval passed since the job last grew or shrank (a start is no resize)?"""
    return job.resized_at is None or now >= job.resized_at + interval


def select_shrinks(book: AllocationBook, fits: Callable[[Released], bool], candidates: Sequence[Job],
                   members_of: Callable[[Job], Sequence[str]], now: float) -> VictimSet | None:
    """Members of ``candidates`` (jobs in cost order) whose release makes ``fits`` true while every job keeps
    its minimums, trimmed; None if there are none. ``members_of`` says which jobs may shrink (none: it may
    not) and the members they give up first (newest first, down to the minimums); the members a minimum
    keeps are tried after those of every job, so a plan that needs one of them (it sits where the
    preemptor must go) keeps newer ones instead. ``fits`` is given the members released so far (a rule
    that counts guarantee room needs them). The book is restored."""
    first: list[tuple[Job, str]] = []
    then: list[tuple[Job, str]] = []
    for job in candidates:
        preferred = list(members_of(job))
        if preferred:
            first.extend((job, name) for name in preferred)
            chosen = set(preferred)
            then.extend((job, name) for name in reversed(job.running_members) if name not in chosen)
    pool = first + then
    if not pool:
        return None
    snapshot = book.snapshot()
    try:
        for _, name in pool:
            book.release(name)
        possible = fits(pool)
    finally:
        book.restore(snapshot)
    if not possible:
        return None
    released: list[tuple[Job, str]] = []
    allocations: dict[str, Allocation] = {}
    try:
        for job, name in pool:
            allocations[name] = book.allocations[name]
            book.release(name)
            released.append((job, name))
            if fits(released):
                break
        # Trim: each member but the last one released goes back if the plan still fits without freeing it
        # (the members a minimum keeps first, since they were released last).
        gone = {name for _, name in released}
        for _, name in reversed(released[:-1]):
            gone.discard(name)
            still = [(job, other) for job, other in released if other in gone]
            if not give_back(book, partial(fits, still), [allocations[name]]):
                gone.add(name)
        by_job: dict[str, tuple[Job, list[str]]] = {}
        age = 0
        for job in candidates:
            newest_first = list(reversed(job.running_members))
            names = [name for name in newest_first if name in gone]
            if names:
                if not job.spec.meets_minimums(job.spec.counts_of(
                        member_index(name) for name in job.running_members if name not in gone)):
                    return None  # the plan needs more of this job than it can give up: not a shrink
                by_job[job.name] = (job, names)
                age += sum(newest_first.index(name) for name in names)
        shrunk = tuple((job, tuple(names)) for job, names in by_job.values())
        return VictimSet((), sum(members_seconds(job, names, now) for job, names in shrunk), shrunk, age)
    finally:
        book.restore(snapshot)
