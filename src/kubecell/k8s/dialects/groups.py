"""Which gang a pod belongs to, from any of the six places users name one.

Sources, each read as its own scheduler reads it:

* kubecell: annotations ``kubecell.io/group``, ``group-size`` (headcount) and ``group-min`` (minimum;
  unstated, it is the ``minMember`` of a PodGroup of the same name if the pod names one, else the
  headcount: all or nothing);
* KubeShare: labels ``sharedgpu/group_name``, ``group_headcount`` and ``group_threshold``, the minimum
  being the threshold's share of the headcount rounded half up (KubeShare's
  ``floor(threshold x headcount + 0.5)``);
* HiveD: the ``affinityGroup`` of its pod-scheduling-spec (headcount = the members' podNumbers; HiveD
  gangs are all or nothing);
* PodGroup objects, named by the scheduler-plugins coscheduling label ``scheduling.x-k8s.io/pod-group``,
  Volcano's annotation ``scheduling.k8s.io/group-name`` (or ``scheduling.volcano.sh/group-name``) or
  KAI-Scheduler's annotation ``pod-group-name``. A PodGroup states only ``spec.minMember``; the group
  is the pods that name it. Until the PodGroup object is known, the pod's group is "waiting for its
  PodGroup" rather than guessed.

Group keys are ``<namespace>/<name>``. Several sources on one pod must name the same group and agree on
the numbers they state; anything else is refused, because a pod cannot wait for two gangs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from kubecell.core.limits import MAX_GANG_MEMBERS
from kubecell.k8s import names
from kubecell.k8s.dialects.demand import MAX_NAME_CHARS, GroupDemand, PodMeta, show, shown
from kubecell.k8s.dialects.hived import HivedSpec
from kubecell.k8s.dialects.resources import MAX_NUMBER_CHARS, QuantityError, parse_decimal

PodGroups = Mapping[tuple[str, str], Mapping[str, Any]]
"""Known PodGroup objects by (namespace, name): their ``spec`` (at least ``minMember``)."""


@dataclass(frozen=True, slots=True)
class GroupClaim:
    """One source's statement about the pod's group."""

    source: str
    field: str
    subject: str
    name: str
    size: int | None
    minimum: int | None
    waiting_for: str | None = None
    part: str | None = None
    part_minimum: int | None = None
    part_size: int | None = None


_DIGITS = re.compile(r"[0-9]+")
"""ASCII digits: ``str.isdigit`` also takes ``"²"`` (which ``int`` refuses) and ``"١٢"`` (which it reads)."""


def _count_text(pod: PodMeta, text: str, subject: str, field: str, low: int) -> int:
    """A headcount or minimum written in a label or annotation: ASCII digits, its length and its range
    checked before ``int`` reads it (which refuses more than 4,300 digits with a ``ValueError``)."""
    accepted = f"{low}..{MAX_GANG_MEMBERS}"
    if len(text) > MAX_NUMBER_CHARS:
        raise pod.error(subject, f"is {len(text)} characters long, not a count", field=field, accepted=accepted)
    stripped = text.strip()
    if not _DIGITS.fullmatch(stripped):
        raise pod.error(subject, "is not a whole number (digits 0-9)", field=field, accepted=accepted)
    digits = stripped.lstrip("0") or "0"
    if len(digits) > len(str(MAX_GANG_MEMBERS)) or not low <= int(digits) <= MAX_GANG_MEMBERS:
        raise pod.error(subject, "is out of range", field=field, accepted=accepted)
    return int(digits)


def _group_name(pod: PodMeta, name: str, subject: str, field: str) -> str:
    """A group's name, trimmed: it becomes ``<namespace>/<name>``, the job of every member's allocation
    record, so it is at most as long as a Kubernetes object's name."""
    stripped = name.strip()
    if not stripped:
        raise pod.error(subject, "is empty", field=field, accepted="the group's name")
    if len(stripped) > MAX_NAME_CHARS:
        raise pod.error(subject, f"is {len(stripped)} characters long", field=field,
                        accepted=f"a name of at most {MAX_NAME_CHARS} characters, as a Kubernetes object's")
    return stripped


def kubecell_group(pod: PodMeta) -> GroupClaim | None:
    notes = pod.annotations
    name = notes.get(names.ANNOTATION_GROUP)
    if name is None:
        for extra in (names.ANNOTATION_GROUP_SIZE, names.ANNOTATION_GROUP_MIN):
            if extra in notes:
                raise pod.annotation_error(extra, f"is set without {names.ANNOTATION_GROUP}",
                                           f"{names.ANNOTATION_GROUP} naming the group, or neither")
        return None
    group = _group_name(pod, name, f"annotation {names.ANNOTATION_GROUP} {show(name)}", names.ANNOTATION_GROUP)
    if names.ANNOTATION_GROUP_SIZE not in notes:
        raise pod.annotation_error(names.ANNOTATION_GROUP, f"names a group without {names.ANNOTATION_GROUP_SIZE}",
                                   f"{names.ANNOTATION_GROUP_SIZE}: the number of pods in the group")
    size_text = notes[names.ANNOTATION_GROUP_SIZE]
    size = _count_text(pod, size_text, f"annotation {names.ANNOTATION_GROUP_SIZE} {show(size_text)}",
                       names.ANNOTATION_GROUP_SIZE, 1)
    minimum = None  # unstated: all or nothing, unless a PodGroup of the same name states a minimum
    if names.ANNOTATION_GROUP_MIN in notes:
        min_text = notes[names.ANNOTATION_GROUP_MIN]
        subject = f"annotation {names.ANNOTATION_GROUP_MIN} {show(min_text)}"
        minimum = _count_text(pod, min_text, subject, names.ANNOTATION_GROUP_MIN, 1)
        if minimum > size:
            raise pod.error(subject, f"is above the group's size {size}", field=names.ANNOTATION_GROUP_MIN,
                            accepted=f"1..{size}")
    return GroupClaim("kubecell", names.ANNOTATION_GROUP, f"annotation {names.ANNOTATION_GROUP} {show(name)}",
                      group, size, minimum)


def kubeshare_group(pod: PodMeta) -> GroupClaim | None:
    labels = pod.labels
    if names.KUBESHARE_README_GROUP_NAME in labels:
        raise pod.label_error(names.KUBESHARE_README_GROUP_NAME, "is named in KubeShare's README but KubeShare "
                              f"reads {names.KUBESHARE_GROUP_NAME}", f"label {names.KUBESHARE_GROUP_NAME}")
    name = labels.get(names.KUBESHARE_GROUP_NAME)
    if name is None:
        for extra in (names.KUBESHARE_GROUP_HEADCOUNT, names.KUBESHARE_GROUP_THRESHOLD):
            if extra in labels:
                raise pod.label_error(extra, f"is set without {names.KUBESHARE_GROUP_NAME}",
                                      f"{names.KUBESHARE_GROUP_NAME} naming the group, or neither")
        return None
    group = _group_name(pod, name, f"label {names.KUBESHARE_GROUP_NAME} {show(name)}", names.KUBESHARE_GROUP_NAME)
    for needed in (names.KUBESHARE_GROUP_HEADCOUNT, names.KUBESHARE_GROUP_THRESHOLD):
        if needed not in labels:
            raise pod.label_error(names.KUBESHARE_GROUP_NAME, f"names a group without {needed} (KubeShare then "
                                  "ignores the group)", f"both {names.KUBESHARE_GROUP_HEADCOUNT} and "
                                  f"{names.KUBESHARE_GROUP_THRESHOLD}")
    head_text = labels[names.KUBESHARE_GROUP_HEADCOUNT]
    size = _count_text(pod, head_text, f"label {names.KUBESHARE_GROUP_HEADCOUNT} {show(head_text)}",
                       names.KUBESHARE_GROUP_HEADCOUNT, 1)
    try:
        threshold = parse_decimal(labels[names.KUBESHARE_GROUP_THRESHOLD],
                                  "a fraction of the headcount in (0, 1], e.g. 0.5")
    except QuantityError as error:
        raise pod.label_error(names.KUBESHARE_GROUP_THRESHOLD, error.reason, error.accepted) from None
    if not 0 < threshold <= 1:
        raise pod.label_error(names.KUBESHARE_GROUP_THRESHOLD, "is not a fraction of the headcount",
                              "a number in (0, 1], e.g. 0.5")
    minimum = int((threshold * size).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    if minimum < 1:
        raise pod.label_error(names.KUBESHARE_GROUP_THRESHOLD, f"of {size} pods rounds to no pod at all",
                              f"at least {Decimal(1) / (2 * size):.3g} for a headcount of {size}")
    return GroupClaim("kubeshare", names.KUBESHARE_GROUP_NAME, f"label {names.KUBESHARE_GROUP_NAME} {show(name)}",
                      group, size, minimum)


def hived_group(spec: HivedSpec | None) -> GroupClaim | None:
    """HiveD's affinity group: all or nothing; its members of one GPU count (``leafCellNumber``) are one member
    group, whose size is their ``podNumber``."""
    if spec is None or spec.group is None:
        return None
    parts = spec.group_parts or {}
    part_size = parts.get(spec.gpus)
    part = f"{spec.gpus}gpu" if len(parts) > 1 else None
    return GroupClaim("hived", names.HIVED_POD_SCHEDULING_SPEC, f"annotation {names.HIVED_POD_SCHEDULING_SPEC}: "
                      f"affinityGroup.name {show(spec.group)}", spec.group, spec.group_size, spec.group_size,
                      part=part, part_minimum=part_size if part else None, part_size=part_size if part else None)


def _min_member(pod: PodMeta, name: str, subject: str, field: str, spec: object) -> int:
    """``spec.minMember`` of a known PodGroup; absent or 0 means no gang constraint (1). The spec is whatever
    the PodGroup's author wrote (three CRDs, some without a schema), so its type is checked too."""
    if not isinstance(spec, Mapping):
        raise pod.error(subject, f"its PodGroup {pod.namespace}/{name} has a spec that is {shown(spec)}, not a "
                        "mapping", field=field, accepted=f"a PodGroup with minMember 0..{MAX_GANG_MEMBERS}")
    value = spec.get("minMember", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > MAX_GANG_MEMBERS:
        raise pod.error(subject, f"its PodGroup {pod.namespace}/{name} has spec.minMember {shown(value)}",
                        field=field, accepted=f"a PodGroup with minMember 0..{MAX_GANG_MEMBERS}")
    return max(value, 1)


def podgroup_groups(pod: PodMeta, pod_groups: PodGroups) -> list[GroupClaim]:
    """Groups named through PodGroup objects (coscheduling, Volcano, KAI)."""
    named: list[tuple[str, str, str]] = []
    if names.COSCHEDULING_POD_GROUP in pod.labels:
        named.append(("coscheduling", names.COSCHEDULING_POD_GROUP, f"label {names.COSCHEDULING_POD_GROUP}"))
    for source, key in (("volcano", names.VOLCANO_GROUP_NAME), ("volcano", names.VOLCANO_GROUP_NAME_ALT),
                        ("kai", names.KAI_POD_GROUP)):
        if key in pod.annotations:
            named.append((source, key, f"annotation {key}"))
    claims = []
    for source, field, kind in named:
        name = (pod.labels if kind.startswith("label") else pod.annotations)[field]
        subject = f"{kind} {show(name)}"
        if not name.strip():
            raise pod.error(subject, "is empty", field=field, accepted="the name of a PodGroup")
        group = _group_name(pod, name, subject, field)
        spec = pod_groups.get((pod.namespace, group))
        if spec is None:
            claims.append(GroupClaim(source, field, subject, group, None, None,
                                     waiting_for=f"PodGroup {pod.namespace}/{group}"))
        else:
            minimum = _min_member(pod, group, subject, field, spec)
            part, part_minimum = _part(pod, source, group, spec)
            claims.append(GroupClaim(source, field, subject, group, None, minimum, part=part,
                                     part_minimum=part_minimum))
    return claims


def _count(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= MAX_GANG_MEMBERS


def _part(pod: PodMeta, source: str, group: str, spec: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The member group a pod declares in its PodGroup, and that group's minimum: a Volcano task (annotation
    ``volcano.sh/task-spec``, minimum from ``spec.minTaskMember``) or a KAI subgroup (label
    ``kai.scheduler/subgroup-name``, which must be one of ``spec.subGroups``, minimum its ``minMember``).
    Both specs are written by tenants; a malformed one is refused, naming the field."""
    where = f"PodGroup {pod.namespace}/{group}"
    if source == "volcano" and names.VOLCANO_TASK_SPEC in pod.annotations:
        task = _group_name(pod, pod.annotations[names.VOLCANO_TASK_SPEC],
                           f"annotation {names.VOLCANO_TASK_SPEC} {show(pod.annotations[names.VOLCANO_TASK_SPEC])}",
                           names.VOLCANO_TASK_SPEC)
        table = spec.get("minTaskMember")
        if table is None:
            return task, None
        if not isinstance(table, Mapping):
            raise pod.error(f"{where} spec.minTaskMember", f"is {shown(table)}, not a mapping",
                            field=names.VOLCANO_TASK_SPEC, accepted="a mapping of task names to minimum pod counts")
        value = table.get(task)
        if value is not None and not _count(value):
            raise pod.error(f"{where} spec.minTaskMember.{task}", f"is {shown(value)}", field=names.VOLCANO_TASK_SPEC,
                            accepted=f"a whole number 0..{MAX_GANG_MEMBERS}")
        return task, value
    if source == "kai" and names.KAI_SUBGROUP in pod.labels:
        text = pod.labels[names.KAI_SUBGROUP]
        subgroup = _group_name(pod, text, f"label {names.KAI_SUBGROUP} {show(text)}", names.KAI_SUBGROUP)
        listed = spec.get("subGroups")
        if not isinstance(listed, list) or not all(isinstance(entry, Mapping) for entry in listed):
            raise pod.error(f"label {names.KAI_SUBGROUP} {show(text)}", f"names a subgroup of {where}, whose "
                            f"spec.subGroups is {shown(listed)}", field=names.KAI_SUBGROUP,
                            accepted="a PodGroup with spec.subGroups: [{name, minMember}, ...]")
        entry = next((e for e in listed if e.get("name") == subgroup), None)
        if entry is None:
            known = ", ".join(sorted(str(e.get("name")) for e in listed)[:10]) or "none"
            raise pod.error(f"label {names.KAI_SUBGROUP} {show(text)}", f"names a subgroup {where} does not list",
                            field=names.KAI_SUBGROUP, accepted=f"one of its spec.subGroups: {known}")
        value = entry.get("minMember")
        if value is not None and not _count(value):
            raise pod.error(f"{where} spec.subGroups[{subgroup}].minMember", f"is {shown(value)}",
                            field=names.KAI_SUBGROUP, accepted=f"a whole number 0..{MAX_GANG_MEMBERS}")
        return subgroup, value
    return None, None


def merge_groups(pod: PodMeta, claims: list[GroupClaim]) -> GroupDemand | None:
    """The pod's one group: every source must name the same group and state the same numbers."""
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
    return GroupDemand(f"{pod.namespace}/{first.name}", first.source, size, minimum, waiting,
                       part=part.part if part else None, part_minimum=part.part_minimum if part else None,
                       part_size=part.part_size if part else None)
