"""Priority inside a virtual cluster: a job whose VC's guarantee is full of its own lower-priority work.

The newest lowest-priority guaranteed jobs of the VC are downgraded to borrowed until the guarantee
has room (HiveD's lazy preemption): their cells are released, so the preemptor may bind idle cells
instead, and a victim dies only if its GPUs are needed. A downgraded job keeps running only as far as
the VC may borrow (``borrowLimitGpus`` is a hard cap; a policy without borrowing kills every victim,
HiveD's default). Jobs inside the VC's ``minRuntimeMinutes`` are protected (the waiting job says until
when and the engine wakes up then); a job preempted ``max_preemptions`` times is not chosen again.
Priority never crosses VCs: another tenant's guarantee is not a lower priority's to take.

Before any job is downgraded, the eligible jobs that are elastic give up members above their minimums
(``shrink``; newest members first, jobs in the order above, each only once its resize interval has
passed) when that alone frees the guarantee room and lets the preemptor fit in the VC's cells, simulated
on the book. Otherwise whole jobs are downgraded as before, and the reclaim that follows still shrinks a
downgraded elastic job instead of evicting it where that is enough.

A preemptor restricted to some nodes (``JobSpec.nodes``) downgrades the victims on those nodes first:
only their GPUs can become its own. Victims elsewhere are chosen only when those do not free enough of
the guarantee, because guarantee room is fungible (downgrading them lets it bind a free cell on its
nodes); the GPUs it actually reclaims are only ever on its nodes (``reclaim.victim_candidates``).
"""

from __future__ import annotations

from collections.abc import Callable

from kubecell.core.engine.attempt import Attempt
from kubecell.core.engine.bindings import adopt_cells, release_idle_cells
from kubecell.core.engine.guaranteed import start_guaranteed
from kubecell.core.engine.job import Job, JobClass, JobPhase
from kubecell.core.engine.regions import Region
from kubecell.core.engine.session import Session
from kubecell.core.engine.shrink import Released, may_resize, select_shrinks, shrinkable
from kubecell.core.tenancy.config import VirtualCluster


def preempt_lower_priority(session: Session, attempt: Attempt, vc: VirtualCluster) -> bool:
    job = attempt.job
    spec = job.spec
    used = session.ledger.of(vc.name).guaranteed_milli / 1000
    total = session.effective_guarantee(vc) / 1000
    held = session.reservations.room_held(vc.name, session.jobs, job) / 1000
    for_starving = f"; {held:g} GPUs of it are held for a starving job of the VC" if held else ""
    need = job.min_milli - session.guarantee_room(vc, job)
    if not session.ledger.has_guaranteed_below(vc.name, spec.priority):
        if take_back_grown_members(session, attempt, vc, need):
            return True
        attempt.reason = (f"VC {vc.name} guarantee in use ({used:g} of {total:g} GPUs) "
                          f"by work of equal or higher priority{for_starving}")
        return False
    eligible: list[Job] = []
    protected_until: float | None = None
    for other in (session.jobs[name] for name in session.ledger.guaranteed_jobs(vc.name)):
        if other.spec.priority >= spec.priority or other.preemptions >= session.options.max_preemptions:
            continue
        started = other.started_at if other.started_at is not None else attempt.now
        if attempt.now - started < vc.min_runtime_seconds:
            until = started + vc.min_runtime_seconds
            protected_until = until if protected_until is None else min(protected_until, until)
            continue
        eligible.append(other)
    eligible.sort(key=lambda j: (j.spec.priority, -(j.started_at if j.started_at is not None else 0.0), j.name))
    allowed = session.allowed_nodes(job)
    if allowed is not None:  # stable: the victims on its nodes first, each group in the order above
        eligible.sort(key=lambda j: session.members_on(j, allowed) == 0)
    if _shrink_first(session, attempt, vc, eligible, need):
        return True
    chosen: list[Job] = []
    for victim in eligible:
        if need <= 0:
            break
        chosen.append(victim)
        need -= victim.held_gpu_milli
    if need > 0:
        if protected_until is not None:
            session.queue.wake_later(job, protected_until)
            attempt.reason = (f"VC {vc.name} guarantee in use ({used:g} of {total:g} GPUs); its lower-priority "
                              f"jobs are protected by minRuntime until t={protected_until:g}")
        else:
            attempt.reason = (f"VC {vc.name} guarantee in use ({used:g} of {total:g} GPUs) "
                              f"by work of equal or higher priority{for_starving}")
        return False
    for victim in chosen:
        session.set_class(victim, JobClass.BORROWED)
    if session.options.lazy_preemption:
        release_idle_cells(session)
    attempt.extra_victims = tuple(chosen)
    if not start_guaranteed(session, attempt, vc, session.guarantee_room(vc, job)):
        for victim in chosen:
            if victim.phase == JobPhase.RUNNING and victim.job_class == JobClass.BORROWED:
                session.set_class(victim, JobClass.GUARANTEED)
                if session.options.cells and not adopt_cells(session, victim):
                    # its cell was released and cannot be bound again (on a cordoned or bad node): guaranteed on
                    # cells bound to no VC, another VC could bind them under it; it stays borrowed instead
                    session.set_class(victim, JobClass.BORROWED)
        return False
    _settle_victims(session, attempt, vc, chosen)
    return True


def take_back_grown_members(session: Session, attempt: Attempt, vc: VirtualCluster, need: int) -> bool:
    """Start the job by taking back members that elastic jobs of its own VC and priority grew above their
    minimums, never more (no job of equal priority is downgraded or evicted for it). ``need``: the guarantee
    room (GPU milli) the job still lacks; 0 or less when the guarantee has room but not where the job may go
    (its GPU models, its nodes).

    Why: members above a minimum were taken from idle capacity (growth), and a teammate's job that needs its
    minimum is worth more than a grown job's extra speed. Without this, an elastic job that grew into its VC's
    whole guarantee, or into all the GPUs of the model another job asks for, would keep every later job of the
    VC waiting until it finished. The same guards hold as for any shrink: outside the victim's resize interval
    and minRuntime, newest members first, and only if the simulation says the job then fits; the job it starts
    is not shrunk back in turn, since growth never takes members from a running job. When the guarantee has
    room, only peers with a member the job could use (on its nodes, of its GPU models) are simulated, so a
    waiting job costs a scan, not a simulation, each cycle while no peer can help it."""
    spec = attempt.job.spec
    interval = session.options.resize_min_interval_seconds
    # Guarantee room is fungible: while the job lacks it, any peer's member frees some; with room to spare,
    # only members where the job may run help it.
    usable = _usable_by(session, attempt.job) if need <= 0 else _anywhere
    peers: list[Job] = []
    soonest: float | None = None
    for name in session.ledger.guaranteed_jobs(vc.name):
        other = session.jobs[name]
        if (other is attempt.job or other.spec.priority != spec.priority
                or not any(map(usable, shrinkable(other)))):
            continue
        started = other.started_at if other.started_at is not None else attempt.now
        until = max(started + vc.min_runtime_seconds,
                    other.resized_at + interval if other.resized_at is not None else started)
        if attempt.now >= until:
            peers.append(other)
        else:
            soonest = until if soonest is None else min(soonest, until)
    if soonest is not None:  # a peer that may not give members back yet may later: try again then
        session.queue.wake_later(attempt.job, soonest)
    # the most served first (members times seconds of the current run), as the simulator's allocator orders
    # jobs by least attained service: a long-running grown job gives back before one that just started
    peers.sort(key=lambda j: (-j.size * (attempt.now - (j.started_at if j.started_at is not None else attempt.now)),
                              j.name))
    return _shrink_first(session, attempt, vc, peers, need,
                         f"its members above the minimum given back to {attempt.job.name} (VC {vc.name}, equal "
                         "priority)")


def _anywhere(member: str) -> bool:
    return True


def _usable_by(session: Session, job: Job) -> Callable[[str], bool]:
    """Whether a member (allocation name) sits where ``job`` may run: its allowed nodes, its GPU models."""
    book = session.book
    allowed = session.allowed_nodes(job)
    models = job.spec.gpu_models

    def usable(member: str) -> bool:
        index = book.index[book.allocations[member].node]
        if allowed is not None and not allowed[index]:
            return False
        return models is None or book.model_names[book.model_id[index]] in models

    return usable


def _shrink_first(session: Session, attempt: Attempt, vc: VirtualCluster, eligible: list[Job], need: int,
                  why: str = "") -> bool:
    """Start the job by shrinking eligible elastic jobs only, if their members above the minimums free
    ``need`` GPU units of the guarantee and the room the job then fits in (simulated on the book)."""
    job = attempt.job
    spec = job.spec
    interval = session.options.resize_min_interval_seconds
    members = {victim.name: shrinkable(victim) if may_resize(victim, attempt.now, interval) else []
               for victim in eligible}
    if not any(members.values()):
        return False
    attempt.job_class = JobClass.GUARANTEED
    regions = session.regions.guaranteed(vc, spec, spec.minimum, session.allowed_nodes(job))

    def fits_in(region: Region) -> bool:
        if region.binds:
            if not session.regions.can_bind_all(vc.name, region.binds):
                return False
            session.regions.materialise(region, vc, spec)
        return session.fits(attempt, region, spec.minimum, spec.minimum)

    def fits(released: Released) -> bool:
        return sum(victim.charge_of(name) for victim, name in released) >= need and any(map(fits_in, regions))

    plan = select_shrinks(session.book, fits, eligible, lambda victim: members[victim.name], attempt.now)
    if plan is None:
        return False
    for victim, names in plan.shrunk:
        session.shrink(victim, names, attempt, why or f"preempted by higher-priority {job.name} (VC {vc.name})")
    if start_guaranteed(session, attempt, vc, session.guarantee_room(vc, job)):
        return True
    attempt.reason = "waiting for capacity freed by shrinking"  # pragma: no cover - the simulation said it fits
    return False  # pragma: no cover


def _settle_victims(session: Session, attempt: Attempt, vc: VirtualCluster, chosen: list[Job]) -> None:
    """Victims the preemptor did not need keep running as borrowed work while the VC may borrow them;
    the rest are evicted, first chosen first."""
    limit = vc.borrow_limit_milli if session.options.borrowing else 0
    usage = session.ledger.of(vc.name)
    for victim in chosen:
        if victim.phase != JobPhase.RUNNING:
            continue  # evicted to make room for the preemptor
        over_limit = limit is not None and usage.borrowed_milli > limit
        if session.options.lazy_preemption and not over_limit:
            victim.lazily_preempted = True
            victim.wait_reason = f"lazily preempted by {attempt.job.name}: running as borrowed capacity"
            attempt.result.downgraded.append(victim)
        else:
            why = (f"preempted by higher-priority {attempt.job.name} (VC {vc.name})"
                   + ("; the VC may not borrow that much" if session.options.lazy_preemption else ""))
            session.evict(victim, attempt, why)
