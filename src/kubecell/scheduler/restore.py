"""Rebuilding the engine's running work from the allocation records on the pods (after a start or a rebuild).

The records are the truth about what kubecell decided, but a record is an annotation, and an annotation is
only as trustworthy as whoever could write it. So a record counts only once it describes its own pod
(``trust.placement_disagreement``: node, the GPUs the pod asks for; ``trust.standing_disagreement``: job,
VC, isolation, class):

* a **bound** pod with a record that checks out is restored as the job it belongs to; one whose record does
  not (unreadable, copied, edited, or naming another node than ``spec.nodeName``) is held on the node it
  really runs on as another scheduler's pod is held (whole GPUs, never less than it could use), and told so
  in a Warning Event; one whose record agrees on its node and GPUs but not on its gang, VC, isolation or class
  (its owner edited those annotations while it ran) forfeits its standing: it is restored alone, as
  opportunistic work (reclaimed first) on what it holds (``trust.forfeited``), never as another scheduler's
  pod, which nothing may evict;
* a bound pod that is **terminating** (evicted by a shrink or a preemption, or deleted) is no member of its
  job any more: a shrunk gang is restored with the pods it runs on (its headcount the pods that exist, as
  for any gang whose pods changed), and the leaving pod is held where it runs, as another scheduler's
  pod, until it is gone;
* a record on a pod **not bound yet** is a decision some earlier instance made and did not finish (a gang's
  records are all written before its first Binding). It is carried out (rolled forward) only if it is still
  a decision kubecell would make: every record of the gang exists (``batch``), the node exists, is open and
  is one the pod's node constraints allow and that can give its isolation, the VC exists, the capacity is
  free, and the engine grants the recorded class within the VC's guarantee or borrowing limit. Otherwise
  the record is removed (rolled back) and the pod decided again. A gated or terminating pod is never bound.

What runs is fact, and a record not carried out yet is only a claim: every bound member of every job is restored
(or, for a job with members still to bind, held where it runs) before any record on a pod not bound yet is judged,
so the capacity a roll-forward finds free is free of everything that runs. Before (found by a hostile review), jobs
were restored one at a time in the order they were placed, bound and unbound alike: a pod waiting since before
another job was placed, with a forged unbound record naming that job's GPUs, was restored first, found them free
and was bound there, and the job that ran on them could no longer be held (the node agent gave both pods the same
GPUs). A record's ``createdAt`` is believed within the pod's life only: never before its pod was created, never
after now (``placed_at``), as when the job started, or a record from the year 9999 kept a borrowed job inside its
minimum run time for ever.

Pods bound but not yet acknowledged on a node served by kubecell's device plugin hold that node's gate again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kubecell.core.engine.job import Job, JobClass
from kubecell.core.engine.restore import RunningMember
from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.kube import pods
from kubecell.kube.actions import Actions, retry
from kubecell.kube.claim_writes import ClaimConflict
from kubecell.kube.dialects import DemandError, PodDemand, pod_demand
from kubecell.kube.dialects.demand import OPPORTUNISTIC
from kubecell.kube.elasticjobs import elastic_owner
from kubecell.kube.inventory import NodeView
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import RecordError
from kubecell.kube.rest import ApiError
from kubecell.kube.trust import forfeited, placement_disagreement, standing_disagreement
from kubecell.scheduler.claims import ClaimsPending
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.gate import NodeGate
from kubecell.scheduler.intake import Intake
from kubecell.scheduler.jobs import Tracked, gang_spec, on_one_model
from kubecell.scheduler.knowledge import as_granted, informed
from kubecell.scheduler.restore_members import (
    Member,
    gang_pods,
    generation_of,
    held_indices,
    member_indices,
    oldest_created,
    one_model,
    placed_at,
)
from kubecell.scheduler.roll_forward import class_refused, why_not_forward
from kubecell.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler")

UNTRUSTED = "UntrustedAllocation"
"""The reason of the Warning Event on a pod whose record kubecell does not believe."""


class Restorer:
    """Restores a new engine's running jobs from the pods' records."""

    def __init__(self, mirror: Mirror, actions: Actions, intake: Intake, gate: NodeGate, names: frozenset[str]) -> None:
        self.mirror = mirror
        self.actions = actions
        self.intake = intake
        self.gate = gate
        self.names = names
        self._gangs: dict[str, list[tuple[dict[str, Any], PodDemand]]] = {}
        self._views: Mapping[str, NodeView] = {}
        self._adopted: dict[str, tuple[list[str], dict[str, int], dict[str, int],
                                       list[tuple[dict[str, Any], PodDemand]]]] = {}
        """Job name -> (its pods' uids, their member groups, each recorded pod's member index, its pods)."""
        self._pins: dict[str, tuple[str, frozenset[str] | None]] = {}
        """Job name -> (the one model an ElasticJob's gang runs on, what its pods accept) (``one_model``)."""
        self._running: dict[str, list[str]] = {}
        """Job name -> the engine's external holds of its bound members while its unbound ones wait (``_hold``)."""
        self._forfeited: set[str] = set()
        """The uids of the pods forfeited in this restore: each once, however many paths find it."""
        self._forfeits: list[Member] = []
        """Bound pods whose records agree on where they run but not on whose work they are (``trust.forfeited``):
        each is restored alone, as opportunistic work, once every believed job runs again."""
        self._now = 0.0

    def restore(self, state: Tracking, now: float | None = None) -> None:
        """Every pod with a record it can believe is restored; the rest are held or rolled back (see the
        module docstring). One pod or job that cannot be read never stops the others. ``now``: the wall clock
        (epoch seconds) by default, as the scheduler's cycles run; no record's time is believed past it."""
        by_job: dict[str, list[Member]] = {}
        self._views = state.views
        self._pins.clear()
        self._forfeits.clear()
        self._forfeited.clear()
        self._now = time.time() if now is None else now
        pod_groups = self.mirror.all_podgroups()
        for pod in list(self.mirror.pods.values()):
            if not pods.ours(pod, self.names) or pods.ended(pod):
                continue
            if not (pod["metadata"].get("annotations") or {}).get(ANNOTATION_ALLOCATION):
                continue
            try:
                member = self._read(pod, pod_groups)
            except ApiError:
                raise
            except Exception as error:  # a reader bug costs this pod only
                log.exception("cannot read the record of %s", pods.key(pod))
                self._distrust(pod, f"its record cannot be read ({type(error).__name__})")
                member = None
            if member is not None:
                by_job.setdefault(member.record.job, []).append(member)
        for name, members in by_job.items():
            by_job[name] = self._rightful(name, members)
        for name in self._other_generations(by_job):
            del by_job[name]
        self._gangs = self._gang_pods(by_job, pod_groups)
        # first what runs, in the order it was placed (where a guarantee shrank, the jobs placed first keep its
        # standing): a job all bound is restored, the bound members of one with members still to bind are held
        # where they run; then what was decided and not carried out, judged against all of that (a job with
        # running members first, then the rest, each in the order they were placed)
        bound_first = sorted((name for name, members in by_job.items() if any(m.bound for m in members)),
                             key=lambda name: (placed_at([m for m in by_job[name] if m.bound], self._now), name))
        unbound_only = sorted((name for name, members in by_job.items() if not any(m.bound for m in members)),
                              key=lambda name: (placed_at(by_job[name], self._now), name))
        partly: list[str] = []
        try:
            for name in bound_first:
                if all(m.bound for m in by_job[name]):
                    self._restore_one(state, name, by_job[name])
                else:
                    self._hold(state, name, [m for m in by_job[name] if m.bound])
                    partly.append(name)
            self._restore_forfeits(state)  # what runs too, but counted after every job whose records agree
            for name in [*partly, *unbound_only]:
                self._let_go(state, name)
                self._restore_one(state, name, by_job[name])
            self._restore_forfeits(state)  # the bound members of a job found to make no job among them
        finally:
            for name in list(self._running):
                self._let_go(state, name)

    def _restore_forfeits(self, state: Tracking) -> None:
        while self._forfeits:
            member = self._forfeits.pop(0)
            self._restore_one(state, member.record.job, [member])

    def _restore_one(self, state: Tracking, name: str, members: list[Member]) -> None:
        try:
            self._job(state, name, members)
        except ApiError:
            raise  # the API server is away: the caller rebuilds once it is back
        except Exception:
            log.exception("cannot restore %s; its pods are held as found", name)

    def _hold(self, state: Tracking, name: str, bound: Sequence[Member]) -> None:
        """Hold what the bound members of job ``name`` run on (as their records say) while records on pods not
        bound yet are judged before the job itself is restored (``_job``, which restores the job with them)."""
        held = self._running.setdefault(name, [])
        for member in bound:
            record = member.record
            gpus = held_indices(state, record)
            milli = record.gpu_milli if gpus else 0
            try:
                request = Request(f"restoring:{pods.key(member.pod)}@{pods.uid(member.pod)}",
                                  cpu_milli=record.cpu_milli, memory_mib=record.memory_mib, gpu_count=len(gpus),
                                  gpu_milli=milli,
                                  gpu_memory_mib=record.gpu_memory_mib if gpus and milli < MILLI_PER_GPU else 0)
                held.append(state.engine.hold_external(request, record.node, gpus).name)
            except Exception as error:  # where it cannot be held as recorded, its job cannot be either (``_adopt``)
                log.warning("%s: cannot hold %s while records are judged: %s", name, pods.key(member.pod), error)

    def _let_go(self, state: Tracking, name: str) -> None:
        for held in self._running.pop(name, []):
            state.engine.release_external(held)

    def _rightful(self, name: str, members: list[Member]) -> list[Member]:
        """The members of the one gang or pod alone whose job ``name`` is; the records of others that name it too are
        disowned (``_disown``). Each record names its own pod's job (``trust``), yet a gang's name is its pods' to
        choose: a group named ``<pod>@<uid8>`` (or ``<group>#<n>``) gives its pods' records the name of another
        pod's (or gang's) job, and believing them would make them members of that job, in its VC and class. A pod
        alone's name holds its own uid, so it is never another's; else the gang whose name it is with a generation,
        as kubecell names gangs."""
        owners: dict[tuple[bool, str], list[Member]] = {}
        for member in members:
            group = member.demand.group
            owner = (False, pods.uid(member.pod)) if group is None else (True, group.key)
            owners.setdefault(owner, []).append(member)
        if len(owners) == 1:
            return members
        base = name.rpartition("#")[0]
        rightful = min(owners, key=lambda owner: (owner[0], owner[1] != base, owner[1]))
        for owner, others in owners.items():
            if owner != rightful:
                whose = (f"gang {rightful[1]}" if rightful[0]
                         else f"pod {pods.key(owners[rightful][0].pod)} alone")
                for member in others:
                    self._disown(member, f"names job {name!r}, which is the job of {whose}")
        return owners[rightful]

    def _other_generations(self, by_job: Mapping[str, list[Member]]) -> list[str]:
        """The job names of a gang that kubecell cannot have written beside one it can: their records are disowned
        (``_disown``). Intake forms a gang's next generation (``<key>#<n+1>``) while an earlier one runs when more
        pods of its group come, so several well-formed generations restore as several jobs, each of its own recorded
        pods (``_gang_pods``). Before, each was made of every pod of the gang, and the last restored took the
        others' pods in ``pod_job``: the first's pods, once ended, never finished it, and its GPUs stayed held. A
        name not of kubecell's form (the bare key, ``#0``, ``#01``, a non-ASCII digit) is kept only where the gang
        has no other: then the one holding the pod the API server created first."""
        named: dict[str, list[str]] = {}
        for name, members in by_job.items():
            group = members[0].demand.group
            if group is not None:
                named.setdefault(group.key, []).append(name)
        dropped = []
        for key, names in named.items():
            if len(names) < 2:
                continue
            ours = [name for name in names if generation_of(key, name) is not None]
            kept = set(ours) or {min(names, key=lambda name: (oldest_created(by_job[name]), name))}
            for name in sorted(set(names) - kept):
                dropped.append(name)
                rightful = ", ".join(repr(n) for n in sorted(kept))
                for member in by_job[name]:
                    self._disown(member, f"names job {name!r}, which kubecell does not name a job of gang {key} "
                                         f"beside {rightful}")
        return dropped

    def _gang_pods(self, by_job: Mapping[str, list[Member]], pod_groups: Mapping[tuple[str, str], Mapping[str, Any]]
                   ) -> dict[str, list[tuple[dict[str, Any], PodDemand]]]:
        """Every pod of each recorded gang's job, by job name (``restore_members.gang_pods``)."""
        candidates = (pod for pod in self.mirror.pods.values() if pods.ours(pod, self.names))
        return gang_pods(by_job, candidates, lambda pod: self._demand(pod, pod_groups))

    def _read(self, pod: dict[str, Any], pod_groups: Mapping[tuple[str, str], Mapping[str, Any]]) -> Member | None:
        bound = bool(pods.node_of(pod))
        if not bound and (pods.is_done(pod) or pods.gated(pod)):
            why = "the pod is being deleted" if pods.is_done(pod) else "the pod still has scheduling gates"
            self._roll_back(pod, f"its allocation record is not carried out: {why}")
            return None
        if bound and (pods.terminating(pod)
                      or not pods.holds(pod, release_terminating=self.intake.release_terminating)):
            return None  # leaving (evicted by a shrink or preemption): no member of its job; held while it holds
        try:
            record = pods.record_of(pod)
        except RecordError as error:
            self._distrust(pod, str(error))
            return None
        if record is None:
            return None
        try:
            demand = self._demand(pod, pod_groups)
        except (DemandError, ClaimsPending) as error:
            self._distrust(pod, f"allocation record {record.allocation_id} cannot be checked: {error}")
            return None
        problem = placement_disagreement(pod, record, demand)
        if problem is not None:
            self._distrust(pod, f"allocation record {record.allocation_id} {problem}")
            return None
        if bound:  # the CPU and memory kubecell reserved, as the instance that placed it counts them: an owner's
            # resize in place (past the node, or making its gang's pods differ) neither unseats nor reshapes it
            demand = replace(demand, request=replace(demand.request, cpu_milli=record.cpu_milli,
                                                     memory_mib=record.memory_mib))
        problem = standing_disagreement(pod, record, demand, default_vc=self.intake.default_vc)
        if problem is not None:
            self._disown(Member(pod, record, demand), problem)
            return None
        return Member(pod, record, demand)

    def _disown(self, member: Member, problem: str) -> None:
        """A record that names a job which is not its pod's own to join: a bound pod forfeits its standing (it
        runs where its record says), an unbound one loses the record."""
        if member.bound:
            self._forfeit(member, problem)
        else:
            self._distrust(member.pod, f"allocation record {member.record.allocation_id} {problem}")

    def _forfeit(self, member: Member, problem: str) -> None:
        """A bound pod whose record agrees on where it runs and what it holds, but not on its gang, VC, isolation or
        class (its owner edited them while it ran), or whose job its pods no longer make (``_adopt``): alone, as
        opportunistic work in the record's VC, on the GPUs and with the isolation its node gives it
        (``trust.forfeited``). If even that cannot be held (the GPUs are another job's), it is held as another
        scheduler's pod, as before."""
        if pods.uid(member.pod) in self._forfeited:
            return  # its lone job is what could not be restored: held as another scheduler's pod
        self._forfeited.add(pods.uid(member.pod))
        record = forfeited(member.record, member.pod)
        demand = replace(member.demand, group=None, vc=record.vc, priority=OPPORTUNISTIC, isolation=record.isolation)
        self._forfeits.append(Member(member.pod, record, demand))
        self._warn(member.pod, f"allocation record {member.record.allocation_id} {problem}; kubecell keeps the pod "
                               f"where it runs, alone and as opportunistic work of virtual cluster {record.vc!r} "
                               "(reclaimed first), until it ends")

    def _demand(self, pod: dict[str, Any], pod_groups: Mapping[tuple[str, str], Mapping[str, Any]]) -> PodDemand:
        """What the pod asks for, its DRA claims included (a record is checked against the claims' GPUs)."""
        demand = pod_demand(pod, pod_groups=pod_groups)
        claims = self.intake.claims
        return claims.apply(pod, demand, self._views) if claims is not None else demand

    def _distrust(self, pod: dict[str, Any], why: str) -> None:
        """A record kubecell does not believe: a bound pod is held where it runs (by ``Intake``, as another
        scheduler's pod), a pod not bound yet loses the record and is decided again."""
        node = pods.node_of(pod)
        if node:
            self._warn(pod, f"{why}; kubecell does not use this record and counts the pod as another scheduler's "
                            f"on {node} (its GPUs as whole GPUs) until it ends")
        else:
            self._roll_back(pod, f"{why}; the record was removed and the pod is scheduled again")

    def _roll_back(self, pod: dict[str, Any], why: str) -> None:
        try:
            retry("roll back a record", lambda: self.actions.clear_record(pod))
        except ApiError as error:
            if error.unavailable:
                raise
            log.warning("record of %s not removed: %s", pods.key(pod), error)
        self._warn(pod, why)

    def _warn(self, pod: dict[str, Any], message: str) -> None:
        """A Warning Event, once per pod and message across rebuilds."""
        uid = pods.uid(pod)
        if self.intake.record_warnings.get(uid) == message:
            return
        self.intake.record_warnings[uid] = message
        log.warning("%s: %s", pods.key(pod), message)
        self.actions.event(pod, "Warning", UNTRUSTED, message)

    # ------------------------------------------------------------------ one recorded job
    def _job(self, state: Tracking, name: str, members: list[Member]) -> None:
        bound = [m for m in members if m.bound]
        unbound = [m for m in members if not m.bound]
        why_not = why_not_forward(state, self.intake, members, unbound) if unbound else None
        if why_not is not None:
            for member in unbound:
                self._roll_back(member.pod, f"allocation record {member.record.allocation_id} not carried out: "
                                            f"{why_not}; the record was removed and the pod is scheduled again")
            unbound = []
        chosen = [*bound, *unbound]
        if not chosen:
            return
        job = self._adopt(state, name, chosen)
        if job is None and unbound:
            for member in unbound:
                self._roll_back(member.pod, f"allocation record {member.record.allocation_id} not carried out: "
                                            "its capacity is no longer free; the record was removed and the pod is "
                                            "scheduled again")
            unbound = []
            job = self._adopt(state, name, bound) if bound else None
        if job is None:
            return  # its bound pods are held where they run, as another scheduler's pods
        if unbound:
            refused = class_refused(state, job, unbound[0].record)
            if refused is not None:
                self._undo(state, name, unbound, refused)
                return
        self._finish(state, name, bound, unbound)

    def _adopt(self, state: Tracking, name: str, members: Sequence[Member]) -> Job | None:
        """The job restored from ``members`` as recorded, or None (nothing changed) where it cannot be. A gang's
        spec is made of all its pods that exist now (its headcount, for growth, is no more than that)."""
        first = members[0]
        group = first.demand.group
        gang = self._gangs.get(name, []) if group is not None else []
        if not any(pods.uid(pod) == pods.uid(first.pod) for pod, _ in gang):
            gang = [(m.pod, m.demand) for m in members]
        try:
            nodes, _ = self.intake.allowed_nodes(state, [m.pod for m in members])
        except InvalidInputError:
            nodes = None  # it runs where its record says; a malformed constraint only stops new placements
        minimum = group.minimum if group is not None else None
        submitted = min(pods.created(pod) for pod, _ in gang)
        try:
            size = len(gang)
            spec, parts = gang_spec(name, gang, size, minimum and min(minimum, size), first.record.vc, submitted, nodes)
            if group is not None and group.maximum is not None and group.maximum > size and not parts:
                size = group.maximum  # an elastic gang of one shape may grow to its maximum again (one of several
                spec, parts = gang_spec(name, gang, size, minimum and min(minimum, size), first.record.vc,  # shapes
                                        submitted, nodes)  # is as many pods as it has, as intake forms it)
        except InvalidInputError as error:
            log.error("cannot restore %s: %s", name, error)
            for member in members:  # what its pods now say makes no job: each runs on where it runs, alone
                if member.bound:
                    self._forfeit(member, f"cannot be restored as job {name!r}: {error}")
            return None
        # as granted (a share placed by use), and with what the history says of it, as intake gave it: the
        # co-location rule judges the shares already on a GPU by their families' use, before a restart and after
        knowledge = self.intake.knowledge
        granted = [m.record.gpu_milli for m in members if m.record.gpus]
        advice = knowledge.share_milli(first.pod) if knowledge is not None and granted else None
        restored = as_granted(spec, granted, advice)
        if restored is spec and not spec.groups and spec.member.is_share and granted \
                and 0 < max(granted) < spec.member.gpu_milli:
            why = f"its family's advice is {advice}" if advice else "no job history advises a share for its family"
            log.warning("%s: its record grants %d milli-GPU of the %d it asks, but %s: counted at %d", name,
                        max(granted), spec.member.gpu_milli, why, spec.member.gpu_milli)
        spec = informed(restored, first.pod, knowledge)
        pinned = one_model(state, spec, members) if group is not None and group.maximum is not None \
            and elastic_owner(first.pod) is not None else None
        if pinned is not None:  # an ElasticJob's gang runs on one model: the one its members run on
            spec = on_one_model(spec, pinned)
            self._pins[name] = (pinned, first.demand.request.gpu_models)
        indices = member_indices(spec, parts, members)
        running = [RunningMember(indices[pods.uid(m.pod)], m.record.node, held_indices(state, m.record))
                   for m in members]
        started = placed_at(members, self._now)  # a record's time within its pod's life: never in the future
        try:
            job = state.engine.restore(spec, running, JobClass(first.record.job_class), started_at=started)
        except InvalidInputError as error:
            log.error("cannot restore %s as recorded: %s", name, error)
            return None
        self._adopted[name] = ([pods.uid(pod) for pod, _ in gang], parts, indices, gang)
        return job

    def _undo(self, state: Tracking, name: str, unbound: list[Member], why: str) -> None:
        """A rolled-forward decision that is not one kubecell would make: nothing of it is carried out. Its
        unbound records are removed; members already bound are held where they run."""
        state.engine.cancel(name, 0.0)
        self.intake.retire_name(name, unbound[0].demand.group is not None, [pods.uid(m.pod) for m in unbound])
        for member in unbound:
            self._roll_back(member.pod, f"allocation record {member.record.allocation_id} not carried out: {why}; "
                                        "the record was removed and the pod is scheduled again")

    def _allocate_claims(self, member: Member) -> None:
        """Before a rolled-forward Binding, the pod's DRA claims are allocated as its record says (a claim
        written before the crash is found as it should be and left alone)."""
        claims = self.intake.claims
        if claims is None:
            return
        try:
            plans = claims.plan(member.pod, member.record, self._views)
        except KubecellError as error:
            raise ClaimConflict(str(error)) from None
        retry("allocate claims", lambda: claims.allocate(member.pod, plans))

    def _finish(self, state: Tracking, name: str, bound: list[Member], unbound: list[Member]) -> None:
        """Track the restored job, and bind the members whose records were all written before a crash."""
        members = [*bound, *unbound]
        group = members[0].demand.group
        uids, parts, indices, gang = self._adopted[name]
        isolation = members[0].demand.isolation
        pinned, models = self._pins.pop(name, (None, None))
        tracked = Tracked(name, group.key if group else None, uids,
                          {indices[pods.uid(m.pod)]: pods.uid(m.pod) for m in members}, isolation=isolation,
                          part_of=parts, isolation_of={pods.uid(p): d.isolation for p, d in gang
                                                       if d.isolation != isolation}, pinned=pinned, models=models)
        state.track(tracked)
        self.intake.note_generation(tracked)
        if group is not None and group.maximum is not None:
            job = state.engine.jobs[name]
            if not job.spec.heterogeneous:
                state.engine.limit_growth(name, tracked.spare(job.spec))  # it binds only the pods that exist
            tracked.elastic = elastic_owner(members[0].pod)
        for member in bound:
            self.gate.note_bound(state, member.pod)
            tracked.bound.add(pods.uid(member.pod))
        for member in unbound:
            try:
                self._allocate_claims(member)
                retry("bind", lambda m=member: self.actions.bind(m.pod, m.record.node))
            except ClaimConflict as conflict:
                self._undo(state, name, [m for m in unbound if pods.uid(m.pod) not in tracked.bound],
                           f"its claims cannot be allocated ({conflict})")
                for uid in state.untrack(name):
                    self.mirror.changed[uid] = None
                return
            except ApiError as error:
                if error.unavailable:
                    raise
                if not (error.conflict and self.actions.bound_to(member.pod, member.record.node)):
                    self._undo(state, name, [m for m in unbound if pods.uid(m.pod) not in tracked.bound],
                               f"its Binding was refused ({error})")
                    for uid in state.untrack(name):
                        self.mirror.changed[uid] = None
                    return
            tracked.bound.add(pods.uid(member.pod))
