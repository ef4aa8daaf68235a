"""How running elastic jobs are sized on a cluster, decided by the allocator the simulator measures
(``allocator.KubecellElasticPolicy``), so that a cluster sizes its jobs by the rule whose figures against Sia
docs/elastic.md reports.

The engine decides *whether* a member fits (``Engine.headroom``: guarantee room, borrow limit, cells,
topology, allowed nodes, the resize interval), places it, and takes members back when capacity is claimed
(shrink before preemption, newest first). What it cannot say is whether another member is worth a restart,
nor which job's growth is worth more when several jobs of a VC want the same GPUs. The allocator answers both
when it is handed the jobs of one VC as they run (one allocator per VC: members move between jobs of one VC
only, as another VC's capacity is the engine's to reclaim):

* each job keeps its GPU type (a move to another type is not a resize) and may grow by its own headroom plus
  what the other jobs of its VC and type may give up now (members above their minimums, none inside the
  engine's resize interval);
* per type, the idle member slots are the largest headroom any job of that type reports (each job is capped
  by its own, and two raised into the same idle GPUs are settled by the engine: the pods that do not fit wait
  and are given back);
* new members are priced on fresh nodes (``node_slots`` members per node), not beside the job's members.

Only the counts are read from the answer: where members go is the engine's choice. A job is lowered only to
give members to jobs of its VC whose growth the idle slots cannot cover, the most-served jobs first; a job
the allocator would merely run smaller keeps its members. Each allocator keeps its state between decisions
(restart counts, prices), so the caller keeps them (``plan_targets``' ``policies``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

from kubecell.core.elastic.allocator import KubecellElasticPolicy
from kubecell.core.elastic.types import ClusterNode, ElasticJobView, GoodputEstimate
from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import Job
from kubecell.core.engine.shrink import may_resize, shrinkable


@dataclass(frozen=True, slots=True)
class GrowthCandidate:
    """A running elastic job as the allocator needs it."""

    name: str
    vc: str
    """Members move between jobs of one VC only: another VC's capacity is the engine's to reclaim."""
    gpu_type: str
    """The type of all its members (a job across types is not a candidate: its goodput has no one price)."""
    nodes: tuple[str, ...]
    """The node of each member it runs."""
    room: int
    """More members the engine could place for it now (``Engine.headroom``)."""
    shrinkable: int
    """Members it may give up now: down to its minimum, 0 inside the engine's resize interval."""
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
    """The members the job should run: above its size a raise, below it members given to others of its VC."""
    reason: str


def plan_targets(policies: MutableMapping[str, KubecellElasticPolicy], now: float,
                 candidates: Sequence[GrowthCandidate]) -> dict[str, GrowthChoice]:
    """The size each candidate should run at and the allocator's reason; one allocator per VC (``policies``,
    filled as VCs appear: each keeps its restart counts and prices between calls)."""
    choices: dict[str, GrowthChoice] = {}
    for vc in sorted({c.vc for c in candidates}):
        policy = policies.setdefault(vc, KubecellElasticPolicy())
        choices.update(_plan_vc(policy, now, [c for c in candidates if c.vc == vc]))
    return choices


def _plan_vc(policy: KubecellElasticPolicy, now: float,
             candidates: Sequence[GrowthCandidate]) -> dict[str, GrowthChoice]:
    nodes: list[ClusterNode] = []
    views: list[tuple[GrowthCandidate, ElasticJobView]] = []
    idle: dict[str, int] = {}
    for gpu_type in sorted({c.gpu_type for c in candidates}):
        group = [c for c in candidates if c.gpu_type == gpu_type]
        held = Counter(node for c in group for node in c.nodes)
        nodes += [ClusterNode(_held(gpu_type, node), gpu_type, count) for node, count in sorted(held.items())]
        idle[gpu_type] = max(max(c.room, 0) for c in group)
        slots = max(max(c.node_slots, 1) for c in group)
        nodes += [ClusterNode(f"{gpu_type}/+idle-{i}", gpu_type, min(slots, idle[gpu_type] - i * slots))
                  for i in range(math.ceil(idle[gpu_type] / slots))]
        given = sum(_shrinkable(c) for c in group)
        for c in group:
            size = len(c.nodes)
            others = given - _shrinkable(c)  # what the rest of its group could give it
            views.append((c, ElasticJobView(
                name=c.name, submitted=c.submitted, min_replicas=max(1, size - _shrinkable(c)),
                max_replicas=max(size, min(c.maximum, size + max(c.room, 0) + others)),
                current=tuple(_held(gpu_type, node) for node in c.nodes), last_resize=c.last_resize,
                attained_gpu_seconds=c.attained_member_seconds, restart_seconds=c.restart_seconds,
                estimate=c.estimate, gpu_types=frozenset({gpu_type}))))
    if not views:
        return {}
    decision = policy.allocate(now, [view for _, view in views], nodes)
    counts = {c.name: min(len(decision.get(c.name, view.current)), view.max_replicas) for c, view in views}
    choices: dict[str, GrowthChoice] = {}
    for gpu_type in sorted(idle):
        members = [c for c, _ in views if c.gpu_type == gpu_type]
        # Members are taken from a job only for growth the idle slots cannot give, most-served jobs first.
        need = sum(max(counts[c.name] - len(c.nodes), 0) for c in members) - idle[gpu_type]
        for c in sorted(members, key=lambda c: (-c.attained_member_seconds, c.name)):
            size, count = len(c.nodes), counts[c.name]
            reason = policy.last_reasons.get(c.name, "")
            if count >= size:
                choices[c.name] = GrowthChoice(count, reason)
                continue
            give = min(size - count, max(need, 0))
            need -= give
            if give == 0:
                reason = (f"kept {size}: the allocator would run it on {count} ({reason}), but no job of its VC "
                          "needs the members; only the engine takes members back otherwise")
            elif give < size - count:
                reason = (f"shrunk {size}->{size - give} {gpu_type}: {give} given to jobs of its VC that grow (the "
                          f"allocator would run it on {count}: {reason})")
            choices[c.name] = GrowthChoice(size - give, reason)
    return choices


def _shrinkable(candidate: GrowthCandidate) -> int:
    return max(0, min(candidate.shrinkable, len(candidate.nodes) - 1))


def engine_candidate(engine: Engine, job: Job, gpu_type: str, room: int, estimate: GoodputEstimate,
                     restart_seconds: float, now: float) -> GrowthCandidate:
    """A running engine job as the allocator sees it: its members' nodes, its room, what it may give up now
    (members above its minimums, none inside the engine's resize interval), how many of its members a node
    holds, and its attained service (members times the seconds of its current run: what LAS orders by).
    Every driver builds its candidates here, so a cluster and the simulator's engine runs size alike."""
    book = engine.book
    where = [allocation.node for allocation in engine.allocations_of(job.name)]
    per_member = job.spec.member.gpu_count
    if per_member > 0:
        slots = max((int(book.gpu_count[book.index[node]]) // per_member for node in where), default=1)
    else:  # CPU members: as many per node as the job runs on its fullest node
        slots = max((where.count(node) for node in where), default=1)
    started = job.started_at if job.started_at is not None else now
    interval = engine.options.resize_min_interval_seconds
    return GrowthCandidate(
        name=job.name, vc=job.spec.vc, gpu_type=gpu_type, nodes=tuple(where), room=room,
        shrinkable=len(shrinkable(job)) if may_resize(job, now, interval) else 0, maximum=job.spec.members,
        submitted=job.spec.submit_time, attained_member_seconds=job.size * max(now - started, 0.0),
        last_resize=job.resized_at, restart_seconds=restart_seconds, estimate=estimate, node_slots=max(slots, 1))


def take_the_room(size: int, most: int) -> GrowthChoice:
    """A job with no goodput model yet (it has not reported, or only what the model refuses) takes the room:
    idle GPUs help nobody, and members above the minimum are the first a claim takes back, so taking them
    costs other tenants nothing but the claim's shrink."""
    return GrowthChoice(most, f"no trusted step reports yet: takes the idle capacity ({size} -> {most} members; "
                              "members above its minimum are the first a claim takes back)")


def _held(gpu_type: str, node: str) -> str:
    """A node's name in the allocator's cluster: per type, as a node may run CPU members and GPU members (and
    ``+``, which no Kubernetes name holds, keeps the idle slots' names apart from real ones)."""
    return f"{gpu_type}/{node}"
