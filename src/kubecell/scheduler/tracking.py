"""What the scheduler knows about the engine's work in Kubernetes terms, for as long as one engine lives.

A rebuild starts a new ``Tracking`` with its new engine: nothing here outlives the engine it describes,
so no stale correspondence between jobs and pods can survive a rebuild. A mode with state of its own (the
extender's decisions waiting for kube-scheduler's bind) keeps it beside, bound to one ``Tracking`` object and
dropped when it sees another, so the loop and this bag never know of it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubecell.core.engine.engine import Engine
from kubecell.kube.constraints import ConstraintCache
from kubecell.kube.dialects import PodDemand
from kubecell.kube.inventory import NodeView
from kubecell.kube.records import AllocationRecord
from kubecell.scheduler.jobs import Tracked

Planned = tuple[int, str, dict[str, Any], AllocationRecord]
"""(member index, pod uid, pod, record) for one member a job newly holds."""


@dataclass
class Tracking:
    """One engine, the nodes it was built from, and which pods are which jobs."""

    engine: Engine
    views: Mapping[str, NodeView]
    tracked: dict[str, Tracked] = field(default_factory=dict)
    """Engine job name -> its pods."""
    pod_job: dict[str, str] = field(default_factory=dict)
    """Pod uid -> the name of the job it belongs to."""
    external: dict[str, str] = field(default_factory=dict)
    """Uid of a pod another scheduler bound -> the engine allocation that holds its resources."""
    external_claims: dict[str, str] = field(default_factory=dict)
    """Key of a ResourceClaim someone else allocated on kubecell's devices -> the engine allocation holding them."""
    waiting_victims: dict[str, set[str]] = field(default_factory=dict)
    """A RESERVED job -> uids of its victims' pods that still exist (it binds once they are gone)."""
    gathering: dict[str, dict[str, tuple[dict[str, Any], PodDemand]]] = field(default_factory=dict)
    """Gang key -> the pods (by uid) that name it and are not a job yet, while the gang is incomplete."""
    gathered_in: dict[str, str] = field(default_factory=dict)
    """Pod uid -> the gang key it is gathered under (so a pod that changes or leaves is found at once)."""
    constraints: ConstraintCache = field(default_factory=ConstraintCache)
    """Which nodes pods with a given nodeSelector, node affinity and tolerations may use, for the node
    generation below (its answers are dropped when a node's labels, taints or state change)."""
    node_generation: int = 0
    """Bumped whenever nodes change in place (``Scheduler._update_nodes``): the constraint cache's generation."""
    excluded_by_constraints: dict[str, str] = field(default_factory=dict)
    """Job name -> why its node constraints rule nodes out, in kube-scheduler's words (for why-pending)."""
    deferred: dict[str, deque[tuple[str, str, dict[str, Any], str, AllocationRecord | None]]] = field(
        default_factory=dict)
    """Node -> Bindings waiting for the node agent to acknowledge the pod bound before them (``gate``)."""
    inflight: dict[str, str] = field(default_factory=dict)
    """Node -> uid of the GPU pod bound there that its agent has not acknowledged yet (``gate``)."""
    isolation_nodes: dict[str, tuple[frozenset[str] | None, str]] = field(default_factory=dict)
    """Isolation mode -> the nodes that can give it to a GPU pod (None: all) and why the others cannot; the
    views live as long as this object, so each mode is worked out once (``intake.isolation_nodes``)."""

    by_group: dict[str, set[str]] = field(default_factory=dict)
    """Gang key -> the names of the jobs formed under it that are tracked (a pod arriving later is checked
    against them, ``Intake._formed``)."""

    def track(self, tracked: Tracked) -> None:
        self.tracked[tracked.name] = tracked
        if tracked.group is not None:
            self.by_group.setdefault(tracked.group, set()).add(tracked.name)
        for uid in tracked.pod_uids:
            self.pod_job[uid] = tracked.name

    def untrack(self, name: str) -> list[str]:
        """Forget a job; returns its pods, which the caller must look at again (they may form a new job), and the
        victims it still waited for (no longer anyone's capacity: they are held again while they terminate)."""
        tracked = self.tracked.pop(name, None)
        victims = self.waiting_victims.pop(name, set())
        self.excluded_by_constraints.pop(name, None)
        if tracked is None:
            return sorted(victims)
        if tracked.group is not None:
            names = self.by_group.get(tracked.group)
            if names is not None:
                names.discard(name)
                if not names:
                    del self.by_group[tracked.group]
        for uid in tracked.pod_uids:
            if self.pod_job.get(uid) == name:
                del self.pod_job[uid]
        return [*tracked.pod_uids, *sorted(victims - set(tracked.pod_uids))]

    def victim_uids(self) -> set[str]:
        """Pods kubecell evicted that a preemptor still waits for: their capacity is the preemptor's now, so
        they are never held again as someone else's work while they terminate."""
        if not self.waiting_victims:
            return set()
        return set().union(*self.waiting_victims.values())

    def ungather(self, uid: str) -> str | None:
        """Take a pod out of the gang it was gathered under; returns that gang's key."""
        key = self.gathered_in.pop(uid, None)
        if key is not None:
            members = self.gathering.get(key)
            if members is not None:
                members.pop(uid, None)
                if not members:
                    del self.gathering[key]
        return key
