"""Re-adopting work that already runs: how a restarted scheduler rebuilds the engine from the cluster.

A scheduler that restarts must not trust memory: the allocations it made are recorded on the pods, and
it rebuilds the engine from those records before its first cycle. A restored job holds exactly the
GPUs its records name (the allocation book refuses anything that would oversubscribe a GPU, so a record
that conflicts with another is reported, never silently doubled), runs in the class it was recorded in
when the configuration still allows it, and otherwise keeps running one class lower, as a configuration
reload does: guaranteed work whose cells the guarantees no longer cover becomes borrowed, work of a VC
that no longer exists becomes opportunistic. Nothing restored is ever evicted by the restore itself.

Each member is held with its own group's request (``JobSpec.member_request``), so a heterogeneous gang
is re-adopted as it ran. A gang whose pods died while the scheduler was away may come back below its
minimums (the total or a group's): it is accepted (``Job.short_of_minimum``) and growth refills the
missing members in fill order, minimums first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kubecell.core.engine.admission import charge
from kubecell.core.engine.bindings import adopt_cells
from kubecell.core.engine.job import Job, JobClass, JobPhase, JobSpec
from kubecell.core.engine.session import Session
from kubecell.core.errors import AllocationError, InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Allocation, Request


@dataclass(frozen=True, slots=True)
class RunningMember:
    """One member as recorded in the cluster: its index in the gang, its node and its GPU indices."""

    index: int
    node: str
    gpus: tuple[int, ...] = ()


def restore_job(session: Session, spec: JobSpec, members: Sequence[RunningMember], job_class: JobClass, *,
                started_at: float, preemptions: int = 0) -> Job:
    """Adopt a running job; raises InvalidInputError (changing nothing) when its members cannot be held
    as recorded: an unknown node, a GPU that does not exist, capacity another allocation already holds."""
    where = f"job {spec.name!r}"
    if spec.name in session.jobs:
        raise InvalidInputError(f"a job named {spec.name!r} already exists", location=where)
    indices = [member.index for member in members]
    if not members or len(set(indices)) != len(indices) or not all(0 <= i < spec.members for i in indices):
        raise InvalidInputError(f"member indices {sorted(indices)} are not distinct members of 0..{spec.members - 1}",
                                location=where)
    book = session.book
    done: list[str] = []
    try:
        for member in sorted(members, key=lambda m: m.index):
            if member.node not in book.index:
                raise InvalidInputError(f"member {member.index} is on unknown node {member.node!r}", location=where)
            allocation = book.allocate(spec.member_request(member.index), book.index[member.node], member.gpus,
                                       adopt=True)  # it runs there: a closed node or a failed GPU holds it too
            done.append(allocation.name)
    except (AllocationError, InvalidInputError) as error:
        for name in reversed(done):
            book.release(name)
        if isinstance(error, InvalidInputError):
            raise
        raise InvalidInputError(f"cannot hold it as recorded: {error}", location=where) from None
    job = charge(book, Job(spec))
    job.running_members = done
    job.short_of_minimum = not job.meets_minimums()
    job.phase = JobPhase.RUNNING
    job.started_at = job.first_started_at = started_at
    job.preemptions = preemptions
    session.jobs[spec.name] = job
    if session.tenants.get(spec.vc) is None:
        job_class = JobClass.OPPORTUNISTIC
    job.job_class = job_class
    session.enter_running(job)
    tenant = session.tenants.get(spec.vc)
    if job_class == JobClass.GUARANTEED and (  # over the guarantee (its use counted now): shares charged by memory
            tenant is None or session.ledger.of(spec.vc).guaranteed_milli > tenant.guaranteed_milli  # can sum past
            or not adopt_cells(session, job)):  # their GPUs' cells
        session.set_class(job, JobClass.BORROWED)
    job.wait_reason = f"running ({job.job_class.value if job.job_class else '?'}) since {started_at:g} (restored)"
    session.queue.mark_dirty()
    return job


def hold_external(session: Session, request: Request, node: str, gpus: tuple[int, ...] | None = None) -> Allocation:
    """Hold capacity that work another scheduler placed occupies (a pod kube-scheduler bound asking for
    ``nvidia.com/gpu``): its whole GPUs, the lowest-numbered free ones (the device plugin, not the
    scheduler, picked them, so which ones is unknown; what is known is how many are gone), or exactly
    ``gpus`` where the allocation names them (a DRA claim's devices). The engine never evicts it and
    charges it to no VC. Raises InvalidInputError, changing nothing, if the node cannot hold it (then the
    cluster is oversubscribed by someone else, and kubecell must not add to it)."""
    book = session.book
    where = f"external work {request.name!r}"
    if request.name in book.allocations:
        raise InvalidInputError("is already held", location=where)
    if node not in book.index:
        raise InvalidInputError(f"is on unknown node {node!r}", location=where)
    index = book.index[node]
    row = index
    untouched = (book.gpu_milli_free[row] == MILLI_PER_GPU) & (book.gpu_mem_free[row] == book.gpu_mem_capacity[row])
    # a device plugin hands out healthy GPUs: those are the likeliest to be the ones taken
    free = sorted((g for g in range(book.nodes[index].gpu_count) if untouched[g]),
                  key=lambda g: (not book.gpu_healthy[row, g], g))
    if gpus is None:
        gpus = tuple(free[: request.gpu_count]) if request.gpu_count else ()
    elif len(gpus) != request.gpu_count or any(not 0 <= g < book.nodes[index].gpu_count for g in gpus):
        raise InvalidInputError(f"names GPUs {list(gpus)} of node {node!r} for {request.gpu_count} GPU(s)",
                                location=where)
    try:
        allocation = book.allocate(request, index, gpus, adopt=True)  # it runs there, open node or not
    except AllocationError as error:
        raise InvalidInputError(f"does not fit node {node!r}: {error}", location=where) from None
    session.external.add(allocation.name)
    session.queue.mark_dirty()
    return allocation


def release_external(session: Session, name: str) -> None:
    """The external work ended: its capacity is free again."""
    if name in session.external:
        session.external.discard(name)
        session.book.release(name)
        session.queue.mark_dirty()
