"""What one dialect states about a pod: the one reader interface every dialect module exposes.

Each dialect module (``kubecell``, ``nvidia``, ``hami``, ``aliyun``, ``alnair``, ``kubeshare``, ``hived``,
``podgroups``) has one ``read(reading) -> Statement``. A ``Statement`` answers, aspect by aspect, what its
system states about the pod: a GPU ask, GPU model filters, group claims, a virtual cluster, a priority; an
aspect a system never states keeps the base answer here (nothing). Every answer carries the dialect, the
field and the subject as the user wrote it, so the entry point (``pod``) can merge answers of several
dialects and name both sides of a disagreement without knowing any dialect.

The entry point asks aspect by aspect (every ask, then every model filter, then every group claim ...),
not dialect by dialect: a pod with several faults is told the first fault of the first aspect, whichever
dialects it mixes. So ``read`` does only what must come before any aspect (HiveD parses its annotation
there, which also makes a malformed annotation the first thing a pod is told); everything else is read
when asked, and each aspect is asked once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Generic, TypeVar

from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube.dialects.demand import MAX_NAME_CHARS, DialectOptions, PodMeta

T = TypeVar("T")

PodGroups = Mapping[tuple[str, str], Mapping[str, Any]]
"""Known PodGroup objects by (namespace, name): their ``spec`` (at least ``minMember``)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """What every dialect reader is given: the pod, its resource totals as kube-scheduler adds them
    (``resources.pod_totals``), how the cluster wants dialects read, and the PodGroup objects known."""

    pod: PodMeta
    totals: Mapping[str, Decimal]
    options: DialectOptions
    pod_groups: PodGroups


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """One dialect's GPU ask, per GPU: ``count`` GPUs with ``milli`` and ``memory_mib`` of each."""

    dialect: str
    field: str
    subject: str
    count: int
    milli: int
    memory_mib: int = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.count, self.milli, self.memory_mib)

    def describe(self) -> str:
        if self.milli == MILLI_PER_GPU:
            return f"{self.count} whole GPU" + ("s" if self.count != 1 else "")
        parts = [f"{self.milli} milli"] if self.milli else []
        parts += [f"{self.memory_mib} MiB"] if self.memory_mib else []
        return " and ".join(parts) + " of one GPU"


@dataclass(frozen=True, slots=True)
class Stated(Generic[T]):
    """One dialect's value for an aspect a pod states once: a VC, a priority, a set of allowed GPU models."""

    dialect: str
    field: str
    subject: str
    value: T


@dataclass(frozen=True, slots=True)
class GroupClaim:
    """One source's statement about the pod's group (``demand.GroupDemand`` says what each number means)."""

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
    maximum: int | None = None


class Statement:
    """What one dialect states about one pod; a subclass overrides the aspects its system states.

    ``dialect`` is the name the pod's ``PodDemand.dialects`` lists (group claims name their own source,
    which may differ: ``podgroups`` claims for coscheduling, Volcano and KAI)."""

    dialect: ClassVar[str] = ""

    def __init__(self, reading: Reading) -> None:
        self.reading = reading
        self.pod = reading.pod

    def ask(self) -> GpuAsk | None:
        """The pod's GPU ask in this dialect, or None where the dialect asks for no GPU."""
        return None

    def models(self) -> list[Stated[frozenset[str]]]:
        """The GPU model filters the dialect states, each already matched against the known models."""
        return []

    def groups(self) -> list[GroupClaim]:
        """The groups the dialect puts the pod in (several sources may share one dialect module)."""
        return []

    def vc(self) -> Stated[str] | None:
        """The virtual cluster the dialect names."""
        return None

    def priority(self) -> Stated[int] | None:
        """The priority the dialect states (-1 = opportunistic), or None: the pod's own priority stands."""
        return None

    def carried(self) -> bool:
        """Whether the dialect is on the pod beyond what the aspects above tell (kubecell's topology
        annotation): it is listed among the pod's dialects all the same."""
        return False


def group_name(pod: PodMeta, name: str, subject: str, field: str) -> str:
    """A group's name, trimmed: it becomes ``<namespace>/<name>``, the job of every member's allocation
    record, so it is at most as long as a Kubernetes object's name."""
    stripped = name.strip()
    if not stripped:
        raise pod.error(subject, "is empty", field=field, accepted="the group's name")
    if len(stripped) > MAX_NAME_CHARS:
        raise pod.error(subject, f"is {len(stripped)} characters long", field=field,
                        accepted=f"a name of at most {MAX_NAME_CHARS} characters, as a Kubernetes object's")
    return stripped
