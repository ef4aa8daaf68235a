"""Beyond the guarantee: borrowed and opportunistic work on idle capacity.

A job beyond its VC's guarantee borrows idle capacity, preferring cells nobody has bound, and may evict
opportunistic work to fit; it is reclaimed when an owner needs its GPUs. ``borrowLimitGpus`` caps what a
VC holds as borrowed work wherever capacity is taken: a threshold gang starts (and later grows) with no
more members than the limit leaves room for. Under the quota policy a cohort lends only quota nobody
holds, admitted-but-unplaced jobs included. Opportunistic work (priority -1) scavenges idle capacity,
evicts nobody, and is reclaimed first (an elastic opportunistic job is shrunk first, once its resize
interval has passed, ``shrink``).
"""

from __future__ import annotations

from kubecell.core.engine.attempt import Attempt
from kubecell.core.engine.explain import no_room_reason
from kubecell.core.engine.job import Job, JobClass
from kubecell.core.engine.reclaim import carry_out, cheapest_victims, victim_candidates
from kubecell.core.engine.session import Session
from kubecell.core.tenancy.config import VirtualCluster


def borrow_room(session: Session, job: Job, vc: VirtualCluster, need: int | None = None) -> tuple[int | None, str]:
    """GPU units ``job``'s VC may still take as borrowed work (None: no limit), or 0 and why, when that is
    less than ``need``: the job's minimum for a start (the default); growth of a running job needs room for one
    more member only (before, a borrowed gang of minimum 2 could never take the cohort's last free GPU)."""
    least = job.min_milli if need is None else need
    room: int | None = None
    if not session.options.cells:
        held = sum(u.total_milli + u.admitted_milli for u in session.ledger.usage.values())
        unused = sum(v.guaranteed_milli for v in session.tenants.vcs) - held
        if unused < least:
            return 0, "no unused quota left in the cohort to borrow"
        room = unused
    limit = vc.borrow_limit_milli
    if limit is not None:
        borrowed = session.ledger.of(vc.name).borrowed_milli
        left = limit - borrowed
        if left < least:
            return 0, f"VC {vc.name} borrowing limit reached ({borrowed / 1000:g} of {limit / 1000:g} GPUs)"
        room = left if room is None else min(room, left)
    return room, ""


def borrowable_members(session: Session, job: Job, vc: VirtualCluster, need: int | None = None) -> tuple[int, str]:
    """How many more members of ``job`` (the first of its fill order) its VC may hold as borrowed work now,
    and, if that is fewer than it needs (``borrow_room``), why."""
    if not any(job.charges):
        return job.spec.members, ""
    room, why = borrow_room(session, job, vc, need)
    if why:
        return 0, why
    return (job.spec.members if room is None else job.members_within(room)), ""


def start_borrowed(session: Session, attempt: Attempt, vc: VirtualCluster, why_not_guaranteed: str) -> bool:
    job = attempt.job
    prefix = f"{why_not_guaranteed}; " if why_not_guaranteed else ""
    most, limited = borrowable_members(session, job, vc)
    if limited:
        attempt.reason = prefix + limited
        return False
    if scavenge(session, attempt, JobClass.BORROWED, min(most, job.spec.members)):
        return True
    attempt.reason = f"{prefix}no idle capacity to borrow: {attempt.reason}"
    return False


def scavenge(session: Session, attempt: Attempt, job_class: JobClass, most: int) -> bool:
    """Start on idle capacity in ``job_class`` (borrowed work may evict opportunistic work to fit)."""
    job = attempt.job
    spec = job.spec
    attempt.job_class = job_class
    regions = session.regions.scavenge(spec)
    for region in regions:
        if session.start(attempt, region, job_class, most=most, least=spec.minimum):
            return True
    last = regions[-1]
    if job_class == JobClass.BORROWED:
        candidates = victim_candidates(session, attempt, last)
        plan = cheapest_victims(session, attempt, last, most, candidates) if candidates else None
        if plan is not None:
            carry_out(session, attempt, plan, f"opportunistic work reclaimed by {job.name}",
                      f"opportunistic work reclaimed by {job.name} (VC {job.vc})")
            if session.start(attempt, last, job_class, most=most, least=spec.minimum, victims=plan.jobs):
                return True
    attempt.reason = no_room_reason(session, attempt, last, "on idle capacity")
    return False
