"""Gangs named through PodGroup objects: scheduler-plugins coscheduling, Volcano and KAI-Scheduler.

Each names a PodGroup from the pod, in its own place:

* coscheduling (``kubernetes-sigs/scheduler-plugins``, ``apis/scheduling/v1alpha1/types.go``,
  ``PodGroupLabel``): the pod label ``scheduling.x-k8s.io/pod-group``;
* Volcano (``volcano-sh/apis``, ``pkg/apis/scheduling/v1beta1``: ``KubeGroupNameAnnotationKey`` and
  ``VolcanoGroupNameAnnotationKey``): the pod annotation ``scheduling.k8s.io/group-name`` or
  ``scheduling.volcano.sh/group-name``; the pod annotation ``volcano.sh/task-spec`` names its task, whose
  minimum is the PodGroup's ``spec.minTaskMember`` entry;
* KAI-Scheduler (``NVIDIA/KAI-Scheduler``, ``pkg/common/constants``: ``PodGroupAnnotationForPod`` and
  ``SubGroupLabelKey``): the pod annotation ``pod-group-name`` (KAI reads no label of that name, nor does
  kubecell); the pod label ``kai.scheduler/subgroup-name`` names its subgroup, which must be one of the
  PodGroup's ``spec.subGroups`` (its minimum that entry's ``minMember``).

A PodGroup states only ``spec.minMember`` (absent or 0: no gang constraint); the group is the pods that
name it. The caller passes the PodGroups it knows (``Reading.pod_groups``); until a pod's PodGroup is
known, its group is "waiting for its PodGroup" rather than guessed. PodGroup specs are written by tenants
(three CRDs, some without a schema), so every field read is type-checked and a malformed one refused,
naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubecell.core.limits import MAX_GANG_MEMBERS
from kubecell.core.shown import shown
from kubecell.kube import names
from kubecell.kube.dialects.demand import PodMeta, show
from kubecell.kube.dialects.statement import GroupClaim, PodGroups, Reading, Statement, group_name

__all__ = ["PodGroups", "read"]


def _min_member(pod: PodMeta, name: str, subject: str, field: str, spec: object) -> int:
    """``spec.minMember`` of a known PodGroup; absent or 0 means no gang constraint (1)."""
    if not isinstance(spec, Mapping):
        raise pod.error(subject, f"its PodGroup {pod.namespace}/{name} has a spec that is {shown(spec)}, not a "
                        "mapping", field=field, accepted=f"a PodGroup with minMember 0..{MAX_GANG_MEMBERS}")
    value = spec.get("minMember", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > MAX_GANG_MEMBERS:
        raise pod.error(subject, f"its PodGroup {pod.namespace}/{name} has spec.minMember {shown(value)}",
                        field=field, accepted=f"a PodGroup with minMember 0..{MAX_GANG_MEMBERS}")
    return max(value, 1)


def _count(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= MAX_GANG_MEMBERS


def _part(pod: PodMeta, source: str, group: str, spec: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The member group a pod declares in its PodGroup, and that group's minimum: a Volcano task or a KAI
    subgroup (see the module docstring)."""
    where = f"PodGroup {pod.namespace}/{group}"
    if source == "volcano" and names.VOLCANO_TASK_SPEC in pod.annotations:
        task = group_name(pod, pod.annotations[names.VOLCANO_TASK_SPEC],
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
        subgroup = group_name(pod, text, f"label {names.KAI_SUBGROUP} {show(text)}", names.KAI_SUBGROUP)
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


class PodGroupNames(Statement):
    """The groups the pod names through PodGroup objects: one claim per name found (their sources are
    ``coscheduling``, ``volcano`` and ``kai``; the entry point makes them agree)."""

    dialect = "podgroups"

    def groups(self) -> list[GroupClaim]:
        pod, pod_groups = self.pod, self.reading.pod_groups
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
            group = group_name(pod, name, subject, field)
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


def read(reading: Reading) -> Statement:
    """The PodGroups the pod names (read when asked)."""
    return PodGroupNames(reading)
