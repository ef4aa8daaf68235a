"""Pods as the engine's jobs: a pod alone, or the pods of one gang.

The engine knows jobs by name and members by index; Kubernetes knows pods by uid. ``Tracked`` keeps the
correspondence: which pods make up a job, and which pod holds which member. Names are unique for the
engine's lifetime (a pod recreated under the same name, or a gang formed again after it ended, is a new
job), because the engine keeps ended jobs and refuses a second job with a name it has seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kubecell.core.engine.job import OPPORTUNISTIC_PRIORITY, JobSpec, MemberGroup
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request, TopologyLevel
from kubecell.kube import pods
from kubecell.kube.dialects import Isolation, PodDemand
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.trust import lone_job


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
    part_of: dict[str, int] = field(default_factory=dict)
    """A heterogeneous gang's pod uid -> the position of its member group in the job's spec: a member index
    of that group goes only to one of its pods (empty for a homogeneous job, whose pods are interchangeable)."""
    isolation_of: dict[str, Isolation] = field(default_factory=dict)
    """Pod uid -> its own isolation where a heterogeneous gang's pods differ (else ``isolation``)."""
    elastic: ElasticRef | None = None
    """The ElasticJob whose target the scheduler moves, for a gang its
    controller made; None for every other job."""
    released: set[str] = field(default_factory=set)
    """Pods whose members a shrink released (evicted, terminating or gone): they never hold a member again, so
    growth binds the job's other free pods (or pods that joined to replace them, ``Intake``)."""
    pinned: str | None = None
    """The one GPU model an ElasticJob's gang whose pods accept several runs on (its job accepts only that
    one: a data-parallel gang steps at its slowest GPU); None for every other job."""
    models: frozenset[str] | None = None
    """What the pods of a ``pinned`` gang accept (None: any model): where the sizer may move it, and what a
    pod that joins it must accept."""
    moving: bool = False
    """The sizer moves the gang to another model: its pods are evicted, it takes no new pod, and the pods that
    replace them form a new job on the new model."""

    def free_pods(self) -> list[str]:
        """Pods of the job that hold no member yet and may take one, in a stable order."""
        holding = set(self.members.values())
        return [uid for uid in self.pod_uids if uid not in holding and uid not in self.released]

    def spare(self, spec: JobSpec) -> tuple[int, ...]:
        """Free pods per member group of ``spec``: the most members of each group growth can still bind."""
        counts = [0] * len(spec.member_groups)
        for uid in self.free_pods():
            counts[self.part_of.get(uid, 0)] += 1
        return tuple(counts)

    def live_pods(self, position: int | None = None) -> int:
        """Pods of the job not released by a shrink (of the member group at ``position``, when given)."""
        return sum(1 for uid in self.pod_uids if uid not in self.released
                   and (position is None or self.part_of.get(uid, 0) == position))

    def isolation_for(self, uid: str) -> Isolation:
        return self.isolation_of.get(uid, self.isolation)


def groups_for(spec: JobSpec, demand: PodDemand, tracked: Tracked | None = None) -> list[int]:
    """The member groups of ``spec`` whose members ask exactly what ``demand`` asks (a pod that could hold one
    of their members), in group order; for a gang pinned to one model (``tracked.pinned``), a pod asks alike
    when it accepts what the gang's pods accept."""
    r = demand.request
    ask = (r.cpu_milli, r.memory_mib, r.gpu_count, r.gpu_milli, r.gpu_memory_mib, r.gpu_models)
    pinned = tracked is not None and tracked.pinned is not None
    return [position for position, group in enumerate(spec.member_groups)
            if (group.member.cpu_milli, group.member.memory_mib, group.member.gpu_count, group.member.gpu_milli,
                group.member.gpu_memory_mib,
                tracked.models if pinned and tracked is not None else group.member.gpu_models) == ask]


def on_one_model(spec: JobSpec, model: str) -> JobSpec:
    """``spec`` with its GPU members accepting ``model`` alone (an elastic gang runs on one model)."""
    def narrowed(member: Request) -> Request:
        return replace(member, gpu_models=frozenset({model})) if member.wants_gpu else member

    if not spec.groups:
        return replace(spec, member=narrowed(spec.member))
    groups = tuple(replace(group, member=narrowed(group.member)) for group in spec.groups)
    return replace(spec, member=groups[0].member, groups=groups)


def job_name(demand: PodDemand, pod: Mapping[str, Any], generation: int) -> str:
    """``ns/pod@uid8`` for a pod alone (``ns/pod@uid8#n`` when it is placed again as a new job, see
    ``Intake.renew``), ``ns/group#n`` for the n-th gang formed under a group key."""
    if demand.group is not None:
        return f"{demand.group.key}#{generation}"
    base = lone_job(pod)
    return f"{base}#{generation}" if generation else base


def job_spec(name: str, demand: PodDemand, members: int, minimum: int | None, vc: str, submitted: float,
             nodes: frozenset[str] | None = None, gpus: frozenset[tuple[str, int]] | None = None) -> JobSpec:
    """The engine's job for ``members`` pods that each ask for ``demand.request``.

    A topology level inside a node (nvlink, numa) constrains each member's own GPUs; a level at or above
    the node (node, rack, zone) constrains where the whole gang goes. ``nodes`` are the only nodes its
    pods may use (their selectors, node affinity and tolerations; None: any); ``gpus`` the only GPUs (None:
    the demand's own, what its DRA claims' selectors accept)."""
    base = demand.request
    level = base.topology
    inside_node = level is not None and level < TopologyLevel.NODE
    member = Request(name=name, cpu_milli=base.cpu_milli, memory_mib=base.memory_mib, gpu_count=base.gpu_count,
                     gpu_milli=base.gpu_milli, gpu_memory_mib=base.gpu_memory_mib, gpu_models=base.gpu_models,
                     topology=level if members == 1 or inside_node else None)
    topology = level if members > 1 and not inside_node else None
    priority = OPPORTUNISTIC_PRIORITY if demand.opportunistic else max(demand.priority, 0)
    return JobSpec(name=name, vc=vc, member=member, members=members, min_members=minimum, priority=priority,
                   topology=topology, submit_time=submitted, nodes=nodes,
                   gpus=gpus if gpus is not None else demand.devices)


def gang_disagreement(key: str, members: Sequence[tuple[Mapping[str, Any], PodDemand]], default_vc: str) -> str | None:
    """Why the pods of gang ``key`` cannot be one job, naming two pods and what each says: they disagree on its
    headcount or minimum, its virtual cluster or its priority. None when they agree."""
    def says(what: str, value: Any) -> str:
        return f"{value}" if value is not None else f"no {what}"

    elastic = members[0][1].group is not None and members[0][1].group.maximum is not None
    checks = (("headcount", lambda d: None if elastic else d.group.size if d.group is not None else None),
              ("minimum", lambda d: d.group.minimum if d.group is not None else None),
              ("maximum", lambda d: d.group.maximum if d.group is not None else None),
              ("virtual cluster", lambda d: d.vc or default_vc),
              ("priority", lambda d: d.priority))
    first_pod, first = members[0]
    for what, read in checks:
        expected = read(first)
        for pod, demand in members[1:]:
            found = read(demand)
            if found != expected:
                return (f"gang {key}: its pods disagree on its {what}: pod {pods.key(first_pod)} says "
                        f"{says(what, expected)}, pod {pods.key(pod)} says {says(what, found)}; kubecell places "
                        "the gang once every pod states the same")
    return None


def gang_ready(demands: Sequence[PodDemand]) -> tuple[int, int] | None:
    """(headcount, minimum) once every pod of a gang exists, else None.

    A gang waits for all the pods its headcount names, even a threshold gang that may start with fewer:
    the engine grows a gang into members that must have pods to bind. A PodGroup states only a minimum;
    its headcount is the pods that name it once the minimum exists. An elastic gang's headcount is its
    maximum; it forms once the pods of its current target (``size``) exist, and binds only those."""
    group = demands[0].group
    if group is None or group.waiting_for is not None or group.minimum is None:
        return None
    present = len(demands)
    if group.maximum is not None:
        return (group.maximum, group.minimum) if present >= min(group.size or group.minimum, group.maximum) else None
    if group.size is not None:
        return (group.size, group.minimum) if present >= group.size else None
    return (present, group.minimum) if present >= group.minimum else None


def _shape(demand: PodDemand) -> tuple[Any, ...]:
    """What makes two pods of a gang interchangeable members: the same ask, isolation and declared part. Every
    field is comparable (no None beside a value), since the groups are ordered by it."""
    r = demand.request
    part = demand.group.part if demand.group is not None else None
    return (part or "", r.gpu_count, r.gpu_milli, r.gpu_memory_mib, r.cpu_milli, r.memory_mib,
            r.gpu_models is not None, tuple(sorted(r.gpu_models or ())), int(r.topology) if r.topology is not None
            else -1, demand.isolation)


def _group_name(demand: PodDemand, taken: set[str]) -> str:
    r = demand.request
    part: str | None = demand.group.part if demand.group is not None else None
    if part:
        base = part
    elif r.is_whole:
        base = f"{r.gpu_count}gpu"
    elif r.gpu_milli or r.gpu_memory_mib:
        base = f"share-{r.gpu_milli}m-{r.gpu_memory_mib}mib"
    else:
        base = "cpu"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def gang_spec(name: str, members: Sequence[tuple[Mapping[str, Any], PodDemand]], size: int, minimum: int | None,
              vc: str, submitted: float, nodes: frozenset[str] | None = None
              ) -> tuple[JobSpec, dict[str, int]]:
    """The engine's job for the pods of one gang, and each pod's member group (empty when they all ask alike).

    Pods that ask alike (and declare the same part: a Volcano task, a KAI subgroup, a HiveD member shape)
    are one member group; a gang of one group is exactly the homogeneous job ``job_spec`` builds. Groups go
    in a fixed order (declared part, then fewest GPUs first, so a launcher without GPUs comes first in the
    fill order). A group's minimum is its part's declared minimum, else all of it when the gang is all or
    nothing, else 0 (the gang's total minimum then decides, filling groups in order). A constraint of the
    whole gang (``kubecell.io/topology`` node, rack or zone) must be the same on every pod that states one.
    Raises ``InvalidInputError`` for a gang no job can be."""
    by_shape: dict[tuple[Any, ...], list[tuple[Mapping[str, Any], PodDemand]]] = {}
    for pod, demand in members:
        by_shape.setdefault(_shape(demand), []).append((pod, demand))
    gpus = common_devices([demand for _, demand in members])
    if len(by_shape) == 1:
        demand = members[0][1]
        return job_spec(name, demand, size, minimum, vc, submitted, nodes, gpus), {}
    levels = {d.request.topology for _, d in members
              if d.request.topology is not None and d.request.topology >= TopologyLevel.NODE}
    if len(levels) > 1:
        raise InvalidInputError(f"its pods ask for different gang topologies "
                                f"({', '.join(sorted(level.name.lower() for level in levels))})",
                                location=f"gang {name}", field="kubecell.io/topology",
                                accepted="one node, rack or zone constraint, the same on every pod that states one")
    gang_level = levels.pop() if levels else None
    whole = minimum is None or minimum >= size
    taken: set[str] = set()
    groups, positions = [], {}
    for position, (_, found) in enumerate(sorted(by_shape.items(), key=lambda item: item[0])):
        demand = found[0][1]
        base = demand.request
        level = base.topology if base.topology is not None and base.topology < TopologyLevel.NODE else None
        member = Request(name=name, cpu_milli=base.cpu_milli, memory_mib=base.memory_mib, gpu_count=base.gpu_count,
                         gpu_milli=base.gpu_milli, gpu_memory_mib=base.gpu_memory_mib, gpu_models=base.gpu_models,
                         topology=level)
        count = len(found)
        group = demand.group
        if group is not None and group.part_size is not None and group.part_size != count:
            raise InvalidInputError(f"member group {group.part!r} is declared with {group.part_size} pods but "
                                    f"{count} exist", location=f"gang {name}", field="podNumber",
                                    accepted="as many pods of each member group as declared")
        declared = group.part_minimum if group is not None else None
        least = min(declared, count) if declared is not None else (count if whole else 0)
        groups.append(MemberGroup(_group_name(demand, taken), member, count, least))
        for pod, _ in found:
            positions[pods.uid(pod)] = position
    if size != len(members):
        raise InvalidInputError(f"{len(members)} pods name a gang whose headcount is {size}", location=f"gang {name}",
                                field="group-size", accepted="as many pods as the headcount states")
    total = max(minimum if minimum is not None else size, sum(group.minimum for group in groups), 1)
    first = members[0][1]
    priority = OPPORTUNISTIC_PRIORITY if first.opportunistic else max(first.priority, 0)
    spec = JobSpec.gang(name, vc, groups, min_members=min(total, size), priority=priority, topology=gang_level,
                        submit_time=submitted, nodes=nodes, gpus=gpus)
    return spec, positions


def common_devices(demands: Sequence[PodDemand]) -> frozenset[tuple[str, int]] | None:
    """The GPUs every member's DRA claims accept (the engine keeps one GPU restriction per job, so a GPU any
    member's selectors refuse is refused to all); None when no member's claims narrow anything."""
    narrowed = [d.devices for d in demands if d.devices is not None]
    return frozenset.intersection(*narrowed) if narrowed else None
