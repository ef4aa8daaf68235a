"""What a pod asks of kubecell, whatever dialect it was written in, and the one error type for a bad ask.

Every dialect reader fills the same few values (a core ``Request``, a group, a VC, a priority, an
isolation mode), so the scheduler downstream never needs to know that a pod was written for HAMi or
HiveD. A pod that cannot be read raises ``DemandError``: its text is the Warning Event the pod gets, so
it names the pod, the exact label, annotation or resource, the value found and what would be accepted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import GPU_MODELS, Request, TopologyLevel
from kubecell.core.shown import shown

Isolation = Literal["accounting", "mps", "mig"]

MAX_NAME_CHARS = 253
"""The longest name kubecell keeps from a pod (a group's name): a Kubernetes object's name is at most 253
characters, and a group key ``<namespace>/<name>`` goes into every member's allocation record."""

OPPORTUNISTIC = -1
"""The priority of opportunistic work (kubecell's ``opportunistic`` annotation, HiveD's and KubeShare's lowest):
it scavenges idle GPUs and is reclaimed first."""

LARGEST_CATALOG_GPU_MEMORY_MIB = max(spec.memory_mib for spec in GPU_MODELS.values())
"""The most memory any GPU of the catalog has: a memory share above it cannot fit anywhere."""


class DemandError(InvalidInputError):
    """A pod whose GPU, group or tenancy ask kubecell cannot accept.

    Rendered as ``pod <namespace>/<name>: <subject>: <what is wrong> (accepted: ...)``, where the subject
    is the label, annotation or resource as the user wrote it (``aliyun.com/gpu-mem 0``,
    ``annotation kubecell.io/topology "row"``). ``field`` is the bare name, for callers that group
    errors by field.
    """

    def __init__(self, pod: str, subject: str, message: str, *, field: str, accepted: str | None = None) -> None:
        self.pod = pod
        self.subject = subject
        super().__init__(message, location=f"pod {pod}", field=field, accepted=accepted)

    def _render(self) -> str:
        text = f"pod {self.pod}: {self.subject}: {self.message}"
        if self.accepted:
            text += f" (accepted: {self.accepted})"
        return text


@dataclass(frozen=True, slots=True)
class DialectOptions:
    """How to read dialects whose meaning depends on the cluster.

    ``aliyun_memory_unit``: gpushare's device plugin counts ``aliyun.com/gpu-mem`` in GiB unless it runs
    with ``--memory-unit=MiB``; the pod cannot say which, so the operator does. ``largest_gpu_memory_mib``:
    a memory share above it can never be placed (default: the largest GPU of the catalog; a driver that
    knows the cluster passes the largest GPU it has). ``known_models``: the GPU model names nodes report
    (catalog names, or product names for GPUs the catalog does not know); model filters are matched
    against them, and a filter that matches none of them is refused rather than left pending forever.
    """

    aliyun_memory_unit: Literal["GiB", "MiB"] = "GiB"
    largest_gpu_memory_mib: int = LARGEST_CATALOG_GPU_MEMORY_MIB
    known_models: frozenset[str] = field(default_factory=lambda: frozenset(GPU_MODELS))


@dataclass(frozen=True, slots=True)
class GroupDemand:
    """The gang a pod belongs to.

    ``key`` is ``<namespace>/<name>``: groups never span namespaces, so two teams using the same group
    name never join each other's gang. ``size`` is the headcount, or None where the source states only
    a minimum (PodGroups: the group is then the pods that name it). ``minimum`` is how many members must
    start together; None only while ``waiting_for`` names the PodGroup object not seen yet. ``part`` and its
    numbers say which member group of a heterogeneous gang the pod is (``scheduler.jobs.gang_spec``).
    """

    key: str
    source: str
    size: int | None
    minimum: int | None
    waiting_for: str | None = None
    part: str | None = None
    """The member group the pod declares within its gang: a Volcano task (``volcano.sh/task-spec``), a
    KAI-Scheduler subgroup (``kai.scheduler/subgroup-name``), a HiveD member shape (``<n>gpu``). None: the
    pod's group is the pods of the gang that ask alike."""
    part_minimum: int | None = None
    """How many pods of ``part`` must run whenever the gang runs (Volcano's ``minTaskMember``, a KAI
    subgroup's ``minMember``, HiveD: all of them); None where the source states none."""
    part_size: int | None = None
    """How many pods ``part`` has, where the source states it (HiveD's ``podNumber``)."""
    maximum: int | None = None
    """An elastic gang (``kubecell.io/group-max``, written by the ElasticJob controller): the most members it
    may ever run. Its headcount ``size`` is then only the number of pods its controller made for the current
    target, which the scheduler itself moves (``scheduler.elastic``); the engine job's headcount is
    ``maximum`` and it binds only the pods that exist."""


@dataclass(frozen=True, slots=True)
class PodDemand:
    """One pod read for scheduling: the core request of one member and everything around it.

    ``priority`` is the pod's ``spec.priority`` unless a dialect states it (-1 = opportunistic:
    scavenges idle GPUs and is reclaimed first). ``vc`` is None when no dialect names a tenant (the
    driver then applies its default). ``dialects`` lists every dialect that contributed, in a fixed
    order, e.g. ``("kubecell", "coscheduling")``; a CPU-only pod with no kubecell annotations has none.
    """

    pod: str
    request: Request
    group: GroupDemand | None
    vc: str | None
    priority: int
    isolation: Isolation
    dialects: tuple[str, ...]
    devices: frozenset[tuple[str, int]] | None = None
    """The only GPUs (node, GPU index) its DRA ResourceClaims' selectors accept; None: any (no claims, or
    selectors that narrow nothing). Set by the scheduler, which sees the published devices; no dialect sets it."""

    @property
    def opportunistic(self) -> bool:
        return self.priority == OPPORTUNISTIC

    @property
    def topology(self) -> TopologyLevel | None:
        """The topology constraint (``kubecell.io/topology``), carried by the request."""
        return self.request.topology


def show(value: object) -> str:
    """A label or annotation value as it appears in a message: quoted, and cut when long."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, float | Decimal) else shown(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return json.dumps(text, ensure_ascii=False)




@dataclass(frozen=True, slots=True)
class PodMeta:
    """The parts of a Pod object the dialect readers look at, and how they name it in errors."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    spec: Mapping[str, Any]

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodMeta:
        meta = pod.get("metadata") or {}
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            spec=pod.get("spec") or {},
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def error(self, subject: str, message: str, *, field: str, accepted: str | None = None) -> DemandError:
        return DemandError(self.key, subject, message, field=field, accepted=accepted)

    def annotation_error(self, name: str, message: str, accepted: str | None = None) -> DemandError:
        return self.error(f"annotation {name} {show(self.annotations.get(name, ''))}", message, field=name,
                          accepted=accepted)

    def label_error(self, name: str, message: str, accepted: str | None = None) -> DemandError:
        return self.error(f"label {name} {show(self.labels.get(name, ''))}", message, field=name, accepted=accepted)
