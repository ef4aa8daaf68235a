"""A Pod, as the API server returns it, read into one ``PodDemand``: every dialect asked, the answers merged.

This is the only entry point the scheduler calls. It does no I/O, so the same function serves the
scheduler, the extender, the replay tool and the tests. ``READERS`` lists the dialects (one module per
source system, ``statement.Statement`` their one interface); the tables below say which dialects state
which aspect; the merges here are the only place where dialects meet: GPU asks must be the same ask, model
filters intersect, groups must be the same group with the same numbers, VCs the same VC, stated priorities
the same priority. Then kubecell's own placement constraints (isolation, topology, MIG) are checked against
the merged ask, and the core ``Request`` of one member is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request, TopologyLevel
from kubecell.core.shown import shown
from kubecell.kube.dialects import aliyun, alnair, hami, hived, kubecell, kubeshare, nvidia, podgroups
from kubecell.kube.dialects.demand import OPPORTUNISTIC, DialectOptions, GroupDemand, PodDemand, PodMeta
from kubecell.kube.dialects.resources import mib_up, number_text, pod_totals
from kubecell.kube.dialects.statement import GpuAsk, GroupClaim, PodGroups, Reading, Stated, Statement

READERS: tuple[Callable[[Reading], Statement], ...] = (
    kubecell.read, nvidia.read, hami.read, aliyun.read, alnair.read, kubeshare.read, hived.read, podgroups.read)
"""Every dialect kubecell reads. HiveD's ``read`` parses its annotation, so after a malformed container
amount (``pod_totals``) a malformed HiveD spec is the first thing a pod is told."""

DIALECT_ORDER = ("kubecell", "nvidia", "hami", "aliyun", "alnair", "kubeshare", "hived", "coscheduling", "volcano",
                 "kai")
"""The order of ``PodDemand.dialects`` (group claims name coscheduling, Volcano and KAI themselves)."""

# Which dialects state each aspect, in the order they are asked. A merge names the first statement of a
# disagreement first and credits a gang to the first source that claims it, so these orders are part of
# every message: HiveD's group and priority come before KubeShare's, its ask and GPU type after.
ASKS = ("kubecell", "nvidia", "hami", "aliyun", "alnair", "kubeshare", "hived")
MODEL_FILTERS = ("kubecell", "hami", "kubeshare", "hived")
GROUPS = ("kubecell", "hived", "kubeshare", "podgroups")
VCS = ("kubecell", "hived")
PRIORITIES = ("kubecell", "hived", "kubeshare")

PRIORITY_RANGE = (-(2**31), 2**31 - 1)
"""``spec.priority`` is an int32 in the API (PriorityClass values; system classes reach 2,000,001,000)."""


def pod_demand(pod: Mapping[str, Any], *, pod_groups: PodGroups | None = None,
               options: DialectOptions | None = None) -> PodDemand:
    """What ``pod`` (a Pod dict with the API's camelCase fields) asks of kubecell.

    ``pod_groups`` holds the PodGroup objects the caller knows, by (namespace, name), as their ``spec``;
    a pod naming one that is missing gets a group ``waiting_for`` it. Raises ``DemandError`` for an ask
    kubecell cannot accept; the message is written for the pod's Warning Event.
    """
    meta = PodMeta.of(pod)
    reading = Reading(meta, pod_totals(meta), options or DialectOptions(), pod_groups or {})
    said = {statement.dialect: statement for statement in (read(reading) for read in READERS)}
    asks = [found for found in (statement.ask() for statement in _stating(said, ASKS)) if found is not None]
    ask = merge_asks(meta, asks)
    filters = [found for statement in _stating(said, MODEL_FILTERS) for found in statement.models()]
    models = merge_models(meta, filters)
    claims = [claim for statement in _stating(said, GROUPS) for claim in statement.groups()]
    group = merge_groups(meta, claims)
    vcs = [found for found in (statement.vc() for statement in _stating(said, VCS)) if found is not None]
    vc = merge_vcs(meta, vcs)
    own = _own_priority(meta)
    priorities = [found for found in (statement.priority() for statement in _stating(said, PRIORITIES))
                  if found is not None]
    priority = merge_priorities(meta, own, priorities)
    isolation = kubecell.isolation(meta, models if ask is not None else None)
    request = _request(meta, ask, reading.totals, models, kubecell.topology(meta, ask))
    if isolation == "mig":
        kubecell.check_mig(meta, request, request.gpu_models)
    used = ({found.dialect for found in asks} | {found.dialect for found in filters} | {c.source for c in claims}
            | {found.dialect for found in vcs} | {found.dialect for found in priorities}
            | {statement.dialect for statement in said.values() if statement.carried()})
    return PodDemand(pod=meta.key, request=request, group=group, vc=vc, priority=priority, isolation=isolation,
                     dialects=tuple(d for d in DIALECT_ORDER if d in used))


def _stating(said: Mapping[str, Statement], order: tuple[str, ...]) -> list[Statement]:
    return [said[dialect] for dialect in order]


def merge_asks(pod: PodMeta, asks: list[GpuAsk]) -> GpuAsk | None:
    """The pod's one GPU ask: dialects that agree are accepted together, any disagreement is refused (a pod
    is never given the larger or the smaller of two contradicting asks)."""
    if not asks:
        return None
    first = asks[0]
    for other in asks[1:]:
        if other.shape != first.shape:
            raise pod.error(f"{first.subject} and {other.subject}",
                            f"{first.dialect} asks for {first.describe()} but {other.dialect} asks for "
                            f"{other.describe()}", field=first.field,
                            accepted="one GPU ask, or the same ask in every dialect on the pod")
    return first


def merge_models(pod: PodMeta, filters: list[Stated[frozenset[str]]]) -> frozenset[str] | None:
    """Allowed GPU models: every filter the pod states, intersected; filters that exclude each other are
    refused (each filter alone already selects some model)."""
    if not filters:
        return None
    first = filters[0]
    allowed = first.value
    for other in filters[1:]:
        if not allowed & other.value:
            raise pod.error(f"{first.subject} and {other.subject}", f"{first.dialect} and {other.dialect} allow no "
                            "GPU model in common", field=first.field, accepted="model filters that overlap")
        allowed &= other.value
    return allowed


def merge_groups(pod: PodMeta, claims: list[GroupClaim]) -> GroupDemand | None:
    """The pod's one group: every source must name the same group and state the same numbers, because a pod
    cannot wait for two gangs. The key is ``<namespace>/<name>``: groups never span namespaces."""
    if not claims:
        return None
    first = claims[0]
    for other in claims[1:]:
        if other.name != first.name:
            raise pod.error(f"{first.subject} and {other.subject}", f"{first.source} and {other.source} name "
                            "different groups", field=first.field, accepted="one group, named the same everywhere")
    for attribute, what in (("size", "headcount"), ("minimum", "minimum")):
        stated = [claim for claim in claims if getattr(claim, attribute) is not None]
        for other in stated[1:]:
            if getattr(other, attribute) != getattr(stated[0], attribute):
                raise pod.error(f"{stated[0].subject} and {other.subject}", f"{stated[0].source} states a "
                                f"{what} of {getattr(stated[0], attribute)} but {other.source} of "
                                f"{getattr(other, attribute)}", field=stated[0].field,
                                accepted=f"the same {what} from every source")
    size = next((claim.size for claim in claims if claim.size is not None), None)
    minimum = next((claim.minimum for claim in claims if claim.minimum is not None), size)
    if size is not None and minimum is not None and minimum > size:
        sized = next(claim for claim in claims if claim.size is not None)
        floor = next(claim for claim in claims if claim.minimum == minimum)
        raise pod.error(f"{floor.subject} and {sized.subject}", f"the minimum {minimum} ({floor.source}) is above "
                        f"the headcount {size} ({sized.source})", field=floor.field,
                        accepted="a minimum no larger than the headcount")
    waiting = None if minimum is not None else next(c.waiting_for for c in claims if c.waiting_for)
    parts = [claim for claim in claims if claim.part is not None]
    for other in parts[1:]:
        if other.part != parts[0].part:
            raise pod.error(f"{parts[0].subject} and {other.subject}", f"{parts[0].source} puts the pod in member "
                            f"group {parts[0].part!r} but {other.source} in {other.part!r}", field=parts[0].field,
                            accepted="one member group for the pod")
    part = parts[0] if parts else None
    maximum = next((claim.maximum for claim in claims if claim.maximum is not None), None)
    return GroupDemand(f"{pod.namespace}/{first.name}", first.source, size, minimum, waiting,
                       part=part.part if part else None, part_minimum=part.part_minimum if part else None,
                       part_size=part.part_size if part else None, maximum=maximum)


def merge_vcs(pod: PodMeta, vcs: list[Stated[str]]) -> str | None:
    """The virtual cluster the pod names, or None (the driver applies its default); two names must agree."""
    if not vcs:
        return None
    first = vcs[0]
    for other in vcs[1:]:
        if other.value != first.value:
            raise pod.error(f"{first.subject} and {other.subject}", "name different virtual clusters",
                            field=first.field, accepted="one virtual cluster, named the same in both")
    return first.value


def _own_priority(pod: PodMeta) -> int:
    """``spec.priority`` (from the PriorityClass), checked before any dialect's priority is read."""
    raw = pod.spec.get("priority", 0)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise pod.error(f"spec.priority {shown(raw)}", "is not a whole number", field="spec.priority",
                        accepted="an integer (set through a PriorityClass)")
    low, high = PRIORITY_RANGE
    if not low <= raw <= high:
        raise pod.error(f"spec.priority {shown(raw)}", "is beyond the API's int32", field="spec.priority",
                        accepted=f"an integer in {low}..{high} (set through a PriorityClass)")
    return raw


def merge_priorities(pod: PodMeta, own: int, stated: list[Stated[int]]) -> int:
    """The pod's own priority, unless a dialect states one; stated ones must agree. Below -1 is refused."""
    for other in stated[1:]:
        first = stated[0]
        if other.value != first.value:
            raise pod.error(f"{first.subject} and {other.subject}", f"{first.dialect} states priority {first.value} "
                            f"but {other.dialect} states {other.value}", field=first.field,
                            accepted="one priority (-1 = opportunistic), stated the same everywhere")
    priority = stated[0].value if stated else own
    if priority < OPPORTUNISTIC:
        raise pod.error(f"spec.priority {priority}", "is below -1", field="spec.priority",
                        accepted="-1 (opportunistic) or a priority >= 0")
    return priority


def _request(pod: PodMeta, ask: GpuAsk | None, totals: Mapping[str, Decimal], models: frozenset[str] | None,
             topology: TopologyLevel | None) -> Request:
    """The core request of one member: the pod's CPU and memory totals and its merged GPU ask."""
    cpu = totals.get("cpu", Decimal(0))
    memory = totals.get("memory", Decimal(0))
    count, milli, memory_mib = ask.shape if ask is not None else (0, 0, 0)
    try:
        return Request(name=pod.key, cpu_milli=math.ceil(cpu * 1000), memory_mib=mib_up(memory),
                       gpu_count=count, gpu_milli=milli, gpu_memory_mib=memory_mib,
                       gpu_models=models if ask is not None else None, topology=topology)
    except InvalidInputError as error:  # host CPU/memory beyond what the book can hold, negative amounts
        raise pod.error(f"cpu {number_text(cpu)} memory {number_text(memory)}", error.message,
                        field=error.field or "resources",
                        accepted=error.accepted) from None
