"""Extender mode's own state: the decisions waiting for kube-scheduler's bind, and the nodes its filters left.

In extender mode the engine decides as in the standalone scheduler, but nothing is written when it decides:
kube-scheduler asks to bind later (or never). ``Holds`` keeps each decision until then and writes it when
asked (``commit``), gives back what nobody asked about (``release_stale``), and remembers, per pod, the
nodes kube-scheduler's own filters left once they ruled out the node kubecell chose (``limit``), which
the next decision for the pod must respect.

The loop knows none of this. ``attach`` plugs ``Holds`` into three typed extension points: the binder's
decision sink (``Binder.sink``: decisions are kept instead of written), intake's per-pod node limit
(``Intake.node_limit``) and the loop's per-cycle hook (``Scheduler.before_cycle``). Everything kept belongs
to one engine's ``Tracking``: when the scheduler rebuilds (a new ``Tracking`` object), it is dropped, as
the old engine's decisions are (nothing held survives a rebuild, and nothing needs to: records are written
at bind, so the new engine is rebuilt from what is bound).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from kubecell.core.engine.job import JobPhase
from kubecell.scheduler.binder import Binder, Outcome, Plan
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.jobs import Tracked
from kubecell.scheduler.scheduler import Scheduler
from kubecell.scheduler.tracking import Planned, Tracking

HOLD_SECONDS = 60.0
"""How long a decision waits for kube-scheduler's bind before its GPUs are given back."""

_LIVE = (JobPhase.RUNNING, JobPhase.RESERVED)


@dataclass
class Held:
    """A decision not written yet, waiting for kube-scheduler to ask for its bind."""

    tracked: Tracked
    """The job's pods when it was decided: a job forgotten since (its pods ended, it was withdrawn and formed
    anew) has another or none, and its decision is void."""
    planned: list[Planned]
    direct: bool
    """A single member: its Binding carries the record."""
    touched: float
    """When kube-scheduler last asked about it (monotonic); a decision nobody asks about is given back."""


class Holds:
    """The decisions of the scheduler's current engine waiting for kube-scheduler's bind, and the nodes its
    filters left per pod.

    Bound to one ``Tracking`` at a time, the scheduler's current one (``current``): when that is replaced (a
    rebuild), everything kept is dropped with the engine it was about. It is the binder's ``DecisionSink``
    (``take``, ``keeps``, ``dropped``, ``released``), intake's node limit (``nodes_for``) and the loop's per-cycle hook
    (``release_stale``); the verbs ask it the rest (``touch``, ``keeps``, ``limit``, ``commit``). Everything
    runs on the scheduler thread, where the current tracking is the one the binder and intake work on."""

    def __init__(self, binder: Binder, mirror: Mirror, current: Callable[[], Tracking | None], *,
                 max_age: float = HOLD_SECONDS) -> None:
        self.binder = binder
        self.mirror = mirror
        """The pods as the scheduler mirrors them: the node limits of pods that are gone are dropped."""
        self.current = current
        """The scheduler's tracking now (None before its first rebuild, or without a node)."""
        self.max_age = max_age
        self._state: Tracking | None = None
        self._held: dict[str, Held] = {}
        """Job name -> its decision, written when kube-scheduler asks to bind."""
        self._filter_nodes: dict[str, frozenset[str]] = {}
        """Pod uid -> the nodes kube-scheduler's own filters left for it, once they ruled out the node kubecell
        chose (pod affinity, ports, volumes: rules kubecell does not evaluate)."""

    def _bound(self) -> Tracking | None:
        """The current tracking; a new one (a rebuild) starts with nothing held or limited."""
        state = self.current()
        if state is not self._state:
            self._state, self._held, self._filter_nodes = state, {}, {}
        return state

    def _get(self, name: str) -> tuple[Tracking, Held] | None:
        """Job ``name``'s decision, if one is held and its job is still the one tracked under that name."""
        state = self._bound()
        held = self._held.get(name)
        if state is None or held is None:
            return None
        if state.tracked.get(name) is not held.tracked:
            del self._held[name]  # the job was forgotten (``Tracking.untrack``): its decision went with it
            return None
        return state, held

    # ------------------------------------------------------------------ the binder's decision sink
    def take(self, plans: Sequence[Plan], victims: set[str]) -> bool:
        """Keep every new decision (its pods hold their members from now on, a preemptor waits for its
        victims); nothing is written until kube-scheduler asks to bind. Never changes the engine."""
        state = self._bound()
        assert state is not None, "the binder decides only for a current engine"
        for job, planned, direct in plans:
            self.binder.assign(state, job, planned, victims)
            self._held[job.name] = Held(state.tracked[job.name], planned, direct, time.monotonic())
        return False

    def keeps(self, name: str) -> bool:
        """Whether job ``name``'s decision waits here for kube-scheduler's bind."""
        return self._get(name) is not None

    def dropped(self, name: str) -> None:
        """The binder gave the job back to the queue: its decision is void."""
        self._bound()
        self._held.pop(name, None)

    def released(self, name: str, uids: set[str]) -> None:
        """A shrink released the members these pods were to hold: they leave the decision kept for the job."""
        found = self._get(name)
        if found is None:
            return
        held = found[1]
        held.planned = [item for item in held.planned if item[1] not in uids]
        if not held.planned:
            del self._held[name]

    # ------------------------------------------------------------------ intake's node limit
    def nodes_for(self, uid: str) -> frozenset[str] | None:
        """The nodes kube-scheduler's filters left for pod ``uid`` (None: no limit)."""
        self._bound()
        return self._filter_nodes.get(uid)

    # ------------------------------------------------------------------ the loop's per-cycle hook
    def release_stale(self) -> bool:
        """Give back decisions kube-scheduler has not asked about for ``max_age`` seconds (its filter chose no
        node of ours, the pod went elsewhere, or kube-scheduler is gone), so GPUs are never held for a pod
        that will not come; forget the node limits of pods that are gone. True when one was given back."""
        state = self._bound()
        for uid in [uid for uid in self._filter_nodes if uid not in self.mirror.pods]:
            del self._filter_nodes[uid]
        if state is None:
            return False
        now, released = time.monotonic(), False
        for name in list(self._held):
            found, job = self._get(name), state.engine.jobs.get(name)
            if found is None:
                continue
            if job is None or job.phase not in _LIVE:
                del self._held[name]
            elif now - found[1].touched > self.max_age and not state.waiting_victims.get(name):
                self.binder.requeue(state, name, f"kube-scheduler did not bind it within {self.max_age:.0f} s")
                released = True
        return released

    # ------------------------------------------------------------------ the verbs
    def touch(self, name: str) -> None:
        """kube-scheduler asked about job ``name``: its decision, if held, is not stale."""
        found = self._get(name)
        if found is not None:
            found[1].touched = time.monotonic()

    def limit(self, uids: Sequence[str], nodes: Sequence[str]) -> None:
        """kube-scheduler's filters left only ``nodes`` for these pods: their next decision keeps within them."""
        self._bound()
        for uid in uids:
            self._filter_nodes[uid] = frozenset(nodes)

    def commit(self, name: str) -> str | Future[Outcome] | None:
        """Write the decision held for job ``name`` now (kube-scheduler asked to bind one of its pods): a
        gang's records on every member, then every member's Binding, so kube-scheduler never binds part of a
        gang. Returns why it could not, or None once every member is bound; for a pod alone, the Binding
        (carrying its record) is sent without blocking the scheduler thread and its future returned (the
        caller waits on it; the outcome reaches the engine through the binder's ``settled``)."""
        found = self._get(name)
        job = found[0].engine.jobs.get(name) if found is not None else None
        if found is None or job is None or job.phase not in _LIVE:
            self._held.pop(name, None)
            return f"kubecell holds no placement for {name} (it was released; kube-scheduler will ask again)"
        state, held = found
        if state.waiting_victims.get(name):
            return f"{name} waits for {len(state.waiting_victims[name])} preempted pod(s) to leave"
        if held.direct and job.phase == JobPhase.RUNNING:  # a pod alone: its Binding carries the record
            (_, uid, pod, record), = held.planned
            waiting = self.binder.holding(state, record.node, pod)
            if waiting is not None:  # kube-scheduler asks again after its back-off; the decision stays held
                held.touched = time.monotonic()
                return (f"{record.node} serves one GPU pod at a time: waiting for its node agent to acknowledge "
                        f"{waiting}")
            del self._held[name]
            item = (name, uid, pod, record.node, record)
            self.binder.admit(state, [item])  # free: it goes now, and marks the node in flight if it serialises
            return self.binder.send(state, item)
        del self._held[name]
        self.binder.write(state, [Plan(job, held.planned, held.direct)], set(), wait=True)
        tracked = state.tracked.get(name)
        missing = [uid for _, uid, _, _ in held.planned if tracked is None or uid not in tracked.bound]
        return f"{len(missing)} of {len(held.planned)} member(s) of {name} could not be bound" if missing else None


def attach(scheduler: Scheduler, *, max_age: float | None = None) -> Holds:
    """Make ``scheduler`` keep its decisions for kube-scheduler's bind: ``Holds`` becomes its binder's
    decision sink, its intake's node limit and its per-cycle hook. Call before the loop decides anything
    (the composition root does, before the loop runs). A scheduler attached to already keeps its ``Holds``
    (every ``Extender`` of one scheduler sees the same decisions), and its ``max_age`` unless one is given;
    ``max_age`` defaults to ``HOLD_SECONDS``."""
    sink = scheduler.binder.sink
    if isinstance(sink, Holds):
        if max_age is not None:
            sink.max_age = max_age
        return sink
    holds = Holds(scheduler.binder, scheduler.mirror, lambda: scheduler.state,
                  max_age=HOLD_SECONDS if max_age is None else max_age)
    scheduler.intake.node_limit = holds.nodes_for
    scheduler.before_cycle = holds.release_stale
    scheduler.binder.sink = holds  # last: the other two are in place once decisions are kept
    return holds
