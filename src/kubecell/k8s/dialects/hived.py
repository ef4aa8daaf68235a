"""HiveD's pod-scheduling-spec annotation: a virtual cluster, a priority, whole GPUs and a gang.

HiveD (``microsoft/hivedscheduler``, ``pkg/api/types.go``) reads one YAML annotation per pod::

    virtualCluster: vc1          # required
    priority: 10                 # -1 opportunistic, 0..1000 guaranteed; default 0
    leafCellType: V100           # optional GPU type (HiveD's cell type name); empty = any
    leafCellNumber: 2            # GPUs of this pod, > 0
    affinityGroup:               # optional gang; default: the pod alone
      name: job-1
      members: [{podNumber: 4, leafCellNumber: 2}]

Before HiveD renamed them, the keys were ``gpuType`` and ``gpuNumber``; HiveD still reads the old
spelling, so kubecell does too. ``pinnedCellId`` is refused: kubecell places a VC's work in any of its
cells and has nothing the pod could pin. Keys HiveD ignores silently (a typo such as
``leafCellNumer``) are refused here with the list of known keys, and so are affinity groups whose
members ask for different GPU counts, because kubecell's gangs are identical members.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kubecell.core.limits import MAX_GANG_MEMBERS, MAX_GPUS_PER_NODE
from kubecell.k8s import names
from kubecell.k8s.dialects.demand import DemandError, PodMeta

OPPORTUNISTIC = -1
MAX_GUARANTEED = 1000

_RENAMED = {"gpuType": "leafCellType", "gpuNumber": "leafCellNumber"}
_TOP_KEYS = ("virtualCluster", "priority", "pinnedCellId", "leafCellType", "leafCellNumber", "gangReleaseEnable",
             "lazyPreemptionEnable", "ignoreK8sSuggestedNodes", "affinityGroup", *_RENAMED)
_MEMBER_KEYS = ("podNumber", "leafCellNumber", "gpuNumber")


@dataclass(frozen=True, slots=True)
class HivedSpec:
    """What kubecell takes from the annotation."""

    vc: str
    priority: int | None  # None: not stated (the pod's own priority stands)
    gpus: int
    gpu_type: str
    group: str | None
    group_size: int | None


def _error(pod: PodMeta, path: str, message: str, accepted: str | None = None) -> DemandError:
    where = f"annotation {names.HIVED_POD_SCHEDULING_SPEC}" + (f": {path}" if path else "")
    return pod.error(where, message, field=names.HIVED_POD_SCHEDULING_SPEC, accepted=accepted)


def _renamed(pod: PodMeta, mapping: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The mapping with HiveD's old key names read as the new ones (both given: they must agree)."""
    out = {key: value for key, value in mapping.items() if key not in _RENAMED}
    for old, new in _RENAMED.items():
        if old in mapping:
            if new in mapping and mapping[new] != mapping[old]:
                raise _error(pod, f"{path}{old}", f"says {mapping[old]!r} but {new} says {mapping[new]!r}",
                             f"{new} alone ({old} is its old name)")
            out[new] = mapping[old]
    return out


def _integer(pod: PodMeta, value: Any, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(pod, path, f"must be a whole number, got {value!r}", f"{low}..{high}")
    if not low <= value <= high:
        raise _error(pod, path, f"{value} is out of range", f"{low}..{high}")
    return value


def _mapping(pod: PodMeta, value: Any, path: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        kind = "nothing" if value is None else f"a {type(value).__name__}"
        raise _error(pod, path, f"must be a mapping of keys to values, got {kind}")
    for key in value:
        if key not in keys:
            prefix = f"{path}." if path else ""
            raise _error(pod, f"{prefix}{key}", "unknown key", ", ".join(k for k in keys if k not in _RENAMED))
    return value


def parse_hived(pod: PodMeta) -> HivedSpec | None:
    """The pod's HiveD spec, or None when it has no such annotation."""
    text = pod.annotations.get(names.HIVED_POD_SCHEDULING_SPEC)
    if text is None:
        return None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise _error(pod, "", f"is not valid YAML{where}") from None
    spec = _renamed(pod, _mapping(pod, raw, "", _TOP_KEYS), "")
    vc = spec.get("virtualCluster")
    if not isinstance(vc, str) or not vc.strip():
        raise _error(pod, "virtualCluster", "is missing or empty (HiveD requires it)", "the name of a VC")
    priority = None
    if spec.get("priority") is not None:
        priority = _integer(pod, spec["priority"], "priority", OPPORTUNISTIC, MAX_GUARANTEED)
    if spec.get("pinnedCellId"):
        raise _error(pod, "pinnedCellId", "kubecell places a VC's work in any of its cells; a pod cannot pin "
                     "one", "no pinnedCellId (pin cells to the VC in the tenant configuration instead)")
    if "leafCellNumber" not in spec:
        raise _error(pod, "leafCellNumber", "is missing (HiveD requires it)", f"1..{MAX_GPUS_PER_NODE}")
    gpus = _integer(pod, spec["leafCellNumber"], "leafCellNumber", 1, MAX_GPUS_PER_NODE)
    gpu_type = spec.get("leafCellType") or ""
    if not isinstance(gpu_type, str):
        raise _error(pod, "leafCellType", f"must be text, got {gpu_type!r}", "a GPU type name, or empty for any")
    group = spec.get("affinityGroup")
    if group is None:
        return HivedSpec(vc.strip(), priority, gpus, gpu_type.strip(), None, None)
    group = _mapping(pod, group, "affinityGroup", ("name", "members"))
    name = group.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _error(pod, "affinityGroup.name", "is missing or empty", "the group's name")
    members = group.get("members")
    if not isinstance(members, list) or not members:
        raise _error(pod, "affinityGroup.members", "must be a non-empty list",
                     "[{podNumber: N, leafCellNumber: G}]")
    size = 0
    counts: dict[int, int] = {}
    for index, member in enumerate(members):
        path = f"affinityGroup.members[{index}]"
        member = _renamed(pod, _mapping(pod, member, path, _MEMBER_KEYS), f"{path}.")
        pods = _integer(pod, member.get("podNumber"), f"{path}.podNumber", 1, MAX_GANG_MEMBERS)
        leaf = _integer(pod, member.get("leafCellNumber"), f"{path}.leafCellNumber", 1, MAX_GPUS_PER_NODE)
        counts[leaf] = counts.get(leaf, 0) + pods
        size += pods
    if gpus not in counts:
        raise _error(pod, "affinityGroup.members", f"no member asks for this pod's leafCellNumber {gpus}",
                     "the pod's own leafCellNumber among the members (HiveD requires it)")
    if len(counts) > 1:
        shapes = ", ".join(f"{pods} pod{'s' if pods != 1 else ''} x {leaf} GPU{'s' if leaf != 1 else ''}"
                           for leaf, pods in sorted(counts.items()))
        raise _error(pod, "affinityGroup.members", f"members ask for different GPU counts ({shapes}); kubecell's "
                     "gangs have identical members", "one leafCellNumber for every member; one group per member "
                     "shape")
    if size > MAX_GANG_MEMBERS:
        raise _error(pod, "affinityGroup.members", f"{size} pods in all is too many", f"1..{MAX_GANG_MEMBERS}")
    return HivedSpec(vc.strip(), priority, gpus, gpu_type.strip(), name.strip(), size)
