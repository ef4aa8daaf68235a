"""How elastic jobs are sized on a cluster, decided by the allocator the simulator measures
(``allocator.KubecellElasticPolicy``), so that a cluster sizes its jobs by the rule whose figures against Sia
docs/elastic.md reports.

The engine decides *whether* a member fits (``Engine.queries.headroom``, ``Engine.queries.room_on``: guarantee room,
borrow limit, cells, topology, allowed nodes, the resize interval), places it, and takes members back when capacity is
claimed (shrink before preemption, newest first). What it cannot say is whether another member is worth a
restart, which job's growth is worth more when several jobs of a VC want the same GPUs, nor on which GPU type a
job is worth most. The allocator answers all three when it is handed the jobs of one VC, running and waiting
(one allocator per VC: members move between jobs of one VC only, as another VC's capacity is the engine's to
reclaim):

* a running job may grow on its type by its own headroom plus what the other jobs of its VC and type may give
  up now (members above their minimums, none inside the engine's resize interval), or **move** to another type
  it may use where at least its minimum is idle now (all its workers restart there, at the size the allocator
  gives it, at most what is idle: a move never counts on members others would give, since a job that gave up
  its GPUs for them could be left with none), and only where its goodput is higher than where it runs (what it
  frees is nobody's until its workers end, so a move that makes it slower buys others nothing this round);
* a waiting job is **started** on the type the allocator chooses, counting on the idle GPUs and on what other
  jobs of its VC give up (it waits for them, and loses nothing meanwhile);
* per type, the idle member slots are the largest room any job reports there (each job is capped by its own,
  and two raised into the same idle GPUs are settled by the engine: the pods that do not fit wait and are
  given back);
* new members are priced on fresh nodes (``node_slots`` members per node), not beside the job's members.

Only types and counts are read from the answer: where members go is the engine's choice. A job is lowered only
to give members to jobs of its VC whose growth and starts the idle slots cannot cover, the most-served jobs
first; a job the allocator would merely run smaller keeps its members.

A running job without a trusted goodput model (``priced`` False: it never reported, or only what the model
refuses) is not sized by the allocator, which has nothing to price it by, and is never grown here (its driver
gives it the idle room, ``take_the_room``). But the members it took above its minimum are what its VC's jobs
may grow into and start on, as the idle slots are, and they are the first given: before any job that reports
gives (whose members' worth is measured, its unknown), the most-served such job first, down to its minimum,
only as many as the others' growth beyond the idle slots needs, and never inside its resize interval
(``shrinkable`` 0). It cannot thrash: each job changes at most once per resize interval, and a job lowered
so is raised again only into idle room, which the teammate that grew has taken. Before, such a job was no
candidate at all, and a teammate that reports never grew into what it held. Each allocator keeps its state between
decisions (restart counts, prices), so the caller keeps them (``plan_targets``' ``policies``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

from kubecell.core.elastic.allocator import ElasticOptions, KubecellElasticPolicy
from kubecell.core.elastic.types import ClusterNode, ElasticJobView, GoodputEstimate
from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import Job, JobPhase
from kubecell.core.engine.shrink import may_resize, shrinkable


@dataclass(frozen=True, slots=True)
class GrowthCandidate:
    """An elastic job of one GPU type as the allocator needs it: running, or waiting to start."""

    name: str
    vc: str
    """Members move between jobs of one VC only: another VC's capacity is the engine's to reclaim."""
    gpu_type: str
    """The type of all its members ("" while it waits; a job across types is not a candidate: its goodput has
    no one price)."""
    nodes: tuple[str, ...]
    """The node of each member it runs (none while it waits)."""
    room: int
    """More members the engine could place for it now on its own type (``Engine.queries.headroom``)."""
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
    minimum: int = 1
    """The fewest members it runs with (where it starts, or moves to)."""
    rooms: Mapping[str, int] = field(default_factory=dict)
    """Per other GPU type it may use: the members it could run with there if it started there now, giving up
    what it holds (``Engine.queries.room_on``); a type where that is below its minimum is not offered."""
    priced: bool = True
    """Whether ``estimate`` is a goodput model to size it by. A running job without one only gives: its
    ``shrinkable`` members, first, to jobs of its VC that grow or start (see the module); ``estimate`` is not
    read."""


@dataclass(frozen=True, slots=True)
class GrowthChoice:
    target: int
    """The members the job should run: above its size a raise, below it members given to others of its VC."""
    reason: str
    gpu_type: str | None = None
    """The type to run on when it is not the one the job runs on: a move (all its workers restart there) or,
    for a job that waits, where it starts. None: where it is."""


def plan_targets(policies: MutableMapping[str, KubecellElasticPolicy], now: float,
                 candidates: Sequence[GrowthCandidate], *,
                 options: ElasticOptions | None = None) -> dict[str, GrowthChoice]:
    """The size (and, where it changes, the type) each candidate should run at and the allocator's reason; one
    allocator per VC (``policies``, filled as VCs appear with ``options``: each keeps its restart counts and
    prices between calls)."""
    choices: dict[str, GrowthChoice] = {}
    for vc in sorted({c.vc for c in candidates}):
        if vc not in policies:
            policies[vc] = KubecellElasticPolicy(options)
        policy = policies[vc]
        choices.update(_plan_vc(policy, now, [c for c in candidates if c.vc == vc]))
    return choices


@dataclass(slots=True)
class _VcView:
    """One VC's jobs as its allocator sees them, and what each GPU type has to give."""

    types: list[str]
    nodes: list[ClusterNode] = field(default_factory=list)
    """The nodes the jobs hold (named per type, ``_held``) and one node per ``node_slots`` idle slots."""
    views: list[tuple[GrowthCandidate, ElasticJobView]] = field(default_factory=list)
    idle: dict[str, int] = field(default_factory=dict)
    """Per type, the idle member slots: the most any job could be given there."""
    given: dict[str, int] = field(default_factory=dict)
    """Per type, the members its running jobs that report may give up now."""
    spare: dict[str, int] = field(default_factory=dict)
    """Per type, the members its running jobs without a goodput model may give up now (given first)."""
    unpriced: list[GrowthCandidate] = field(default_factory=list)
    """Its running jobs without a goodput model: not the allocator's to size, only givers."""
    slots_of: dict[str, int] = field(default_factory=dict)


def _plan_vc(policy: KubecellElasticPolicy, now: float,
             candidates: Sequence[GrowthCandidate]) -> dict[str, GrowthChoice]:
    vc = _vc_view(candidates)
    if not vc.views:
        return {}
    decision = policy.allocate(now, [view for _, view in vc.views], vc.nodes)
    planned: dict[str, tuple[str, int]] = {}
    for c, view in vc.views:
        placed = decision.get(c.name, view.current)
        planned[c.name] = (placed[0].split("/", 1)[0] if placed else c.gpu_type,
                           min(len(placed), view.max_replicas))
    kept: dict[str, str] = {}
    choices = _starts_and_moves(policy, vc, planned, kept)
    _givers(policy, vc, planned, kept, choices)
    return choices


def _vc_view(candidates: Sequence[GrowthCandidate]) -> _VcView:
    """The allocator's cluster: the nodes the VC's jobs hold, its idle slots per type, and each job's view
    (the sizes and types it may be given)."""
    vc = _VcView(sorted({c.gpu_type for c in candidates if c.gpu_type} | {t for c in candidates for t in c.rooms}))
    vc.unpriced = [c for c in candidates if _gives_only(c)]
    for gpu_type in vc.types:
        group = [c for c in candidates if c.gpu_type == gpu_type and not _gives_only(c)]
        quiet = [c for c in vc.unpriced if c.gpu_type == gpu_type]
        held = Counter(node for c in group for node in c.nodes)
        vc.nodes += [ClusterNode(_held(gpu_type, node), gpu_type, count) for node, count in sorted(held.items())]
        # The idle member slots: the most any job could be given there (its own headroom, or its room there).
        vc.idle[gpu_type] = max([max(c.room, 0) for c in group]
                                + [max(c.rooms[gpu_type], 0) for c in candidates
                                   if c.gpu_type != gpu_type and gpu_type in c.rooms], default=0)
        slots = max([max(c.node_slots, 1) for c in [*group, *quiet]]
                    or [max(max(c.node_slots, 1) for c in candidates)])
        vc.slots_of[gpu_type] = slots
        vc.nodes += [ClusterNode(f"{gpu_type}/+idle-{i}", gpu_type, min(slots, vc.idle[gpu_type] - i * slots))
                     for i in range(math.ceil(vc.idle[gpu_type] / slots))]
        vc.given[gpu_type] = sum(_shrinkable(c) for c in group)
        # what the jobs without a model may give: slots the allocator prices as fresh ones, as the idle slots
        vc.spare[gpu_type] = sum(_shrinkable(c) for c in quiet)
        vc.nodes += [ClusterNode(f"{gpu_type}/+given-{i}", gpu_type, min(slots, vc.spare[gpu_type] - i * slots))
                     for i in range(math.ceil(vc.spare[gpu_type] / slots))]
    for c in candidates:
        if _gives_only(c):
            continue
        size, least = len(c.nodes), max(c.minimum, 1)
        if size:  # a move goes only where its minimum is idle now: it gives up what it runs on for it
            reach = {t: room for t, room in c.rooms.items() if t != c.gpu_type and room >= least}
            reach[c.gpu_type] = (size + max(c.room, 0) + vc.given[c.gpu_type] + vc.spare[c.gpu_type]
                                 - _shrinkable(c))
        else:  # a job that waits may also start on what other jobs of its VC give up
            reach = {t: max(room, 0) + vc.given.get(t, 0) + vc.spare.get(t, 0) for t, room in c.rooms.items()
                     if max(room, 0) + vc.given.get(t, 0) + vc.spare.get(t, 0) >= least}
        if not reach:
            continue  # it waits and no type has room for its minimum: the engine's queue decides
        vc.views.append((c, ElasticJobView(
            name=c.name, submitted=c.submitted, min_replicas=max(1, size - _shrinkable(c)) if size else least,
            max_replicas=max(size, min(c.maximum, max(reach.values()))),
            current=tuple(_held(c.gpu_type, node) for node in c.nodes), last_resize=c.last_resize,
            attained_gpu_seconds=c.attained_member_seconds, restart_seconds=c.restart_seconds,
            estimate=c.estimate, gpu_types=frozenset(reach))))
    return vc


def _starts_and_moves(policy: KubecellElasticPolicy, vc: _VcView, planned: dict[str, tuple[str, int]],
                      kept: dict[str, str]) -> dict[str, GrowthChoice]:
    """The jobs the allocator starts or moves to another type, into the idle slots; a move that cannot be made
    is taken back out of ``planned`` (the job stays where it is) with its reason in ``kept``."""
    choices: dict[str, GrowthChoice] = {}
    free = dict(vc.idle)
    for c, _ in sorted(vc.views, key=lambda item: (bool(item[0].nodes), *_order(item[0]))):
        # Starts first, then moves, each into the idle GPUs left, in least-attained-service order; a move
        # never counts on members others give (it could be left with nothing), a start may (it waits for them).
        gpu_type, count = planned[c.name]
        if count <= 0 or gpu_type == c.gpu_type:
            continue
        if c.nodes:
            count = min(count, free[gpu_type])
            if count < max(c.minimum, 1):
                planned[c.name] = (c.gpu_type, len(c.nodes))
                kept[c.name] = (f"kept {len(c.nodes)} {c.gpu_type}: the allocator would move it to {gpu_type}, "
                                f"where fewer than its minimum are idle now after the jobs before it")
                continue
            slower = _slower_after_move(c, gpu_type, count, vc.slots_of[gpu_type])
            if slower is not None:
                planned[c.name] = (c.gpu_type, len(c.nodes))
                kept[c.name] = slower
                continue
        free[gpu_type] -= min(count, free[gpu_type])
        choices[c.name] = GrowthChoice(count, policy.last_reasons.get(c.name, ""), gpu_type)
    return choices


def _givers(policy: KubecellElasticPolicy, vc: _VcView, planned: Mapping[str, tuple[str, int]],
            kept: Mapping[str, str], choices: dict[str, GrowthChoice]) -> None:
    """The size of every job that stays on its type: raised as planned, or lowered only as far as the growth
    and starts of its VC that the idle slots cannot cover need (the most-served jobs give first)."""
    arriving = Counter[str]()
    for choice in choices.values():
        if choice.gpu_type is not None:
            arriving[choice.gpu_type] += choice.target
    for gpu_type in vc.types:
        stay = [c for c, _ in vc.views if c.gpu_type == gpu_type and c.name not in choices]
        # Members are taken from a job only for growth and starts the idle slots cannot give, the most-served
        # jobs first. (What a job moving away frees is not counted: on a cluster it is free only once its
        # workers have ended.)
        need = (sum(max(planned[c.name][1] - len(c.nodes), 0) for c in stay) + arriving[gpu_type]
                - vc.idle[gpu_type])
        for c in sorted((c for c in vc.unpriced if c.gpu_type == gpu_type), key=_most_served):
            give = min(_shrinkable(c), max(need, 0))  # first: what they hold is worth nothing anyone measured
            need -= give
            if give > 0:
                size = len(c.nodes)
                choices[c.name] = GrowthChoice(size - give, (
                    f"shrunk {size}->{size - give} {gpu_type}: {give} given to jobs of its VC that grow or start; "
                    "no trusted step reports, so what it took above its minimum is given before members whose "
                    "worth is measured"))
        for c in sorted(stay, key=_most_served):
            size, count = len(c.nodes), planned[c.name][1]
            reason = kept.get(c.name) or policy.last_reasons.get(c.name, "")
            if count >= size:
                choices[c.name] = GrowthChoice(count, reason)
                continue
            give = min(size - count, max(need, 0))
            need -= give
            if give == 0:
                reason = (f"kept {size}: the allocator would run it on {count} ({reason}), but no job of its VC "
                          "needs the members; only the engine takes members back otherwise")
            elif give < size - count:
                reason = (f"shrunk {size}->{size - give} {gpu_type}: {give} given to jobs of its VC that grow or "
                          f"start (the allocator would run it on {count}: {reason})")
            choices[c.name] = GrowthChoice(size - give, reason)


def _slower_after_move(candidate: GrowthCandidate, gpu_type: str, count: int, slots: int) -> str | None:
    """Why a running job is kept rather than moved to ``count`` GPUs of ``gpu_type`` where its goodput would be
    lower than where it runs now; None when the move makes it faster, or when either side is unpriced (a type it
    never ran on is worth trying). The allocator may plan such a move so that others get what the job holds, but
    on a cluster what a moving job frees is free only once its workers have ended: nobody gets it this round,
    while the job pays its restart and runs slower. (Measured on Sia's workloads: 9-17 % fewer restarts and every
    Table 3 figure lower over jittered copies; docs/elastic.md.)"""
    size = len(candidate.nodes)
    here = candidate.estimate.goodput(candidate.gpu_type, len(set(candidate.nodes)), size)
    there = candidate.estimate.goodput(gpu_type, math.ceil(count / max(slots, 1)), count)
    if not (math.isfinite(here) and math.isfinite(there)) or here <= 0.0 or there <= 0.0 or there >= here:
        return None
    return (f"kept {size} {candidate.gpu_type}: the allocator would move it to {count} {gpu_type}, where its "
            f"goodput is {1.0 - there / here:.0%} lower; what it frees would be idle until its workers end")


def _order(candidate: GrowthCandidate) -> tuple[float, float, str]:
    """Who moves or starts first when idle GPUs run short: least attained service, then first submitted."""
    return (candidate.attained_member_seconds, candidate.submitted, candidate.name)


def _shrinkable(candidate: GrowthCandidate) -> int:
    return max(0, min(candidate.shrinkable, len(candidate.nodes) - 1))


def _gives_only(candidate: GrowthCandidate) -> bool:
    """A running job without a goodput model: it only gives (see the module)."""
    return not candidate.priced and bool(candidate.nodes)


def _most_served(candidate: GrowthCandidate) -> tuple[float, str]:
    """Who gives first among givers alike: the most attained service."""
    return (-candidate.attained_member_seconds, candidate.name)


def engine_candidate(engine: Engine, job: Job, gpu_type: str, room: int, estimate: GoodputEstimate,
                     restart_seconds: float, now: float, *, rooms: Mapping[str, int] | None = None,
                     attained: float | None = None, priced: bool = True) -> GrowthCandidate:
    """An engine job as the allocator sees it: running (its members' nodes, its room, what it may give up now:
    members above its minimums, none inside the engine's resize interval) or waiting (``gpu_type`` ""), how
    many of its members a node holds, its attained service (``attained``, else members times the seconds of
    its current run: what LAS orders by) and, in ``rooms``, the members it could run with on each other type
    it may use (``Engine.queries.room_on``); ``priced`` False: ``estimate`` is no goodput model (the job only gives).
    Every driver builds its candidates here, so a cluster and the simulator's engine runs size alike."""
    book = engine.book
    running = job.phase == JobPhase.RUNNING
    where = [allocation.node for allocation in engine.queries.allocations_of(job.name)] if running else []
    per_member = job.spec.member.gpu_count
    if per_member > 0:
        sizes = [int(book.gpu_count[book.index[node]]) for node in where] or \
            [int(n) for n in book.gpu_count[book.gpu_count > 0]]
        slots = max((n // per_member for n in sizes), default=1)
    else:  # CPU members: as many per node as the job runs on its fullest node
        slots = max((where.count(node) for node in where), default=1)
    started = job.started_at if job.started_at is not None else now
    interval = engine.options.resize_min_interval_seconds
    return GrowthCandidate(
        name=job.name, vc=job.spec.vc, gpu_type=gpu_type if where else "", nodes=tuple(where),
        room=room if where else 0,
        shrinkable=len(shrinkable(job)) if where and may_resize(job, now, interval) else 0,
        maximum=job.spec.members, submitted=job.spec.submit_time,
        attained_member_seconds=job.size * max(now - started, 0.0) if attained is None else attained,
        last_resize=job.resized_at if where else None, restart_seconds=restart_seconds, estimate=estimate,
        node_slots=max(slots, 1), minimum=job.spec.minimum, rooms=dict(rooms or {}), priced=priced)


def start_type(allowed: Sequence[str], idle: Mapping[str, int], above: Mapping[str, int],
               price: Mapping[str, float], minimum: int) -> str:
    """The GPU type an elastic job whose pods accept several starts on before the allocator has sized it (its
    gang forms, and a gang's members run on one type): of the ``allowed`` types with ``idle`` GPUs for its
    minimum, the one where its goodput ``price`` per GPU is highest; when none has room, the type whose running
    jobs hold the most members ``above`` their minimums (what a job that needs its minimum takes back soonest),
    ties to the better price, then the name. The allocator may start it elsewhere at its next pass."""
    if not allowed:
        raise ValueError("no GPU type to start on")
    roomy = [t for t in allowed if idle.get(t, 0) >= minimum]
    if roomy:
        return max(roomy, key=lambda t: (price.get(t, 0.0), t))
    return max(allowed, key=lambda t: (above.get(t, 0), price.get(t, 0.0), t))


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
