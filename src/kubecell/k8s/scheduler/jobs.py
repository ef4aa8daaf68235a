"""Pods as the engine's jobs: a pod alone, or the pods of one gang.

The engine knows jobs by name and members by index; Kubernetes knows pods by uid. ``Tracked`` keeps the
correspondence: which pods make up a job, and which pod holds which member. Names are unique for the
engine's lifetime (a pod recreated under the same name, or a gang formed again after it ended, is a new
job), because the engine keeps ended jobs and refuses a second job with a name it has seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kubecell.core.engine.job import OPPORTUNISTIC_PRIORITY, JobSpec
from kubecell.core.model import Request, TopologyLevel
from kubecell.k8s.dialects import PodDemand
from kubecell.k8s.scheduler import pods


@dataclass
class Tracked:
    """One engine job and its pods."""

    name: str
    group: str | None
    pod_uids: list[str]
    members: dict[int, str] = field(default_factory=dict)
    """Member index -> uid of the pod that holds it (a record was written for it)."""
    bound: set[str] = field(default_factory=set)
    isolation: Literal["accounting", "mps", "mig"] = "accounting"
    """What its pods asked for (``kubecell.io/isolation``), written into their records for the node agent."""

    def free_pods(self) -> list[str]:
        """Pods of the job that hold no member yet, in a stable order."""
        holding = set(self.members.values())
        return [uid for uid in self.pod_uids if uid not in holding]


def job_name(demand: PodDemand, pod: Mapping[str, Any], generation: int) -> str:
    """``ns/pod@uid8`` for a pod alone (``ns/pod@uid8#n`` when it is placed again as a new job, see
    ``Intake.renew``), ``ns/group#n`` for the n-th gang formed under a group key."""
    if demand.group is not None:
        return f"{demand.group.key}#{generation}"
    base = f"{pods.key(pod)}@{pods.uid(pod)[:8]}"
    return f"{base}#{generation}" if generation else base


def job_spec(name: str, demand: PodDemand, members: int, minimum: int | None, vc: str, submitted: float,
             nodes: frozenset[str] | None = None) -> JobSpec:
    """The engine's job for ``members`` pods that each ask for ``demand.request``.

    A topology level inside a node (nvlink, numa) constrains each member's own GPUs; a level at or above
    the node (node, rack, zone) constrains where the whole gang goes. ``nodes`` are the only nodes its
    pods may use (their selectors, node affinity and tolerations; None: any)."""
    base = demand.request
    level = base.topology
    inside_node = level is not None and level < TopologyLevel.NODE
    member = Request(name=name, cpu_milli=base.cpu_milli, memory_mib=base.memory_mib, gpu_count=base.gpu_count,
                     gpu_milli=base.gpu_milli, gpu_memory_mib=base.gpu_memory_mib, gpu_models=base.gpu_models,
                     topology=level if members == 1 or inside_node else None)
    topology = level if members > 1 and not inside_node else None
    priority = OPPORTUNISTIC_PRIORITY if demand.opportunistic else max(demand.priority, 0)
    return JobSpec(name=name, vc=vc, member=member, members=members, min_members=minimum, priority=priority,
                   topology=topology, submit_time=submitted, nodes=nodes)


def gang_ready(demands: Sequence[PodDemand]) -> tuple[int, int] | None:
    """(headcount, minimum) once every pod of a gang exists, else None.

    A gang waits for all the pods its headcount names, even a threshold gang that may start with fewer:
    the engine grows a gang into members that must have pods to bind. A PodGroup states only a minimum;
    its headcount is the pods that name it once the minimum exists."""
    group = demands[0].group
    if group is None or group.waiting_for is not None or group.minimum is None:
        return None
    present = len(demands)
    if group.size is not None:
        return (group.size, group.minimum) if present >= group.size else None
    return (present, group.minimum) if present >= group.minimum else None
