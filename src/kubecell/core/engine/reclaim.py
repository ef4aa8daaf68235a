"""Reclaim: a job entitled to capacity takes it back from work that is only borrowing it.

Who may evict whom: opportunistic work yields to everyone; borrowed work yields to guarantees, after the
optional ``reclaim_min_runtime_seconds`` (the waiting job wakes up when the protection ends); a VC's
lazily downgraded jobs yield to the job they were downgraded for. A guarantee always prevails over
borrowed work, whatever that work's preemption count: the preemption cap keeps a job from borrowing
again, it never makes borrowed work untouchable (a job a reload turned into borrowed work would
otherwise block another VC's guarantee for good).

Topology-aware reclaim first shrinks elastic jobs (members above their minimums, ``shrink``), and only
when that is not enough chooses whole gangs, by simulating the preemptor's placement in each candidate
region on a snapshot of the book (``preemption.select_victims``); the preemptor is placed in the same
transaction, so the freed capacity is its own. Any plan that only shrinks beats any plan that evicts.
A search that found nothing is not repeated until its outcome can change: the VC's cells or its
guaranteed use change, a reservation is made or dropped (retry at once), or a protected victim becomes
evictable (a wake-up then); a ten-minute back-off is the safety net. Evictable work coming or going
cannot change it: free plus evictable capacity stays the same.

Quota-style reclaim (Kueue without topology-aware scheduling) admits the job against its quota and
evicts the newest borrowed jobs of other VCs until enough GPUs are free by count, wherever they are
(shrinking their elastic members instead when that alone frees enough).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kubecell.core.engine.attempt import Attempt
from kubecell.core.engine.explain import no_room_reason
from kubecell.core.engine.job import Job, JobClass, JobPhase
from kubecell.core.engine.preemption import VictimSet, gpu_seconds, select_victims
from kubecell.core.engine.regions import Region
from kubecell.core.engine.session import Session
from kubecell.core.engine.shrink import may_resize, select_shrinks, shrinkable
from kubecell.core.tenancy.config import VirtualCluster

VICTIM_SEARCH_BACKOFF_SECONDS = 600.0
"""A failed victim search is repeated only when its outcome can change (see ``reclaim_for_guarantee``);
this is the safety net for anything that rule misses."""


def may_evict(session: Session, attempt: Attempt, victim: Job) -> bool:
    if victim.phase != JobPhase.RUNNING:
        return False
    if victim.job_class == JobClass.OPPORTUNISTIC:
        return True
    if attempt.job_class == JobClass.OPPORTUNISTIC:
        return False
    if victim.job_class == JobClass.BORROWED and attempt.job_class == JobClass.GUARANTEED:
        if victim.vc == attempt.job.vc and victim.spec.priority > attempt.job.spec.priority:
            # its own VC's higher-priority work, borrowing because the guarantee was full: reclaimed for a
            # lower-priority teammate, it preempted that teammate back by priority at the next cycle (both lost)
            return False
        started = victim.started_at if victim.started_at is not None else attempt.now
        until = started + session.options.reclaim_min_runtime_seconds
        if attempt.now < until:
            attempt.protected(until)
            session.queue.wake_later(attempt.job, until)
            return False
        return True
    return victim in attempt.extra_victims


def victim_candidates(session: Session, attempt: Attempt, region: Region) -> list[Job]:
    """Jobs ``attempt`` may evict that hold capacity in the region, on the nodes the job may use, cheapest
    first: opportunistic before borrowed, then least GPU-time lost. Work on nodes the job may not use is
    never a candidate: evicting it frees nothing the job could take."""
    classes = [JobClass.OPPORTUNISTIC]
    if attempt.job_class == JobClass.GUARANTEED:
        classes.append(JobClass.BORROWED)  # only guarantees reclaim borrowed work
    rows = region.mask.any(axis=1) if region.mask is not None else None
    if region.nodes is not None:
        rows = region.nodes if rows is None else rows & region.nodes
    allowed = session.allowed_nodes(attempt.job)
    if allowed is not None:
        rows = allowed if rows is None else rows & allowed
    nodes = np.flatnonzero(rows).tolist() if rows is not None else None
    names: set[str] = set()
    for job_class in classes:
        names |= session.ledger.holders(job_class, nodes)
    ranked: list[tuple[tuple[int, float, str], Job]] = []
    for other in (session.jobs[name] for name in names):
        if other is attempt.job or not may_evict(session, attempt, other):
            continue
        rank = 0 if other.job_class == JobClass.OPPORTUNISTIC else 1
        ranked.append(((rank, gpu_seconds(other, attempt.now), other.name), other))
    ranked.sort(key=lambda item: item[0])
    return [other for _, other in ranked]


def shrink_members(session: Session, attempt: Attempt, victim: Job) -> list[str]:
    """The members ``attempt`` may take from ``victim`` by shrinking it (newest first): a guarantee takes
    them whenever it may evict the job (a guarantee prevails), anyone else only once the job's resize
    interval has passed, as the lower-priority jobs a VC downgraded for its preemptor (priority rules)."""
    if attempt.job_class == JobClass.GUARANTEED and victim not in attempt.extra_victims:
        return shrinkable(victim)
    if may_resize(victim, attempt.now, session.options.resize_min_interval_seconds):
        return shrinkable(victim)
    return []


def cheapest_victims(session: Session, attempt: Attempt, region: Region, most: int,
                     candidates: Sequence[Job]) -> VictimSet | None:
    """The cheapest plan over ``candidates`` that lets at least the job's minimum fit in ``region``: members
    above the minimums of elastic jobs alone when that is enough, else whole jobs (an elastic one only
    shrunk where that is enough)."""
    minimum = attempt.job.spec.minimum

    def fits() -> bool:
        return session.fits(attempt, region, most, minimum)

    def members_of(victim: Job) -> list[str]:
        return shrink_members(session, attempt, victim)

    plan = select_shrinks(session.book, lambda _: fits(), candidates, members_of, attempt.now)
    return plan if plan is not None else select_victims(session.book, fits, candidates, attempt.now, members_of)


def carry_out(session: Session, attempt: Attempt, plan: VictimSet, evicted: str, shrunk: str) -> None:
    """Shrink and evict for real what ``plan`` chose (``evicted``, ``shrunk``: the reasons they are told)."""
    for victim, members in plan.shrunk:
        session.shrink(victim, members, attempt, shrunk)
    for victim in plan.jobs:
        session.evict(victim, attempt, evicted)


def reclaim_for_guarantee(session: Session, attempt: Attempt, vc: VirtualCluster, regions: Sequence[Region],
                          most: int, where: str = "in its VC's cells") -> bool:
    """Evict borrowed and opportunistic work in the way of a guaranteed job and start it in its place."""
    job, now = attempt.job, attempt.now
    key = session.queue.class_of(job)
    # Free plus evictable capacity in the regions is all a search can use, and evictable work coming or
    # going leaves it unchanged; what can change the outcome is the VC's cells (bindings, health), its own
    # guaranteed use, reservations made or dropped, and a protected victim becoming evictable.
    state = (session.tenancy.version, session.ledger.of(vc.name).guaranteed_milli, session.reservations.version)
    backoff = session.victim_backoff.get(key)
    if backoff is not None and now < backoff[0] and backoff[1] == state:
        attempt.reason = no_room_reason(session, attempt, regions[0], where)
        return False
    best: tuple[tuple[int, int, int, int, float], Region, VictimSet] | None = None
    tried = 0
    for region in regions:
        if tried >= session.options.victim_search_regions:
            break
        if region.binds:
            if not session.regions.can_bind_all(vc.name, region.binds):
                continue
            session.regions.materialise(region, vc, job.spec)
        candidates = victim_candidates(session, attempt, region)
        if not candidates:
            continue
        tried += 1
        plan = cheapest_victims(session, attempt, region, most, candidates)
        if plan is not None and (best is None or plan.cost < best[0]):
            best = (plan.cost, region, plan)
    if best is None:
        until = now + VICTIM_SEARCH_BACKOFF_SECONDS
        if attempt.protected_until is not None:
            until = min(until, attempt.protected_until)
        session.victim_backoff[key] = (until, state)
        if tried:  # with no candidate at all, only an event (which retries every class) can help
            session.queue.wake_later(job, until)
        attempt.reason = no_room_reason(session, attempt, regions[0], where)
        return False
    _, region, plan = best
    carry_out(session, attempt, plan, f"preempted by {job.name} (VC {job.vc})",
              f"reclaimed for guaranteed job {job.name} (VC {job.vc})")
    if session.start(attempt, region, JobClass.GUARANTEED, most=most, least=job.spec.minimum, victims=plan.jobs):
        return True
    attempt.reason = "waiting for capacity freed by preemption"  # pragma: no cover - the simulation said it fits
    return False  # pragma: no cover


def reclaim_by_count(session: Session, attempt: Attempt, vc: VirtualCluster, region: Region, most: int) -> bool:
    """Quota-style reclaim: the job is *admitted* against its VC's quota at once, which reserves the quota
    so borrowers cannot take it back, and the newest borrowed jobs of other VCs are evicted until enough
    GPUs are free by count, wherever they are. The job then starts only if the freed GPUs happen to fit
    its shape; otherwise it waits, admitted, holding quota it cannot use (Kueue #4329). A job restricted to
    some nodes counts only the GPUs free there and evicts only jobs with members there (what they hold
    elsewhere frees nothing it could use)."""
    job = attempt.job
    if job.name not in session.admitted:
        allowed = session.allowed_nodes(job)
        free = session.book.total_avail if allowed is None else session.book.total_avail[allowed]
        need = job.min_milli - int(free.sum())
        lenders = [other for other in sorted(session.running.values(), key=lambda j: (
                   -(j.started_at if j.started_at is not None else 0.0), j.name))
                   if other.job_class in (JobClass.BORROWED, JobClass.OPPORTUNISTIC) and other.vc != vc.name]
        # borrowed work inside reclaim_min_runtime_seconds is not taken (may_evict wakes the job when it may be);
        # before, this policy evicted it at once, whatever the option promised
        others = [other for other in lenders if may_evict(session, attempt, other)]
        if len(others) < len(lenders) and need > sum(
                o.held_gpu_milli if allowed is None else session.milli_on(o, allowed) for o in others):
            attempt.reason = (f"its quota is lent to borrowed work still inside its minimum run time "
                              f"({session.options.reclaim_min_runtime_seconds:g} s); reclaimed once that is over")
            return False
        session.admitted[job.name] = job.min_milli
        session.ledger.of(vc.name).admitted_milli += job.min_milli
        why = f"reclaimed by quota of VC {vc.name} for {job.name}"
        cuts = _shrink_by_count(session, attempt, others, need)
        if cuts is not None:
            for other, members in cuts:
                session.shrink(other, members, attempt, why)
        else:
            victims: list[Job] = []
            for other in others:
                if need <= 0:
                    break
                frees = other.held_gpu_milli if allowed is None else session.milli_on(other, allowed)
                if allowed is None or frees:
                    victims.append(other)
                    need -= frees
            for victim in victims:
                session.evict(victim, attempt, why)
    if session.start(attempt, region, JobClass.GUARANTEED, most=most, least=job.spec.minimum):
        return True
    attempt.reason = ("admitted by quota, but no placement fits its shape: "
                      + no_room_reason(session, attempt, region, "within its quota"))
    return False


def _shrink_by_count(session: Session, attempt: Attempt, others: Sequence[Job],
                     need: int) -> list[tuple[Job, tuple[str, ...]]] | None:
    """Quota-style: members above the minimums of ``others`` (newest jobs first, newest members first) that
    free ``need`` GPU units by count on the nodes the job may use, or None when they cannot."""
    if need <= 0:
        return None
    allowed = session.allowed_nodes(attempt.job)
    book = session.book
    cuts: list[tuple[Job, tuple[str, ...]]] = []
    for other in others:
        taken: list[str] = []
        for name in shrink_members(session, attempt, other):
            if need <= 0:
                break
            if allowed is None or allowed[book.index[book.allocations[name].node]]:
                taken.append(name)
                need -= other.charge_of(name)
        if taken:
            cuts.append((other, tuple(taken)))
        if need <= 0:
            return cuts
    return None
