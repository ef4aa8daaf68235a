"""Threshold gangs grow toward their headcount when capacity allows (KubeShare's elastic gangs).

Growth takes capacity like a start does and obeys the same limits: a guaranteed gang grows inside its
VC's cells and within the guarantee's room; a borrowed one within ``borrowLimitGpus`` (and, under the
quota policy, the cohort's unused quota), preferring unbound cells; no gang grows onto nodes reserved
for a starving job it must leave alone; members stay within the gang's node, rack or zone, and on the
nodes the job may use (``JobSpec.nodes``). A gang adds the members it is missing in its fill order
(``JobSpec.fill_order``: every group's minimum first, then group by group), whichever group they belong
to, each charged its own group's GPU units; a restored gang below its minimums refills them first.

A gang grows at most once per ``resize_min_interval_seconds`` after it last grew or shrank (its start is
no resize), and never in the cycle that shrank it; a gang the interval holds back is woken up when it
ends. Growth adds no more members than the driver said it can bind (``Job.spare``: pods it has for them).
Every growth records why (``Job.resizes``, shown by ``Engine.queries.explain``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from kubecell.core.book import BoolArray
from kubecell.core.engine.attempt import Attempt, CycleResult
from kubecell.core.engine.bindings import bind_for_growth
from kubecell.core.engine.capacity import member_capacity
from kubecell.core.engine.job import Job, JobClass, JobPhase, JobSpec, member_index
from kubecell.core.engine.regions import Region
from kubecell.core.engine.scavenge import borrow_room, borrowable_members
from kubecell.core.engine.session import Session
from kubecell.core.engine.shrink import may_resize
from kubecell.core.model import TopologyLevel


def grow(session: Session, now: float, result: CycleResult) -> None:
    interval = session.options.resize_min_interval_seconds
    shrunk = {cut.job.name for cut in result.shrunk}
    for name in sorted(session.growable):
        job = session.jobs[name]
        if job.size >= job.spec.members:
            session.growable.discard(name)
            continue
        if job.phase != JobPhase.RUNNING or name in shrunk:
            continue  # the members a shrink released this cycle are not taken back in it
        if not may_resize(job, now, interval):
            assert job.resized_at is not None
            session.queue.wake_later(job, job.resized_at + interval)
            continue
        before = job.size
        if _grow_one(session, job, Attempt(job, now, result, job.job_class)):
            klass = job.job_class.value if job.job_class is not None else "?"
            job.resized(now, f"grown {before} -> {job.size} members at t={now:g} ({klass})")
            result.grown.append(job)
            if job.size >= job.spec.members:
                session.growable.discard(name)


def _scope(session: Session, job: Job) -> list[int]:
    """The nodes new members may use: the gang's node, rack or zone when it is constrained."""
    book, spec = session.book, job.spec
    nodes = sorted({book.index[book.allocations[a].node] for a in job.running_members})
    if spec.topology == TopologyLevel.NODE:
        return nodes
    if spec.topology is not None and TopologyLevel.RACK <= spec.topology < TopologyLevel.CLUSTER:
        domain = session.zone_of if spec.topology == TopologyLevel.ZONE else session.rack_of
        return np.flatnonzero(np.isin(domain, domain[nodes]) & (domain >= 0)).tolist()
    return list(range(book.size))


def _extra(session: Session, job: Job, missing: Sequence[int]) -> int:
    """How many of the missing members (in fill order) the gang's class lets it add now: within the
    guarantee's room, within what its VC may still borrow, or all of them."""
    vc = session.tenants.get(job.vc)
    if not job.spec.heterogeneous:
        per = max(job.member_milli, 1)
        if job.job_class == JobClass.GUARANTEED and vc is not None:
            return min(len(missing), session.guarantee_room(vc) // per)
        if job.job_class == JobClass.BORROWED and vc is not None:
            room, _ = borrowable_members(session, job, vc, need=per)
            return min(len(missing), room if job.member_milli else len(missing))
        return len(missing)
    if job.job_class == JobClass.GUARANTEED and vc is not None:
        return job.affordable(missing, session.guarantee_room(vc))
    if job.job_class == JobClass.BORROWED and vc is not None:
        budget, why = borrow_room(session, job, vc, need=min(job.charges))
        return 0 if why else job.affordable(missing, budget)
    return len(missing)


def _bindable(job: Job) -> list[int]:
    """The missing members (fill order kept) the driver can bind: at most ``Job.spare`` of each group, taken
    from the fill order only until those are found (a pod can state a headcount of millions)."""
    missing = job.missing_members()
    if job.spare is None:
        return list(missing)
    if len(job.spare) == 1:
        return list(itertools.islice(missing, job.spare[0]))
    left = list(job.spare)
    wanted = sum(left)
    kept: list[int] = []
    for index in missing:
        if len(kept) == wanted:
            break
        position = job.spec.group_position(index)
        if left[position] > 0:
            left[position] -= 1
            kept.append(index)
    return kept


def _grow_one(session: Session, job: Job, attempt: Attempt) -> bool:
    spec = job.spec
    vc = session.tenants.get(job.vc)
    missing = _bindable(job)
    extra = _extra(session, job, missing)
    if extra <= 0:
        return False
    adding = missing[:extra]
    scope = _scope(session, job)
    in_scope = np.zeros(session.book.size, np.bool_)
    in_scope[scope] = True
    allowed = session.allowed_nodes(job)
    if allowed is not None:  # new members go only where the job may run (no cell is bound elsewhere for it)
        in_scope &= allowed
        scope = np.flatnonzero(in_scope).tolist()
    fresh = []
    if job.job_class == JobClass.GUARANTEED and session.options.cells and vc is not None:
        gpus = (sum(spec.group_of(i).member.gpu_count for i in adding) if spec.heterogeneous
                else extra * max(spec.member.gpu_count, 1))
        fresh = bind_for_growth(session, job, scope, extra, gpus)
        regions = [Region(session.regions.owned_mask(vc, spec.gpu_models), in_scope)]
    elif job.job_class == JobClass.GUARANTEED:
        regions = [Region(None, in_scope)]
    else:
        regions = [Region(r.mask, in_scope if r.nodes is None else r.nodes & in_scope)
                   for r in session.regions.scavenge(spec)]
    allocations = None
    for region in regions:
        mask, nodes = session.filters(region, attempt)
        allocations = session.gangs.place(spec, mask, nodes, extra, 1, indices=adding)
        if allocations is not None:
            break
    if fresh:
        used = {(session.book.index[a.node], g) for a in allocations or () for g in a.gpu_indices}
        for cell in reversed(fresh):
            if not any(gpu in used for gpu in cell.gpus):
                session.tenancy.unbind(cell)
    if allocations is None:
        return False
    job.placement_score = session.gangs.last_score
    session.ledger.remove(job)
    job.running_members.extend(a.name for a in allocations)
    session.ledger.add(job)
    if job.spare is not None:
        added = spec.counts_of(member_index(a.name) for a in allocations)
        job.spare = tuple(s - a for s, a in zip(job.spare, added, strict=True))
    if job.short_of_minimum and job.meets_minimums():
        job.short_of_minimum = False
    return True


def headroom(session: Session, job: Job, now: float) -> int:
    """How many more members growth could place for ``job`` now if the driver had a pod for each (its
    ``spare`` ignored): an elastic gang's driver asks before it makes pods (``scheduler.elastic``), so a
    target it raises is one the cluster can take now. The same limits as growth: the class's budget (guarantee
    room, borrow limit), the gang's scope and allowed nodes, the VC's bound cells and the cells it may still
    bind (guaranteed) or the capacity scavenging may use (borrowed). The count is exact per node for one
    member shape (``capacity``), but it is taken over the union of the regions growth tries one at a time and
    of the cells the VC may bind, so it can exceed what one growth then places: pods made for members that
    do not fit wait, and the driver gives them back (``scheduler.elastic``). A heterogeneous gang, a gang in
    its resize interval or one that is not running gets 0."""
    spec = job.spec
    if job.phase != JobPhase.RUNNING or spec.heterogeneous or job.size >= spec.members:
        return 0
    if not may_resize(job, now, session.options.resize_min_interval_seconds):
        return 0
    extra = _extra(session, job, range(spec.members - job.size))  # one shape: only their number counts
    if extra <= 0:
        return 0
    in_scope = np.zeros(session.book.size, np.bool_)
    in_scope[_scope(session, job)] = True
    allowed = session.allowed_nodes(job)
    if allowed is not None:
        in_scope &= allowed
    return min(extra, _capacity(session, job, spec, job.job_class, extra, in_scope))


def room_on(session: Session, job: Job, model: str, now: float) -> int:
    """How many members ``job`` could run with on GPU model ``model`` if it started there now, giving up what
    it holds: an elastic gang of one-GPU-model members that its driver moves to another model (a restart
    elsewhere, ``core.elastic.targets``) or starts on a model of its choice. A start there is tried as the
    engine tries one: inside its VC's guarantee (the cells bound to it and those it may bind, of that model)
    when the guarantee's room, counting the job's own guaranteed members as given back, holds its minimum; else
    borrowed (idle capacity, within the VC's borrowing limit, counting its own borrowed members as given back);
    an opportunistic job scavenges. The larger of the two counts is the answer, on the job's allowed nodes.
    0 for a heterogeneous gang, a gang with a node, rack or zone constraint (a start there is one domain's,
    which this sum does not respect), a member without whole GPUs, a model the cluster does not have, and a
    running job inside its resize interval or already on ``model``. Which models the job may use is its
    driver's to say (an ElasticJob names them in its template, while its engine job accepts the one model it
    runs on). Like ``headroom`` it may count more than one start then places; the engine decides."""
    spec = job.spec
    member = spec.member
    book = session.book
    if spec.heterogeneous or spec.topology is not None or not member.is_whole or model not in book.model_names:
        return 0
    running = job.phase == JobPhase.RUNNING
    if running:
        held = {book.model_names[book.model_id[book.index[book.allocations[a].node]]] for a in job.running_members}
        if held == {model} or not may_resize(job, now, session.options.resize_min_interval_seconds):
            return 0
    elif job.phase != JobPhase.PENDING:
        return 0
    moved = dataclasses.replace(spec, member=dataclasses.replace(member, gpu_models=frozenset({model})))
    vc = session.tenants.get(job.vc)
    allowed = session.allowed_nodes(job)
    in_scope = np.ones(book.size, np.bool_) if allowed is None else allowed.copy()
    per = max(job.member_milli, 1)
    if vc is None or spec.opportunistic:
        return min(spec.members, _capacity(session, job, moved, JobClass.OPPORTUNISTIC, spec.members, in_scope))
    best = 0
    own = job.held_gpu_milli if running and job.job_class == JobClass.GUARANTEED else 0
    most = min(spec.members, (session.guarantee_room(vc, job) + own) // per)
    if most >= spec.minimum:
        best = min(most, _capacity(session, job, moved, JobClass.GUARANTEED, most, in_scope))
    room, why = borrow_room(session, job, vc)
    own = job.held_gpu_milli if running and job.job_class == JobClass.BORROWED else 0
    most = spec.members if room is None and not why else min(spec.members, (max(room or 0, 0) + own) // per)
    if most >= spec.minimum:
        best = max(best, min(most, _capacity(session, job, moved, JobClass.BORROWED, most, in_scope)))
    return best


def _capacity(session: Session, job: Job, spec: JobSpec, job_class: JobClass | None, most: int,
              in_scope: BoolArray) -> int:
    """Members of ``spec``'s shape the class's regions could take now on the ``in_scope`` nodes (see
    ``headroom``)."""
    book = session.book
    vc = session.tenants.get(job.vc)
    mask: BoolArray | None
    if job_class == JobClass.GUARANTEED and session.options.cells and vc is not None:
        mask = session.regions.owned_mask(vc, spec.gpu_models).copy()
        for region in session.regions.guaranteed(vc, spec, most, session.allowed_nodes(job)):
            if len(region.binds) == 1 and session.tenancy.can_bind(job.vc, region.binds[0]):
                for node, gpu in region.binds[0].gpus:
                    if in_scope[node]:
                        mask[node, gpu] = True
    elif job_class == JobClass.GUARANTEED:
        mask = None
    else:
        mask = np.zeros_like(book.gpu_present)
        for region in session.regions.scavenge(spec):
            if region.mask is None:
                mask = None
                break
            mask |= region.mask
    return int(member_capacity(book, spec.member, mask, in_scope).sum())
