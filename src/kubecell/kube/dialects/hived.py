"""HiveD's dialect: its pod-scheduling-spec annotation states a VC, a priority, whole GPUs, a GPU type and a gang.

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
``leafCellNumer``) are refused here with the list of known keys. An affinity group whose members ask for
different GPU counts is a heterogeneous gang: its members of each GPU count are one member group.

What the spec states, as kubecell reads it: the VC (``virtualCluster``, which must agree with
``kubecell.io/vc``), the priority (-1 opportunistic, 0..1000; unstated, the pod's own), ``leafCellNumber``
whole GPUs, ``leafCellType`` as a GPU model filter matched like HAMi's (a substring of the model:
``V100`` selects ``V100M16`` and ``V100M32``), and the affinity group as an all-or-nothing gang keyed
``<namespace>/<name>``, like every gang kubecell reads.

The annotation is text anyone who can create a pod writes, and YAML can say far more than HiveD's few keys:
so it is read with limits (``_SpecLoader``, the shared ``kubecell.inputs.bounded_yaml.BoundedLoader``): at most
``MAX_SPEC_CHARS`` characters, nested at most ``MAX_SPEC_DEPTH`` levels (PyYAML composes recursively, and a few
thousand ``[`` exhaust Python's stack), at most ``MAX_SPEC_NODES`` values (the loader's time is per value), no
aliases (``*name`` builds structures exponentially larger than the
text, or ones that contain themselves), numbers of at most ``MAX_NUMBER_CHARS`` characters (PyYAML's int
constructor raises ``ValueError`` beyond 4,300 digits), dates that exist. Whatever the text, the result is a
``HivedSpec`` or a ``DemandError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kubecell.core.limits import MAX_GANG_MEMBERS, MAX_GPUS_PER_NODE
from kubecell.core.model import MILLI_PER_GPU
from kubecell.core.shown import shown
from kubecell.inputs.bounded_yaml import BoundedLoader, YamlRefused
from kubecell.kube import names
from kubecell.kube.dialects.demand import MAX_NAME_CHARS, OPPORTUNISTIC, DemandError, PodMeta, show
from kubecell.kube.dialects.models import bounded, model_filter
from kubecell.kube.dialects.statement import GpuAsk, GroupClaim, Reading, Stated, Statement

MAX_GUARANTEED = 1000

_RENAMED = {"gpuType": "leafCellType", "gpuNumber": "leafCellNumber"}
_TOP_KEYS = ("virtualCluster", "priority", "pinnedCellId", "leafCellType", "leafCellNumber", "gangReleaseEnable",
             "lazyPreemptionEnable", "ignoreK8sSuggestedNodes", "affinityGroup", *_RENAMED)
_MEMBER_KEYS = ("podNumber", "leafCellNumber", "gpuNumber")

MAX_SPEC_CHARS = 4 * 1024
"""The longest annotation read. A spec is a few lines (an affinity group of ten member shapes is under 1 KiB, and
one of as many values as ``MAX_SPEC_NODES`` allows about 2 KiB); beyond that only comments and long text could
fill it, and PyYAML's pure-Python scanner reads about 1 KiB per millisecond."""
MAX_SPEC_NODES = 256
"""The most YAML values (scalars, lists and mappings, keys included) a spec may hold. A spec with all of HiveD's
keys and 30 member shapes holds under 240. What PyYAML's pure-Python loader costs is per value: 16 KiB of
``[1, 1, ...]`` (5,000 values) took it 0.2-0.4 s per pod read, on the scheduling thread; refused at 256 values,
under 20 ms."""
MAX_SPEC_DEPTH = 16
"""The deepest nesting read: HiveD's spec is 5 levels deep (spec, affinityGroup, members, a member, a value)."""
MAX_NUMBER_CHARS = 32
"""The longest number read: every number of the spec is below 10^4 (a priority, GPUs, pods of a gang)."""


class _SpecLoader(BoundedLoader):
    """The bounded safe loader with the limits of the module docstring."""

    max_depth = MAX_SPEC_DEPTH
    max_nodes = MAX_SPEC_NODES
    max_number_chars = MAX_NUMBER_CHARS
    aliases = False


@dataclass(frozen=True, slots=True)
class HivedSpec:
    """What kubecell takes from the annotation."""

    vc: str
    priority: int | None  # None: not stated (the pod's own priority stands)
    gpus: int
    gpu_type: str
    group: str | None
    group_size: int | None
    group_parts: Mapping[int, int] | None = None
    """The affinity group's members by GPU count (``leafCellNumber`` -> ``podNumber``): one member group each,
    all or nothing (a heterogeneous gang when there are several, ``kubecell.scheduler.jobs.gang_spec``)."""


def _error(pod: PodMeta, path: str, message: str, accepted: str | None = None) -> DemandError:
    where = f"annotation {names.HIVED_POD_SCHEDULING_SPEC}" + (f": {path}" if path else "")
    return pod.error(where, message, field=names.HIVED_POD_SCHEDULING_SPEC, accepted=accepted)


def _renamed(pod: PodMeta, mapping: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The mapping with HiveD's old key names read as the new ones (both given: they must agree)."""
    out = {key: value for key, value in mapping.items() if key not in _RENAMED}
    for old, new in _RENAMED.items():
        if old in mapping:
            if new in mapping and mapping[new] != mapping[old]:
                raise _error(pod, f"{path}{old}", f"says {shown(mapping[old])} but {new} says {shown(mapping[new])}",
                             f"{new} alone ({old} is its old name)")
            out[new] = mapping[old]
    return out


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _integer(pod: PodMeta, value: Any, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(pod, path, f"must be a whole number, got {shown(value)}", f"{low}..{high}")
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
            written = key if isinstance(key, str) and len(key) <= 60 else shown(key)
            raise _error(pod, f"{prefix}{written}", "unknown key", ", ".join(k for k in keys if k not in _RENAMED))
    return value


def parse_hived(pod: PodMeta) -> HivedSpec | None:
    """The pod's HiveD spec, or None when it has no such annotation."""
    text = pod.annotations.get(names.HIVED_POD_SCHEDULING_SPEC)
    if text is None:
        return None
    if len(text) > MAX_SPEC_CHARS:
        raise _error(pod, "", f"is {len(text)} characters long", f"a spec of at most {MAX_SPEC_CHARS} characters")
    try:
        raw = yaml.load(text, Loader=_SpecLoader)
    except YamlRefused as error:
        raise _error(pod, "", f"{error.problem}{_at(error.problem_mark)}",
                     "HiveD's keys in plain YAML: mappings, lists, text and numbers, without aliases") from None
    except yaml.YAMLError as error:
        raise _error(pod, "", f"is not valid YAML{_at(getattr(error, 'problem_mark', None))}") from None
    except (ValueError, RecursionError, OverflowError) as error:  # a backstop: the loader's limits come first
        raise _error(pod, "", f"could not be read as YAML ({type(error).__name__})",
                     "HiveD's keys in plain YAML: mappings, lists, text and numbers") from None
    spec = _renamed(pod, _mapping(pod, raw, "", _TOP_KEYS), "")
    vc = spec.get("virtualCluster")
    if not isinstance(vc, str) or not vc.strip():
        raise _error(pod, "virtualCluster", "is missing or empty (HiveD requires it)", "the name of a VC")
    if len(vc.strip()) > MAX_NAME_CHARS:
        raise _error(pod, f"virtualCluster {show(vc)}", f"is {len(vc.strip())} characters long",
                     f"the name of a VC, at most {MAX_NAME_CHARS} characters")
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
        raise _error(pod, "leafCellType", f"must be text, got {shown(gpu_type)}", "a GPU type name, or empty for any")
    group = spec.get("affinityGroup")
    if group is None:
        return HivedSpec(vc.strip(), priority, gpus, gpu_type.strip(), None, None)
    group = _mapping(pod, group, "affinityGroup", ("name", "members"))
    name = group.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _error(pod, "affinityGroup.name", "is missing or empty", "the group's name")
    if len(name.strip()) > MAX_NAME_CHARS:
        raise _error(pod, f"affinityGroup.name {show(name)}", f"is {len(name.strip())} characters long",
                     f"a name of at most {MAX_NAME_CHARS} characters, as a Kubernetes object's")
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
    if size > MAX_GANG_MEMBERS:
        raise _error(pod, "affinityGroup.members", f"{size} pods in all is too many", f"1..{MAX_GANG_MEMBERS}")
    return HivedSpec(vc.strip(), priority, gpus, gpu_type.strip(), name.strip(), size, counts)


_SPEC = names.HIVED_POD_SCHEDULING_SPEC


class Hived(Statement):
    """What the pod's HiveD spec states (nothing where the pod has none)."""

    dialect = "hived"

    def __init__(self, reading: Reading, spec: HivedSpec | None) -> None:
        super().__init__(reading)
        self.spec = spec

    def ask(self) -> GpuAsk | None:
        """``leafCellNumber`` whole GPUs."""
        if self.spec is None:
            return None
        return GpuAsk("hived", _SPEC, f"annotation {_SPEC}: leafCellNumber {self.spec.gpus}", self.spec.gpus,
                      MILLI_PER_GPU)

    def models(self) -> list[Stated[frozenset[str]]]:
        """``leafCellType``, matched as a substring of the model (HiveD's cell types are names users chose)."""
        if self.spec is None or not self.spec.gpu_type:
            return []
        subject = f"annotation {_SPEC}: leafCellType {show(self.spec.gpu_type)}"
        wanted = [bounded(self.pod, _SPEC, subject, self.spec.gpu_type)]
        return [model_filter(self.pod, self.reading.options.known_models, "hived", _SPEC, subject, wanted,
                             "substring")]

    def groups(self) -> list[GroupClaim]:
        """The affinity group: all or nothing; its members of one GPU count (``leafCellNumber``) are one member
        group, whose size is their ``podNumber``."""
        spec = self.spec
        if spec is None or spec.group is None:
            return []
        parts = spec.group_parts or {}
        part_size = parts.get(spec.gpus)
        part = f"{spec.gpus}gpu" if len(parts) > 1 else None
        return [GroupClaim("hived", _SPEC, f"annotation {_SPEC}: affinityGroup.name {show(spec.group)}", spec.group,
                           spec.group_size, spec.group_size, part=part, part_minimum=part_size if part else None,
                           part_size=part_size if part else None)]

    def vc(self) -> Stated[str] | None:
        """``virtualCluster``. (Its subject names the annotation without the word "annotation", as the message
        of a VC disagreement always has.)"""
        if self.spec is None:
            return None
        return Stated("hived", _SPEC, f"{_SPEC}: virtualCluster {show(self.spec.vc)}", self.spec.vc)

    def priority(self) -> Stated[int] | None:
        """``priority``, where the spec states one."""
        if self.spec is None or self.spec.priority is None:
            return None
        return Stated("hived", _SPEC, f"annotation {_SPEC}: priority {self.spec.priority}", self.spec.priority)


def read(reading: Reading) -> Statement:
    """HiveD's dialect on the pod. The annotation is parsed here, before any other dialect is asked
    anything: a malformed spec is the first thing its pod is told."""
    return Hived(reading, parse_hived(reading.pod))
