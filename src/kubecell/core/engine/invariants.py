"""What must hold after every engine call; one check shared by the scenarios, the unit suite and audits.

The allocation book agrees with its allocations; every running job holds distinct members of its own,
between its minimum and its headcount, and of each of its groups between the group's minimum and count
(a restored gang that came back short of its minimums is the one exception, until growth refills it),
and nothing else holds anything (no gang is ever half bound); every running job has a class;
guaranteed jobs sit inside cells bound to their VC and each VC's guaranteed use stays within its
guarantee; the usage ledger matches the running jobs; every waiting job is queued once, holds nothing
and, once a cycle has seen it, says specifically why it waits.
"""

from __future__ import annotations

from kubecell.core.engine.job import Job, JobClass, JobPhase, member_index
from kubecell.core.engine.session import Session
from kubecell.core.errors import KubecellError

GENERIC_REASONS = ("", "not yet considered", "submitted; waiting for the next scheduling cycle")


class EngineInvariantError(KubecellError):
    """The engine's state broke one of its invariants (a bug in the engine, never a user error)."""


def problems(session: Session) -> list[str]:
    found: list[str] = []
    try:
        session.book.check_invariants()
    except KubecellError as error:
        found.append(f"allocation book: {error}")
    held: set[str] = set()
    for job in session.jobs.values():
        if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED):
            if session.running.get(job.name) is not job:
                found.append(f"{job.name} is {job.phase.value} but not in the running set")
            found.extend(_gang_problems(job))
            if job.job_class is None:
                found.append(f"running job {job.name} has no class")
            for name in job.running_members:
                if name not in session.book.allocations:
                    found.append(f"{job.name} lists member {name} that holds nothing")
                held.add(name)
        elif job.running_members:
            found.append(f"{job.name} is {job.phase.value} but holds members {job.running_members}")
        if job.phase == JobPhase.PENDING and job.name not in session.queue:
            found.append(f"pending job {job.name} is not in the queue")
    stray = sorted(set(session.book.allocations) - held - session.external)
    if stray:
        found.append(f"allocations owned by no running job: {stray}")
    found.extend(_tenancy_problems(session))
    found.extend(session.ledger.consistent_with(session.running.values()))
    for name, job in session.queue.pending.items():
        if session.jobs.get(name) is not job or job.phase != JobPhase.PENDING:
            found.append(f"{name} is queued but is {job.phase.value}")
        elif job.wait_reason in GENERIC_REASONS and not session.queue.is_newcomer(name):
            found.append(f"waiting job {name} has no specific reason ({job.wait_reason!r})")
    return found


def _gang_problems(job: Job) -> list[str]:
    """A running gang holds distinct members of its own, at least its minimums and at most its counts."""
    spec = job.spec
    try:
        indices = [member_index(name) for name in job.running_members]
    except ValueError:
        return [f"{job.name} holds members not named <job>/<index>: {job.running_members}"]
    if len(set(indices)) != len(indices) or not all(0 <= i < spec.members for i in indices) or \
            not all(name == f"{job.name}/{i}" for name, i in zip(job.running_members, indices, strict=True)):
        return [f"{job.name} holds members {job.running_members}, not distinct members of 0..{spec.members - 1}"]
    found = []
    floor = 0 if job.short_of_minimum else spec.minimum
    if not floor <= job.size <= spec.members:
        found.append(f"{job.name} runs {job.size} member(s), outside {spec.minimum}..{spec.members} "
                     "(a partially bound gang)")
    counts = spec.counts_of(indices)
    for position, (group, count) in enumerate(zip(spec.member_groups, counts, strict=True)):
        least = 0 if job.short_of_minimum else group.minimum
        if spec.heterogeneous and not least <= count <= group.count:
            found.append(f"{job.name} runs {count} member(s) of {group.title(position)}, outside "
                         f"{group.minimum}..{group.count} (a partially bound gang)")
    return found


def _tenancy_problems(session: Session) -> list[str]:
    found: list[str] = []
    book, tenancy = session.book, session.tenancy
    for job in session.running.values():
        if job.job_class != JobClass.GUARANTEED or not session.options.cells:
            continue
        mine = tenancy.vc_index.get(job.vc, -2)
        outside = [f"{a.node}/{g}" for a in (book.allocations[n] for n in job.running_members if n in book.allocations)
                   for g in a.gpu_indices if tenancy.owner[book.index[a.node], g] != mine]
        if outside:
            found.append(f"guaranteed job {job.name} holds GPUs outside VC {job.vc}'s bound cells: {outside}")
    for vc in session.tenants.vcs:
        used = session.ledger.of(vc.name).guaranteed_milli
        if used > vc.guaranteed_milli:
            found.append(f"VC {vc.name} uses {used / 1000:g} guaranteed GPUs of {vc.guaranteed_gpus}")
    return found


def check_invariants(session: Session) -> None:
    """Raise ``EngineInvariantError`` listing every broken invariant."""
    broken = problems(session)
    if broken:
        raise EngineInvariantError("; ".join(broken))
