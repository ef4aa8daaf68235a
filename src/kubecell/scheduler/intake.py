"""Keeping the engine's jobs in step with the pods: new pods become jobs, ended pods end them.

Only the pods that changed since the last step are looked at (the mirror collects their uids), so a
step costs what changed, not what exists: with 50,000 pods in the cluster a step that saw ten events
reads ten pods. A rebuild marks every pod changed, which is the full scan a fresh engine needs.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from kubecell.core.engine.job import JobPhase, JobSpec
from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.kube import pods
from kubecell.kube.dialects import DemandError, PodDemand, pod_demand
from kubecell.kube.elasticjobs import ElasticRef, elastic_owner
from kubecell.kube.inventory import NodeView
from kubecell.kube.records import MAX_JOB_CHARS
from kubecell.scheduler.claims import ClaimBroker, ClaimsDeferred, ClaimsPending
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.foreign_holds import foreign_hold, gpus_only
from kubecell.scheduler.jobs import (
    Tracked,
    gang_disagreement,
    gang_ready,
    gang_spec,
    groups_for,
    job_name,
    job_spec,
    on_one_model,
)
from kubecell.scheduler.knowledge import Knowledge, informed
from kubecell.scheduler.teller import Teller
from kubecell.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler")

Pin = Callable[[Tracking, ElasticRef, JobSpec], str | None]
"""(state, the ElasticJob, the gang's job as its pods ask) -> the one GPU model the gang runs on, or None."""

NodeLimit = Callable[[str], frozenset[str] | None]
"""Pod uid -> the nodes the pod is limited to beyond its own constraints in the current engine, or None for
no limit (extender mode: the nodes kube-scheduler's own filters left for it)."""


class Intake:
    """Turns changed pods into engine calls (submit, finish, cancel, hold for another scheduler)."""

    def __init__(self, mirror: Mirror, teller: Teller, *, scheduler_name: str | frozenset[str], default_vc: str,
                 resources: frozenset[str] | None = None, release_terminating: bool = False) -> None:
        self.mirror = mirror
        self.teller = teller
        self.scheduler_name = scheduler_name
        self.default_vc = default_vc
        self.resources = resources
        """Extender mode: only pods asking for one of these are kubecell's (kube-scheduler sends no other
        to its extender; the rest it places alone, and kubecell holds them like any foreign pod)."""
        self.release_terminating = release_terminating
        """Free a bound pod's resources when its deletion starts instead of when it is gone (``pods.holds``)."""
        self.knowledge: Knowledge | None = None
        """What the job history says of a pod's family (``scheduler.knowledge``); None: nothing."""
        self.place_by_use = False
        """Place a share at the share its family needs, within what it asked (``knowledge.informed``)."""
        self.node_limit: NodeLimit | None = None
        """A further per-pod limit on the nodes a job may use (``allowed_nodes``), set by a mode that learns
        one the pod's spec does not say: the extender, from kube-scheduler's own filters."""
        self.generations: dict[str, int] = {}
        """Gang key -> how many jobs were formed under it (job names stay unique across re-formations);
        also pod uid -> how many times a pod alone was made a new job (``renew``)."""
        self.claims: ClaimBroker | None = None
        """Reads pods' DRA ResourceClaims (None: the scheduler ignores claims, as before DRA)."""
        self.claim_waiters: dict[str, set[str]] = {}
        """Claim key -> uids of the pods waiting for that claim to be created (from their template)."""
        self.deferred: dict[str, bool] = {}
        """Uids of pods whose claims' selectors wait for the next pass (``ClaimsDeferred``) -> whether theirs
        used the last pass's time (those go after the others, so that no claim keeps the time to itself)."""
        self.record_warnings: dict[str, str] = {}
        """Pod uid -> the last Warning Event about its allocation record (``restore``): told once, not at every
        rebuild."""
        self.pin: Pin | None = None
        """The GPU model an ElasticJob's gang whose pods accept several runs on, chosen as the gang forms
        (``scheduler.elastic_types``); None: such a gang is left to the engine (which may mix models)."""

    def note_generation(self, tracked: Tracked) -> None:
        """A restored gang's generation, so the next one formed under its key gets a new name. Its name is its
        record's, which may be the bare key (a group named ``a#b``): that is no generation."""
        base, _, suffix = tracked.name.rpartition("#")
        if tracked.group is not None and base == tracked.group and suffix.isdecimal() and len(suffix) < 10:
            generation = int(suffix)
            self.generations[tracked.group] = max(self.generations.get(tracked.group, 0), generation)

    def reconcile(self, state: Tracking, changed: MutableMapping[str, None], groups_changed: bool,
                  now: float) -> bool:
        """Apply the pods ``changed`` (uids, in the order they changed) to the engine; True if it changed."""
        if groups_changed:  # a PodGroup's minimum or queue may change what each of its pods asks for
            for uid, pod in self.mirror.pods.items():
                if uid not in state.pod_job and self.ours(pod) and not pods.node_of(pod):
                    changed[uid] = None
        dirty = False
        if self.deferred:  # after the pods changed since: a claim's long selectors do not delay a new claim's
            waiting, self.deferred = self.deferred, {}
            for uid in sorted(waiting, key=waiting.__getitem__):
                changed.pop(uid, None)
                changed[uid] = None
        claims_changed = self.mirror.take_claims_changed()
        for key in claims_changed:
            changed.update(dict.fromkeys(self.claim_waiters.pop(key, ())))
        if self.claims is not None and claims_changed:
            dirty |= self.claims.hold_foreign(state, claims_changed, self.ours)
        for name in dict.fromkeys(state.pod_job[uid] for uid in changed if uid in state.pod_job):
            dirty |= self._check_job(state, name, changed, now)
        for uid in changed:
            if uid not in self.mirror.pods:
                self.teller.forget(uid)
                self.generations.pop(uid, None)
                self.record_warnings.pop(uid, None)
        dirty |= self._sync_external(state, changed)
        if self.claims is None:
            dirty |= self._submit_new_pods(state, changed)
        else:
            with self.claims.selector_pass():
                dirty |= self._submit_new_pods(state, changed)
        return dirty

    def retire_name(self, name: str, gang: bool, uids: Sequence[str]) -> None:
        """A job name the engine holds and will not run (a restored decision undone): the next job formed for
        the same gang or pod gets a later generation, since the engine never takes a name twice."""
        base, _, suffix = name.rpartition("#")
        generation = int(suffix) if base and suffix.isdecimal() and len(suffix) < 10 else 0
        if gang:
            key = base or name
            self.generations[key] = max(self.generations.get(key, 0), generation)
        else:
            for uid in uids:
                self.generations[uid] = max(self.generations.get(uid, 0), generation + 1)

    def renew(self, state: Tracking, name: str) -> None:
        """Withdraw job ``name`` and let its pods form a new job at the next reconcile (extender mode: its
        pods' allowed nodes changed, which a job's spec cannot). A pod alone gets a new generation in its
        job name, since the engine never takes a name twice."""
        state.engine.cancel(name, time.time())
        tracked = state.tracked.get(name)
        if tracked is not None and tracked.group is None:
            for uid in tracked.pod_uids:
                self.generations[uid] = self.generations.get(uid, 0) + 1
        for uid in state.untrack(name):
            self.mirror.changed[uid] = None

    def ours(self, pod: Mapping[str, Any]) -> bool:
        if not pods.ours(pod, self.scheduler_name):
            return False
        return self.resources is None or pods.asks_for_any(pod, self.resources)

    def _check_job(self, state: Tracking, name: str, changed: MutableMapping[str, None], now: float) -> bool:
        """End a job whose pods ended, cancel a waiting job that lost a pod, forget a dead one."""
        engine, tracked = state.engine, state.tracked[name]
        job = engine.jobs[name]
        if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED):
            for uid in [uid for uid in tracked.released if uid not in self.mirror.pods]:  # gone for good
                tracked.released.discard(uid)
                tracked.pod_uids.remove(uid)
                state.pod_job.pop(uid, None)
            if any(self._holding(uid) for uid in tracked.members.values()):
                if tracked.elastic is not None:
                    self._release_lost(state, name, now)
                return False
            engine.finish(name, now)
        elif job.phase == JobPhase.PENDING and not all(self._waiting(uid) for uid in tracked.pod_uids):
            engine.cancel(name, now)  # a pod of a waiting job left: form the job again from what is left
        elif job.phase in (JobPhase.REJECTED, JobPhase.FINISHED, JobPhase.CANCELLED) and \
                not any(self._waiting(uid) for uid in tracked.pod_uids):
            state.untrack(name)
            return False
        else:
            return False
        for uid in state.untrack(name):
            changed[uid] = None  # the pods left over may form a new job
        return True

    def _release_lost(self, state: Tracking, name: str, now: float) -> None:
        """An ElasticJob's workers that ended or were deleted while the job runs on (its controller followed a
        lowered target, replaced a failed worker, or the training finished on some first): their members are
        released so the capacity is free at once and the job's pods are counted right (``Tracked``)."""
        tracked = state.tracked[name]
        lost = {index: uid for index, uid in tracked.members.items() if not self._holding(uid)}
        if not lost or not state.engine.release_members(
                name, [f"{name}/{index}" for index in lost], now, "their pods ended or were deleted"):
            return
        for index, uid in lost.items():
            del tracked.members[index]
            tracked.bound.discard(uid)
            if uid in self.mirror.pods:
                tracked.released.add(uid)  # an ended pod never holds a member again
            else:
                tracked.pod_uids.remove(uid)
                state.pod_job.pop(uid, None)
        job = state.engine.jobs[name]
        if not job.spec.heterogeneous:
            state.engine.limit_growth(name, tracked.spare(job.spec))
        log.info("%s: released the members of %d ended or deleted pod(s)", name, len(lost))

    def _holding(self, uid: str) -> bool:
        """A member's pod still holds what the engine gave it: bound and not ended (a terminating pod holds
        until it is gone), or not bound yet and not withdrawn (its Binding is on its way, or its decision
        waits for kube-scheduler's bind in extender mode)."""
        pod = self.mirror.pods.get(uid)
        if pod is None:
            return False
        if pods.node_of(pod):
            return pods.holds(pod, release_terminating=self.release_terminating)
        return not pods.is_done(pod)

    def _waiting(self, uid: str) -> bool:
        """A pod of a waiting job still waits: it exists, nobody bound it, and it is neither ended nor being
        deleted."""
        pod = self.mirror.pods.get(uid)
        return pod is not None and not pods.node_of(pod) and not pods.is_done(pod)

    def _sync_external(self, state: Tracking, changed: Mapping[str, None]) -> bool:
        """Hold what pods bound by anyone else take (CPU, memory, and their GPUs as whole GPUs: a share
        another scheduler granted is not one kubecell can see), and free it when they end."""
        engine, dirty = state.engine, False
        victims = state.victim_uids()
        for uid in changed:
            if uid in state.pod_job or uid in victims:
                continue
            pod = self.mirror.pods.get(uid)
            wanted = pod is not None and pods.holds(pod, release_terminating=self.release_terminating)
            if uid in state.external and not wanted:
                engine.release_external(state.external.pop(uid))
                dirty = True
            elif pod is not None and wanted and uid not in state.external and pods.node_of(pod) in engine.book.index:
                held = foreign_hold(pod, f"external:{pods.key(pod)}@{uid[:8]}")
                for hold in (held, gpus_only(held)):  # its GPUs held even where its CPU or memory do not fit
                    try:
                        state.external[uid] = engine.hold_external(hold, pods.node_of(pod)).name
                        dirty = True
                        break
                    except InvalidInputError as error:
                        log.warning("cannot account %s bound by another scheduler%s: %s", pods.key(pod),
                                    "" if hold is held else " (its GPUs alone)", error)
        return dirty

    def _submit_new_pods(self, state: Tracking, changed: Mapping[str, None]) -> bool:
        dirty, touched = False, set()
        pod_groups: dict[tuple[str, str], Mapping[str, Any]] | None = None
        for uid in changed:
            if uid in state.pod_job:
                continue
            left = state.ungather(uid)
            if left is not None:
                touched.add(left)
            pod = self.mirror.pods.get(uid)
            if pod is None or not self.ours(pod) or pods.is_done(pod) or pods.node_of(pod) or pods.gated(pod):
                continue  # a gated pod waits for its gates (PreEnqueue); its update brings it back here
            if pod_groups is None:
                pod_groups = self.mirror.all_podgroups()
            try:
                demand = pod_demand(pod, pod_groups=pod_groups)
                if self.claims is not None:
                    demand = self.claims.apply(pod, demand, state.views)
            except ClaimsDeferred as deferred:
                self.deferred[uid] = deferred.started
                continue
            except ClaimsPending as waiting:
                self.claim_waiters.setdefault(waiting.key, set()).add(uid)
                if waiting.told:
                    self.teller.tell(pod, str(waiting), reason="WaitingForResourceClaim", event=False)
                continue
            except DemandError as error:
                self.teller.tell(pod, str(error), reason="InvalidRequest")
                continue
            except Exception as error:  # a reader bug must cost this pod, never the loop (and every other pod)
                log.exception("cannot read pod %s", pods.key(pod))
                self.teller.tell(pod, unreadable(pod, error), reason="InvalidRequest")
                continue
            if demand.group is None:
                dirty |= self._submit(state, [(pod, demand)], 1, None)
            elif self._join_shrunk(state, pod, demand):
                dirty = True
            else:
                state.gathering.setdefault(demand.group.key, {})[uid] = (pod, demand)
                state.gathered_in[uid] = demand.group.key
                touched.add(demand.group.key)
        for key in sorted(touched):
            dirty |= self._submit_gang(state, key)
        return dirty

    def _submit_gang(self, state: Tracking, key: str) -> bool:
        members = sorted(state.gathering.get(key, {}).values(), key=lambda item: pods.key(item[0]))
        if not members:
            return False
        problem = gang_disagreement(key, [*self._formed(state, key), *members], self.default_vc)
        if problem is not None:  # never guess which pod is right: a gang formed on a wrong size waits forever
            for pod, _ in members:
                self.teller.tell(pod, problem, reason="InvalidGang")
            return False
        ready = gang_ready([demand for _, demand in members])
        if ready is None:
            group = members[0][1].group
            assert group is not None
            waiting = (f"waiting for {group.waiting_for}" if group.waiting_for
                       else f"gang {key}: {len(members)} of {group.size or group.minimum} pods exist")
            for pod, _ in members:  # a PodGroup nobody created is news (an Event); a gang still forming is not
                self.teller.tell(pod, waiting, reason="GangIncomplete", event=group.waiting_for is not None)
            return False
        for pod, _ in members:
            state.ungather(pods.uid(pod))
        return self._submit(state, members, *ready)

    def _join_shrunk(self, state: Tracking, pod: dict[str, Any], demand: PodDemand) -> bool:
        """A new pod of a gang whose job runs below its headcount (a controller replacing the pods a shrink
        evicted, or an ElasticJob's controller following a raised target) joins that job as a pod growth may
        bind, when it asks what one of its member groups asks, in the job's VC, and that group has fewer pods
        than its count (released pods leave ``Tracked.pod_uids`` once gone); the engine may then grow the job
        into it. An elastic gang that waits to start takes it too: it may start with it."""
        assert demand.group is not None
        elastic = demand.group.maximum is not None
        for name in sorted(state.by_group.get(demand.group.key, ())):
            job, tracked = state.engine.jobs[name], state.tracked[name]
            phases = (JobPhase.RUNNING, JobPhase.RESERVED, JobPhase.PENDING) if elastic else \
                (JobPhase.RUNNING, JobPhase.RESERVED)
            if job.phase not in phases or (demand.vc or self.default_vc) != job.vc or tracked.moving:
                continue  # (a gang being moved to another model takes no pod: its replacements form a new job)
            spec = job.spec
            room = [p for p in groups_for(spec, demand, tracked) if tracked.live_pods(p) < spec.member_groups[p].count]
            if not room:
                continue
            uid = pods.uid(pod)
            tracked.pod_uids.append(uid)
            state.pod_job[uid] = name
            if tracked.part_of:
                tracked.part_of[uid] = room[0]
            if demand.isolation != tracked.isolation:
                tracked.isolation_of[uid] = demand.isolation
            state.engine.limit_growth(name, tracked.spare(spec))
            log.info("%s joins %s in place of a pod its shrink released", pods.key(pod), name)
            return True
        return False

    def _formed(self, state: Tracking, key: str) -> list[tuple[dict[str, Any], PodDemand]]:
        """One pod of the job already formed under gang ``key`` (waiting or running), read again: a pod that
        arrives later must agree with it, or it would wait forever for a gang that will never form."""
        for name in sorted(state.by_group.get(key, ())):
            tracked = state.tracked[name]
            if state.engine.jobs[name].phase in (JobPhase.FINISHED, JobPhase.CANCELLED, JobPhase.REJECTED):
                continue
            for uid in tracked.pod_uids:
                pod = self.mirror.pods.get(uid)
                if pod is None:
                    continue
                try:
                    return [(pod, pod_demand(pod, pod_groups=self.mirror.all_podgroups()))]
                except Exception:  # it was read when its job formed; unreadable now, it proves nothing
                    continue
        return []

    def _submit(self, state: Tracking, members: list[tuple[dict[str, Any], PodDemand]], size: int,
                minimum: int | None) -> bool:
        pod, demand = members[0]
        generation = self.generations.get(pods.uid(pod), 0)
        if demand.group is not None:
            generation = self.generations.get(demand.group.key, 0) + 1
        name = job_name(demand, pod, generation)
        # A gang may be named after a pod's job (``<pod>@<uid8>``) and so take that pod's next name (``renew``), or
        # the other way round: the engine refuses a name it has seen, and a Tracked under it is another job's pods.
        while name in state.engine.jobs:
            generation += 1
            name = job_name(demand, pod, generation)
        if demand.group is not None:
            self.generations[demand.group.key] = generation
        vc = demand.vc or self.default_vc
        try:
            if len(name) > MAX_JOB_CHARS:  # else placed each cycle (evicting others for it) and its record refused
                named, shape = ("group", "namespace/group#generation") if demand.group else ("pod", "namespace/pod@uid")
                raise InvalidInputError(f"its job name ({shape}) is {len(name)} characters long, more than an "
                                        "allocation record holds", location=f"pod {pods.key(pod)}",
                                        field=f"{named} name" if demand.group else "metadata.name",
                                        accepted=f"a shorter {named} name: a job name of at most {MAX_JOB_CHARS} "
                                                 "characters")
            nodes, excluded = self.allowed_nodes(state, [p for p, _ in members])
            for mode in sorted({d.isolation for _, d in members if d.request.wants_gpu}):
                known = state.isolation_nodes.get(mode)  # a node that cannot isolate so is ruled out, never degraded
                if known is None:
                    known = state.isolation_nodes[mode] = isolation_nodes(state.views, mode)
                able, unable = known
                if able is not None:
                    nodes = able if nodes is None else nodes & able
                    excluded = ", ".join(filter(None, (excluded, unable)))
            submitted = min(pods.created(p) for p, _ in members)
            parts: dict[str, int] = {}
            if demand.group is None:
                spec = job_spec(name, demand, size, minimum, vc, submitted, nodes)
            else:
                spec, parts = gang_spec(name, members, size, minimum, vc, submitted, nodes)
        except InvalidInputError as error:  # a gang whose pods ask for something no job can be
            for p, _ in members:
                self.teller.tell(p, f"cannot be scheduled: {error}", reason="InvalidRequest")
            return False
        try:
            spec = informed(spec, pod, self.knowledge, place_by_use=self.place_by_use)
        except KubecellError as error:  # what a history says is made of what nodes wrote: the pod goes uninformed,
            log.warning("%s: what the job history says of it is not used: %s", name, error)  # never unscheduled
        owner = elastic_owner(pod) if demand.group is not None and demand.group.maximum is not None else None
        pinned = self.pin(state, owner, spec) if owner is not None and self.pin is not None else None
        if pinned is not None:
            spec = on_one_model(spec, pinned)
        job = state.engine.submit(spec, spec.submit_time)
        isolation_of = {pods.uid(p): d.isolation for p, d in members if d.isolation != demand.isolation}
        tracked = Tracked(name, demand.group.key if demand.group else None, [pods.uid(p) for p, _ in members],
                          isolation=demand.isolation, part_of=parts, isolation_of=isolation_of, pinned=pinned,
                          models=demand.request.gpu_models if pinned is not None else None)
        if demand.group is not None and demand.group.maximum is not None and job.phase == JobPhase.PENDING:
            state.engine.limit_growth(name, tracked.spare(spec))  # an elastic gang binds the pods that exist
            tracked.elastic = owner
        state.track(tracked)
        if excluded:
            state.excluded_by_constraints[name] = excluded
        if job.phase == JobPhase.REJECTED:
            for p, _ in members:
                self.teller.tell(p, f"rejected: {job.wait_reason}", reason="Rejected")
        return True

    def allowed_nodes(self, state: Tracking, members: Sequence[Mapping[str, Any]]) -> tuple[frozenset[str] | None, str]:
        """The nodes every one of the pods may use (None: any), and what rules the others out, as
        kube-scheduler words it ("3 node(s) didn't match Pod's node affinity/selector"); raises
        ``ConstraintError`` (an ``InvalidInputError``) for a malformed constraint."""
        allowed: frozenset[str] | None = None
        reasons: Counter[str] = Counter()
        for pod in members:
            nodes, why = state.constraints.allowed_nodes(pod, self.mirror.nodes, state.node_generation)
            if nodes is not None:
                allowed = nodes if allowed is None else allowed & nodes
                reasons = reasons or why
            left = self.node_limit(pods.uid(pod)) if self.node_limit is not None else None
            if left is not None:  # extender mode: kube-scheduler's own filters ruled out others
                allowed = left if allowed is None else allowed & left
        if allowed is None:
            return None, ""
        return allowed, ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()) if count)


def unreadable(pod: Mapping[str, Any], error: BaseException) -> str:
    """What a pod is told when reading it failed in a way no check foresaw: kubecell skips it and goes on."""
    return (f"pod {pods.key(pod)}: kubecell could not read this pod ({type(error).__name__}: {str(error)[:200]}); "
            "it is skipped until it changes (please report this as a kubecell bug)")


def isolation_nodes(views: Mapping[str, NodeView], mode: str) -> tuple[frozenset[str] | None, str]:
    """The nodes that can give a GPU pod isolation ``mode`` (None: every node can), and why the others cannot,
    counted as kube-scheduler counts ("2 node(s) cannot isolate by mps"). Nodes without GPUs are left to the
    engine, which says they lack GPUs; a node whose GPUs cannot be placed says why (``gpu_note``)."""
    reasons: Counter[str] = Counter()
    able = []
    for name, view in views.items():
        if view.node is None:
            continue
        if view.gpu_note:
            reasons[f"have GPUs kubecell cannot place ({view.gpu_note})"] += 1
        elif view.node.gpus and mode not in view.isolation:
            reasons["give GPUs only as MIG instances (kubecell.io/isolation: mig)" if view.isolation == ("mig",)
                    else f"cannot isolate by {mode}"] += 1
        else:
            able.append(name)
    if not reasons:
        return None, ""
    return frozenset(able), ", ".join(f"{count} node(s) {reason}" for reason, count in sorted(reasons.items()))
