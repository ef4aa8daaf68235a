"""How far running elastic jobs grow into the capacity the engine offers them, decided by the allocator the
simulator measures (``allocator.KubecellElasticPolicy``), so that a cluster sizes its jobs by the rule whose
figures against Sia docs/elastic.md reports.

The engine decides *whether* a member fits (``Engine.headroom``: guarantee room, borrow limit, cells,
topology, allowed nodes, the resize interval), places it, and takes members back when capacity is claimed
(shrink before preemption, newest first). What it cannot say is whether another member is worth a restart,
nor which job's growth is worth more when several want the same idle GPUs. The allocator answers both when it
is handed the jobs as they run:

* each job keeps its GPU type (a move to another type is the engine's business, not a resize) and may grow by
  at most its own headroom;
* per type, the idle member slots are the largest headroom any job of that type reports (jobs of different
  VCs may see different room; each is capped by its own, so the allocator never gives one more than the
  engine would place, and two raised into the same idle GPUs are settled by the engine: the pods that do not
  fit wait and are given back);
* new members are priced on fresh nodes (``node_slots`` members per node), not beside the job's members.

Only the count is read from the answer, and never below what a job runs: where members go is the engine's
choice, and shrinking is the engine's (a claim, a priority), not a resize the allocator may start. The
allocator keeps its state between decisions (restart counts, prices), so one instance serves every call.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kubecell.core.elastic.allocator import KubecellElasticPolicy
from kubecell.core.elastic.types import ClusterNode, ElasticJobView, GoodputEstimate


@dataclass(frozen=True, slots=True)
class GrowthCandidate:
    """A running elastic job the engine could grow now, as the allocator needs it."""

    name: str
    gpu_type: str
    """The type of all its members (a job across types is not a candidate: its goodput has no one price)."""
    nodes: tuple[str, ...]
    """The node of each member it runs."""
    room: int
    """More members the engine could place for it now (``Engine.headroom``)."""
    minimum: int
    maximum: int
    submitted: float
    attained_member_seconds: float
    """Its attained service, for the allocator's least-attained-service order."""
    last_resize: float | None
    restart_seconds: float
    estimate: GoodputEstimate
    node_slots: int
    """How many of its members one node of its type holds at most."""


@dataclass(frozen=True, slots=True)
class GrowthChoice:
    target: int
    reason: str


def plan_growth(policy: KubecellElasticPolicy, now: float,
                candidates: Sequence[GrowthCandidate]) -> dict[str, GrowthChoice]:
    """The size each candidate should grow to (at least what it runs) and the allocator's reason."""
    nodes: list[ClusterNode] = []
    views: list[tuple[GrowthCandidate, ElasticJobView]] = []
    for gpu_type in sorted({c.gpu_type for c in candidates}):
        group = [c for c in candidates if c.gpu_type == gpu_type]
        held = Counter(node for c in group for node in c.nodes)
        nodes += [ClusterNode(_held(gpu_type, node), gpu_type, count) for node, count in sorted(held.items())]
        idle = max(max(c.room, 0) for c in group)
        slots = max(max(c.node_slots, 1) for c in group)
        nodes += [ClusterNode(f"{gpu_type}/+idle-{i}", gpu_type, min(slots, idle - i * slots))
                  for i in range(math.ceil(idle / slots))]
        for c in group:
            size = len(c.nodes)
            views.append((c, ElasticJobView(
                name=c.name, submitted=c.submitted, min_replicas=max(1, min(c.minimum, size)),
                max_replicas=max(size, min(c.maximum, size + max(c.room, 0))),
                current=tuple(_held(gpu_type, node) for node in c.nodes), last_resize=c.last_resize,
                attained_gpu_seconds=c.attained_member_seconds, restart_seconds=c.restart_seconds,
                estimate=c.estimate, gpu_types=frozenset({gpu_type}))))
    if not views:
        return {}
    decision = policy.allocate(now, [view for _, view in views], nodes)
    choices = {}
    for c, view in views:
        size = len(c.nodes)
        count = len(decision.get(c.name, view.current))
        reason = policy.last_reasons.get(c.name, "")
        if count < size:
            reason = f"kept {size}: the allocator would run it on {count} ({reason}), but only the engine shrinks"
        choices[c.name] = GrowthChoice(max(size, min(count, view.max_replicas)), reason)
    return choices


def _held(gpu_type: str, node: str) -> str:
    """A node's name in the allocator's cluster: per type, as a node may run CPU members and GPU members (and
    ``+``, which no Kubernetes name holds, keeps the idle slots' names apart from real ones)."""
    return f"{gpu_type}/{node}"
