"""One job's turn in a cycle, in two passes (Volcano's allocate, then its backfill of idle capacity).

1. *Within the guarantee*: the job starts inside its VC's guarantee if it fits there (reclaiming borrowed
   and opportunistic work in the way, taking back members its VC's elastic jobs of its priority grew, or
   lazily preempting lower-priority work of its own VC). A job that
   cannot is DEFERRED if it may borrow (the policy lends, it is under its preemption cap, it holds no
   quota admission), else it WAITS.
2. *Beyond the guarantee*, once every class has had its first pass: deferred jobs borrow idle capacity
   within their limits, opportunistic jobs scavenge it.

Because every guarantee is served before anything borrows, a borrower never takes capacity that a
guarantee claims in the same cycle, so nothing is started and evicted in one cycle.
"""

from __future__ import annotations

from kubecell.core.engine.attempt import Attempt, Outcome
from kubecell.core.engine.guaranteed import start_guaranteed
from kubecell.core.engine.job import JobClass
from kubecell.core.engine.priority import preempt_lower_priority, take_back_grown_members
from kubecell.core.engine.scavenge import scavenge, start_borrowed
from kubecell.core.engine.session import Session


def removed_vc_reason(session: Session, vc: str) -> str:
    return (f"virtual cluster {vc!r} was removed by a configuration reload "
            f"(known: {', '.join(session.tenants.names) or 'none'})")


def within_guarantee(session: Session, attempt: Attempt) -> Outcome:
    """The first pass: start inside the guarantee, or say whether the job may borrow later."""
    job = attempt.job
    spec = job.spec
    vc = session.tenants.get(spec.vc)
    if vc is None:  # requeued (node failure, eviction) after its VC was removed
        session.withdraw(job)
        session.reject(job, removed_vc_reason(session, spec.vc))
        attempt.result.rejected.append(job)
        return Outcome.REJECTED
    if spec.opportunistic:
        return Outcome.DEFERRED
    if not spec.wants_gpu:
        if start_guaranteed(session, attempt, vc, 0):
            return Outcome.STARTED
    else:
        reason = session.admission.never_guaranteed(vc, job)
        if reason is None:
            room = session.guarantee_room(vc, job)
            if job.min_milli <= room:  # room in the guarantee, but maybe not where the job may go (its models)
                started = (start_guaranteed(session, attempt, vc, room)
                           or take_back_grown_members(session, attempt, vc, job.min_milli - room))
            else:
                started = preempt_lower_priority(session, attempt, vc)
            if started:
                return Outcome.STARTED
        else:
            attempt.reason = reason
    return _may_borrow(session, attempt)


def _may_borrow(session: Session, attempt: Attempt) -> Outcome:
    job = attempt.job
    if not session.options.borrowing:
        attempt.reason += "; this policy does not borrow idle capacity"
        return Outcome.WAITING
    if job.preemptions >= session.options.max_preemptions:
        attempt.reason += (f"; preempted {job.preemptions} times, so it now waits for guaranteed capacity "
                           "instead of borrowing")
        return Outcome.WAITING
    if job.name in session.admitted:
        return Outcome.WAITING  # admitted against its quota: it waits for a placement, it does not borrow
    return Outcome.DEFERRED


def beyond_guarantee(session: Session, attempt: Attempt, why_not_guaranteed: str) -> Outcome:
    """The second pass: borrow idle capacity, or scavenge it (opportunistic work)."""
    job = attempt.job
    if job.spec.opportunistic:
        started = scavenge(session, attempt, JobClass.OPPORTUNISTIC, job.spec.members)
    else:
        started = start_borrowed(session, attempt, session.tenants.require(job.vc), why_not_guaranteed)
    return Outcome.STARTED if started else Outcome.WAITING
