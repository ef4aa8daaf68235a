"""The four extender verbs, answered by the scheduler's own engine on the scheduler thread.

kubecell runs the same loop as ``kubecell scheduler`` (mirror, engine, allocation records), with one
difference: a decision is not written when the engine makes it but held (``kubecell.scheduler.extender.holds``)
until kube-scheduler asks to bind. So the policy measured in the simulator decides here too:

* **filter** brings the engine up to date with the pod and answers with the one node the engine chose for
  it, or, while it waits, fails every node with the engine's reason, which kube-scheduler puts into the
  pod's ``PodScheduled`` condition. When
  kube-scheduler's own filters (pod affinity, ports, volumes: rules kubecell does not evaluate) already
  ruled out the engine's node, the decision is given back and the pod placed again among the nodes
  they left.
* **prioritize** scores the chosen node ``MaxExtenderPriority`` and every other 0, so with
  kube-scheduler's score plugins disabled for the profile (the sample configuration) kubecell decides
  even where several nodes pass the filter.
* **bind** writes the decision: the allocation record and Binding of a pod alone, or every record of a
  gang and then every member's Binding. kube-scheduler binds one pod at a time; kubecell never lets it
  bind part of a gang, since the first member's bind binds them all (later members' binds find their pod
  bound and succeed) and a gang is only ever decided whole.
* **the pod a request names is read from the API server, never taken from the request.** The endpoint
  answers whoever reaches its port, and a request's pod is whatever its sender wrote: taken as it came, a
  made-up pod of any namespace, VC and priority was placed (and preempted other tenants' pods for its
  room) and stayed in the mirror until the next relist, as no watch event ever ends a pod that never
  existed. Where the watch has not shown the pod yet, it is read by the namespace and name the request
  gives (off the scheduler thread) and used only if its uid is the one asked about.
* **preempt** names no victims: kubecell's engine chooses victims itself and evicts them through the
  Eviction API (honouring PodDisruptionBudgets), as the standalone scheduler does; letting kube-scheduler
  also delete pods on its own count, which ignores GPU shares, would evict the wrong work.
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from kubecell.core.engine.job import JobPhase
from kubecell.core.shown import shown
from kubecell.kube import pods
from kubecell.kube.names import MANAGED_RESOURCES
from kubecell.kube.rest import ApiError
from kubecell.kube.watch import Event
from kubecell.scheduler.binder import Outcome, member_index
from kubecell.scheduler.extender.holds import Holds, attach
from kubecell.scheduler.scheduler import Scheduler
from kubecell.scheduler.tracking import Tracking

MANAGED = frozenset(MANAGED_RESOURCES)
MAX_REASON_CHARS = 512
"""The longest reason a failed node is given (kube-scheduler shows it in the pod's ``PodScheduled`` condition)."""
MAX_NAMESPACE = 63
MAX_NAME = 253
"""Kubernetes' bounds on a namespace (a DNS label) and a pod's name (a DNS subdomain)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Filter's answer: the nodes that pass, and why the others fail (unresolvable: no retry helps)."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


class Extender:
    """The verbs, each run on the scheduler thread through ``Scheduler.call``. Making one attaches the
    scheduler's ``Holds`` (``holds.attach``): make it before the loop decides anything."""

    def __init__(self, scheduler: Scheduler, *, timeout: float = 4.0, hold_seconds: float | None = None) -> None:
        self.scheduler = scheduler
        self.timeout = timeout
        """Longest wait for the scheduler thread; below kube-scheduler's default 5 s extender timeout."""
        self.holds: Holds = attach(scheduler, max_age=hold_seconds)
        """The decisions waiting for kube-scheduler's bind, and the nodes its filters left per pod; a decision
        is given back after ``hold_seconds`` without a question from kube-scheduler (default ``HOLD_SECONDS``,
        or what an earlier ``Extender`` of the scheduler set)."""

    # ------------------------------------------------------------------ verbs (any thread)
    def filter(self, pod: dict[str, Any], candidates: list[str]) -> Verdict:
        s = self.scheduler
        read: dict[str, Any] | None = None
        if s.state is not None and pods.uid(pod) not in s.mirror.pods and pods.ours(pod, s.options.names) \
                and pods.asks_for_any(pod, MANAGED):
            known = self._known(pod)  # kube-scheduler saw the pod before the watch did: the cluster's copy
            if isinstance(known, str):
                return self._fail(candidates, known)
            read = known
        return self.scheduler.call(lambda: self._filter(pod, read, candidates), self.timeout)

    def _known(self, asked: dict[str, Any]) -> dict[str, Any] | str:
        """The pod the request names as the cluster has it: the mirror's copy, else the API server's (read
        here, off the scheduler thread: kube-scheduler saw the pod before the watch did) when its uid is the
        one asked about; else why it is not known."""
        uid = pods.uid(asked)
        mirrored = self.scheduler.mirror.pods.get(uid)
        if mirrored is not None:
            return mirrored
        meta = asked.get("metadata") or {}
        namespace, name = meta.get("namespace", "default"), meta.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str) or not 0 < len(namespace) <= MAX_NAMESPACE \
                or not 0 < len(name) <= MAX_NAME:  # (echoed into a reason per candidate node: bounded)
            return "the request's pod has no namespace and name a pod can have"
        try:
            found = self.scheduler.kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as error:
            return (f"kubecell finds no pod {namespace}/{name}" if error.not_found else
                    f"kubecell cannot read pod {namespace}/{name} now ({error.reason or error.status})")
        if pods.uid(found) != uid:
            return f"pod {namespace}/{name} is not the one asked about (its uid is another)"
        return pods.trimmed(found)

    def prioritize(self, pod: dict[str, Any], candidates: list[str]) -> dict[str, int]:
        return self.scheduler.call(lambda: self._prioritize(pod, candidates), self.timeout)

    def bind(self, uid: str, node: str) -> str:
        """Bind the pod as decided; returns the error, empty when bound. A pod alone's Binding is awaited
        here, off the scheduler thread, which goes on deciding (kube-scheduler binds in parallel)."""
        answer = self.scheduler.call(lambda: self._bind(uid, node), self.timeout)
        if isinstance(answer, str):
            return answer
        try:
            _, _, _, error = answer.result(self.timeout)
        except FutureTimeout:
            return f"the Binding of pod {uid} did not complete within {self.timeout:.0f} s"
        if error is None:  # a 409 counts only once the pod was read bound to this node (Binder._bind_one)
            return ""
        return f"the API server refused the Binding: {error}"

    # ------------------------------------------------------------------ on the scheduler thread
    def _filter(self, asked: dict[str, Any], read: dict[str, Any] | None, candidates: list[str]) -> Verdict:
        """``read``: the pod as the API server had it, where the mirror lacked it. The request's own pod
        (``asked``) decides only answers that change nothing (another scheduler's pod, a pod without GPUs)."""
        s = self.scheduler
        uid = pods.uid(asked)
        pod = s.mirror.pods.get(uid) or read or asked
        name = (pod.get("spec") or {}).get("schedulerName", "default-scheduler")
        if not pods.ours(pod, s.options.names):
            served = ", ".join(sorted(s.options.names))
            why = (f"kubecell's extender places pods of schedulerName {served}; this pod's is {shown(name)} "
                   f"(serve it with --scheduler-names)")
            return Verdict([], {}, dict.fromkeys(candidates, why))
        if not pods.asks_for_any(pod, MANAGED):
            return Verdict(list(candidates), {}, {})  # asks for no GPU: nothing for kubecell to decide
        if uid not in s.mirror.pods:  # kube-scheduler saw the pod before our watch did
            if read is None:  # (no engine when asked: nothing was read, and nothing is taken from the request)
                return self._fail(candidates, "kubecell has no engine yet (reading the cluster, or no GPU node)"
                                  if s.state is None else "kubecell has not seen this pod yet")
            s.mirror.apply(Event("pods", "ADDED", read))
        for _ in range(2):
            self._catch_up()
            state = s.state
            if state is None:
                return self._fail(candidates, "kubecell has no engine yet (reading the cluster, or no GPU node)")
            verdict = self._where(state, uid, candidates)
            if verdict is not None:
                return verdict
        return self._fail(candidates, "kubecell is placing the pod again within the nodes kube-scheduler left")

    def _where(self, state: Tracking, uid: str, candidates: list[str]) -> Verdict | None:
        """The verdict for a pod the engine knows; None when its decision was given back to place it
        again (the caller catches up and asks once more)."""
        s = self.scheduler
        mirrored = s.mirror.pods.get(uid)
        bound = pods.node_of(mirrored) if mirrored is not None else ""
        if bound:
            return Verdict([bound], {}, {}) if bound in candidates else self._fail(
                candidates, f"already bound to {bound}")
        name = state.pod_job.get(uid)
        if name is None:
            told = s.teller.told.get(uid)
            return self._fail(candidates, told[0] if told else "kubecell has not taken this pod up yet")
        job = state.engine.jobs[name]
        node = self._node_of(state, name, uid)
        # Only nodes kubecell places on narrow a pod's next decision, and never to none: the port answers whoever
        # reaches it, and a filter naming a node that does not exist stranded the pod it named (by uid) for good.
        known = frozenset(n for n in candidates if n in state.engine.book.index)
        limited = self.holds.nodes_for(uid)
        if limited is not None and known and known != limited and job.phase == JobPhase.PENDING:
            self.holds.limit(state.tracked[name].pod_uids, sorted(known))  # the latest filter's nodes, not the
            s.intake.renew(state, name)  # first's: a limit someone set is lifted by kube-scheduler's next ask
            s.dirty = True
            return None
        if job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED) or node is None:
            reason = job.wait_reason
            excluded = state.excluded_by_constraints.get(name)
            return self._fail(candidates, reason + (f" (its node constraints rule out {excluded})" if excluded else ""))
        self.holds.touch(name)
        victims = state.waiting_victims.get(name)
        if victims:
            return self._fail(candidates, f"placed on {node}; waiting for {len(victims)} preempted pod(s) to leave")
        if node in candidates:
            return Verdict([node], {}, {})
        if not self.holds.keeps(name):
            return self._fail(candidates, f"kubecell placed it on {node}, which kube-scheduler's filters rule out")
        if not known:
            return self._fail(candidates, f"kubecell placed it on {node}; none of the nodes asked about is one it "
                                          "places on")
        self.holds.limit(state.tracked[name].pod_uids, sorted(known))
        s.intake.renew(state, name)
        s.dirty = True
        return None

    def _prioritize(self, pod: dict[str, Any], candidates: list[str]) -> dict[str, int]:
        state, uid = self.scheduler.state, str((pod.get("metadata") or {}).get("uid", ""))
        name = state.pod_job.get(uid) if state is not None else None
        chosen = self._node_of(state, name, uid) if state is not None and name is not None else None
        return {node: 10 if node == chosen else 0 for node in candidates}

    def _bind(self, uid: str, node: str) -> str | Future[Outcome]:
        s = self.scheduler
        self._catch_up()
        state, pod = s.state, s.mirror.pods.get(uid)
        if pod is None:
            return f"kubecell does not know pod {uid} (deleted, or not shown by its watch yet)"
        bound = pods.node_of(pod)
        if bound:
            return "" if bound == node else f"{pods.key(pod)} is already bound to {bound}"
        name = state.pod_job.get(uid) if state is not None else None
        if state is None or name is None:
            return f"kubecell holds no placement for {pods.key(pod)}; kube-scheduler will ask again"
        chosen = self._node_of(state, name, uid)
        if chosen != node:
            return f"kubecell placed {pods.key(pod)} on {chosen or 'no node yet'}, not {node}"
        if name in state.tracked and uid in state.tracked[name].bound:
            return ""
        return self.holds.commit(name) or ""

    # ------------------------------------------------------------------ helpers
    def _catch_up(self) -> None:
        """Apply what the scheduler has not yet (the pod just added, a renewed job) and run a cycle."""
        s = self.scheduler
        if s.needs_rebuild:
            return
        s.reconcile()
        s.cycle()

    @staticmethod
    def _node_of(state: Tracking, name: str, uid: str) -> str | None:
        tracked = state.tracked.get(name)
        if tracked is None:
            return None
        member = next((index for index, holder in tracked.members.items() if holder == uid), None)
        if member is None:
            return None
        for allocation in state.engine.queries.allocations_of(name):
            if member_index(allocation) == member:
                return allocation.node
        return None

    @staticmethod
    def _fail(candidates: list[str], reason: str) -> Verdict:
        """Every candidate fails with ``reason``, cut to ``MAX_REASON_CHARS``: it is repeated per node, and a
        reason that echoed a request's 8 KB name made a 0.5 MB request a 416 MB answer."""
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS - 1] + "…"
        return Verdict([], dict.fromkeys(candidates, reason), {})

