"""Start a job inside its virtual cluster's guarantee.

The job is placed inside the VC's bound cells, binding free cells as needed (safe splits only); a
threshold gang first looks for room for as many members as the guarantee has room for (its headcount
at most), then settles for its minimum, so a gang whose minimum fits the guarantee runs guaranteed.
When nothing fits, borrowed and opportunistic work in the way is reclaimed (``reclaim``).

A job without GPUs holds no cell: it runs guaranteed only on nodes without GPUs, which no guarantee
covers, or on nodes pinned whole to its VC, and borrows elsewhere (``scavenge``).
"""

from __future__ import annotations

from kubecell.core.engine.attempt import Attempt
from kubecell.core.engine.explain import no_room_reason
from kubecell.core.engine.job import JobClass
from kubecell.core.engine.reclaim import reclaim_by_count, reclaim_for_guarantee
from kubecell.core.engine.session import Session
from kubecell.core.tenancy.config import VirtualCluster


def start_guaranteed(session: Session, attempt: Attempt, vc: VirtualCluster, room: int) -> bool:
    """Start the job as guaranteed work within ``room`` milli-GPU of its VC's guarantee, reclaiming if needed."""
    job = attempt.job
    spec = job.spec
    attempt.job_class = JobClass.GUARANTEED
    if not spec.wants_gpu:
        return _start_without_gpus(session, attempt, vc)
    most = max(spec.minimum, job.members_within(room))
    allowed = session.allowed_nodes(job)
    regions = session.regions.guaranteed(vc, spec, most, allowed)
    if not regions:
        attempt.reason = (f"VC {vc.name} has no free cell that could hold it (all its cells are bound or doomed)"
                          if allowed is None else f"VC {vc.name} has no free cell that could hold it on the "
                          f"{int(allowed.sum())} node(s) its node constraints allow")
        return False
    whole = any(g.member.is_whole for g in spec.member_groups)
    bound_free = session.regions.bound_free(vc, spec, allowed) if whole else 0
    for least in dict.fromkeys((most, spec.minimum)):
        need_gpus = spec.gpus_of_first(least, whole_only=True)  # completely free GPUs its whole members take
        for region in regions:
            if region.binds:
                if whole and region.free_gpus + bound_free < need_gpus:
                    continue  # cannot fit without victims; considered below
                if not session.regions.can_bind_all(vc.name, region.binds):
                    continue
                session.regions.materialise(region, vc, spec)
                if session.fits(attempt, region, most, least):
                    return session.start(attempt, region, JobClass.GUARANTEED, most=most, least=least)
            elif session.start(attempt, region, JobClass.GUARANTEED, most=most, least=least):
                return True  # nothing to bind first: trying to place is the fit test
    if not session.options.topology_aware_reclaim:
        return reclaim_by_count(session, attempt, vc, regions[0], most)
    return reclaim_for_guarantee(session, attempt, vc, regions, most)


def _start_without_gpus(session: Session, attempt: Attempt, vc: VirtualCluster) -> bool:
    spec = attempt.job.spec
    regions = session.regions.guaranteed(vc, spec, spec.members)
    region = regions[0]
    if session.fits(attempt, region, spec.members, spec.minimum):
        return session.start(attempt, region, JobClass.GUARANTEED, most=spec.members, least=spec.minimum)
    where = f"on {region.label}" if session.options.cells else "anywhere"
    if session.options.cells and session.options.topology_aware_reclaim and region.nodes is not None \
            and region.nodes.any():
        return reclaim_for_guarantee(session, attempt, vc, regions, spec.members, where)
    attempt.reason = no_room_reason(session, attempt, region, where)
    return False
