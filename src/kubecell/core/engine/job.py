"""Jobs: gangs of identical members that start together, and their life cycle.

A job is the scheduling unit. It has a headcount and a minimum: ``min_members == members`` is
all-or-nothing; a smaller minimum is KubeShare's threshold gang (start with at least ``min_members``,
grow to ``members`` when capacity allows). Every member asks for the same request: a share of one GPU
or whole GPUs, plus CPU and memory. A topology constraint keeps all members' GPUs within one cell of
that level (one NVLink group, one node, one rack).

Priority orders jobs inside a tenant; ``OPPORTUNISTIC_PRIORITY`` (-1) marks work that only scavenges
idle capacity and is reclaimed before anything else.

A member is charged against guarantees and borrowing limits in GPU units (milli-GPU): its compute share,
or, for a share asked for by GPU memory, at least the fraction of memory it takes (see
``admission.member_charge``), so a memory-only share never counts as zero GPUs.

A job may be restricted to some nodes (``nodes``): the driver evaluates what the engine does not know
(a Kubernetes pod's nodeSelector, its required node affinity, the taints it does not tolerate) and hands
over the names of the nodes that pass. The engine honours that set wherever a member gets capacity; it
turns it into a node mask once per job (``Session.allowed_nodes``), so an unrestricted job pays nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from kubecell.core.book import BoolArray
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_GANG_MEMBERS, check_amount
from kubecell.core.model import Request, TopologyLevel

OPPORTUNISTIC_PRIORITY = -1


class JobClass(Enum):
    """How a running job holds its resources, which decides who may take them back."""

    GUARANTEED = "guaranteed"  # inside its VC's guaranteed cells; preempted only by its own VC's priorities
    BORROWED = "borrowed"  # idle capacity beyond its VC's guarantee; reclaimable by owners
    OPPORTUNISTIC = "opportunistic"  # priority -1 scavenger; reclaimed first


class JobPhase(Enum):
    PENDING = "pending"
    RESERVED = "reserved"  # capacity held (victims terminating or bind in flight); nobody else may take it
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"  # withdrawn by its user (waiting or running)
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user submits. ``work`` is the seconds of execution the job needs at full size (for
    simulation); a job running with ``n`` of ``members`` members progresses at rate n / members."""

    name: str
    vc: str
    member: Request
    members: int = 1
    min_members: int | None = None
    priority: int = 0
    topology: TopologyLevel | None = None
    submit_time: float = 0.0
    work: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()
    nodes: frozenset[str] | None = None
    """The only nodes this job's members may use (a Kubernetes pod's nodeSelector, required node affinity
    and the taints it does not tolerate, evaluated by the driver); None: any node. An empty set is valid
    and means the job fits nowhere (it waits, saying so); names of unknown nodes never match."""

    def __post_init__(self) -> None:
        where = f"job {self.name!r}"
        if not self.name:
            raise InvalidInputError("job name is empty", field="name")
        if self.nodes is not None and (not isinstance(self.nodes, frozenset)
                                       or not all(isinstance(n, str) and n for n in self.nodes)):
            raise InvalidInputError(f"node restriction {self.nodes!r}", location=where, field="nodes",
                                    accepted="None (any node) or a frozenset of non-empty node names")
        if not self.vc:
            raise InvalidInputError("job has no virtual cluster", location=where, field="vc",
                                    accepted="the name of a VC from the tenant configuration")
        if self.members < 1:
            raise InvalidInputError(f"headcount {self.members} < 1", location=where, field="members")
        check_amount(self.members, MAX_GANG_MEMBERS, what="headcount", field="members", location=where, low=1)
        minimum = self.min_members if self.min_members is not None else self.members
        if not 1 <= minimum <= self.members:
            raise InvalidInputError(f"minimum {minimum} outside 1..{self.members}", location=where,
                                    field="min_members")
        if self.priority < OPPORTUNISTIC_PRIORITY:
            raise InvalidInputError(f"priority {self.priority}", location=where, field="priority",
                                    accepted=f"{OPPORTUNISTIC_PRIORITY} (opportunistic) or >= 0")
        if self.topology is not None and self.topology < TopologyLevel.NODE and self.members > 1:
            raise InvalidInputError(
                f"{self.members} members cannot all sit inside one {self.topology.name} cell",
                location=where, field="topology",
                accepted="node, rack, zone or none for multi-member jobs; nvlink/numa for single-member jobs",
            )
        if self.topology is not None and self.topology < TopologyLevel.NODE and not self.member.is_whole:
            raise InvalidInputError("a GPU share always sits on one GPU; an NVLink/NUMA constraint needs whole GPUs",
                                    location=where, field="topology")
        if self.work < 0 or not math.isfinite(self.work):
            raise InvalidInputError(f"work {self.work}", location=where, field="work", accepted="a finite value >= 0")

    @property
    def minimum(self) -> int:
        return self.min_members if self.min_members is not None else self.members

    @property
    def opportunistic(self) -> bool:
        return self.priority == OPPORTUNISTIC_PRIORITY

    @property
    def gpu_milli_per_member(self) -> int:
        return self.member.total_gpu_milli

    @property
    def total_gpu_milli(self) -> int:
        return self.member.total_gpu_milli * self.members

    @property
    def min_gpu_milli(self) -> int:
        return self.member.total_gpu_milli * self.minimum

    def member_request(self, index: int) -> Request:
        """The request of member ``index``, named ``<job>/<index>`` (allocation ids in the book)."""
        base = self.member
        return Request(
            name=f"{self.name}/{index}",
            cpu_milli=base.cpu_milli,
            memory_mib=base.memory_mib,
            gpu_count=base.gpu_count,
            gpu_milli=base.gpu_milli,
            gpu_memory_mib=base.gpu_memory_mib,
            gpu_models=base.gpu_models,
            topology=self.topology if self.topology is not None and self.topology < TopologyLevel.NODE
            else base.topology,
        )


@dataclass(slots=True)
class Job:
    """A submitted job and its scheduling state (owned by the engine)."""

    spec: JobSpec
    phase: JobPhase = JobPhase.PENDING
    job_class: JobClass | None = None
    running_members: list[str] = field(default_factory=list)  # allocation names in the book
    member_milli: int = 0
    """GPU units (milli-GPU) each member is charged against guarantees and limits; set at submission."""
    queued_at: float | None = None
    """When its current wait began: its age in the queue. A job whose bind fails or times out goes back
    with this age, so it does not lose its turn to the work it displaced."""
    started_at: float | None = None  # current run
    first_started_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    wait_reason: str = "not yet considered"
    reserved_until: float | None = None
    lazily_preempted: bool = False
    placement_score: int | None = None
    """The placement policy's score of the node its first new member went to when it last started or
    grew (None where no score was computed: one candidate node, a random policy, a restored job). For
    people watching the scheduler; no rule reads it."""
    node_mask: BoolArray | None = field(default=None, repr=False, compare=False)
    """``spec.nodes`` as a read-only mask over the book's nodes, made on first use (``Session.allowed_nodes``)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def vc(self) -> str:
        return self.spec.vc

    @property
    def size(self) -> int:
        return len(self.running_members)

    @property
    def held_gpu_milli(self) -> int:
        return self.member_milli * len(self.running_members)

    @property
    def min_milli(self) -> int:
        """GPU units the job needs to start (its minimum headcount)."""
        return self.member_milli * self.spec.minimum
