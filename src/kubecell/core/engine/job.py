"""Jobs: gangs of members that start together, and their life cycle.

A job is the scheduling unit. It has a headcount and a minimum: ``min_members == members`` is
all-or-nothing; a smaller minimum is KubeShare's threshold gang (start with at least ``min_members``,
grow to ``members`` when capacity allows). A topology constraint keeps all members' GPUs within one
cell of that level (one NVLink group, one node, one rack).

A gang is made of *member groups* (``MemberGroup``): each group has its own request, headcount and
minimum, as in Volcano's tasks with ``minTaskMember`` or KAI-Scheduler's PodGroup ``subGroups`` (an MPI
launcher without GPUs plus N 8-GPU workers). A job without explicit groups is one group of identical
members (``member`` x ``members``), exactly the homogeneous gang it always was. Members are numbered
group by group, and the *fill order* (``JobSpec.fill_order``) says which members run when the gang runs
n of them: first every group's minimum (in group order), then the remaining members group by group. A
start, a growth and a restored gang's refill all follow it, so a running gang always holds every group's
minimum once it holds the gang's total minimum.

Priority orders jobs inside a tenant; ``OPPORTUNISTIC_PRIORITY`` (-1) marks work that only scavenges
idle capacity and is reclaimed before anything else.

A member is charged against guarantees and borrowing limits in GPU units (milli-GPU): its compute share,
or, for a share asked for by GPU memory, at least the fraction of memory it takes (see
``admission.member_charge``), so a memory-only share never counts as zero GPUs. Each member is charged
its own group's units.

A job may be restricted to some nodes (``nodes``): the driver evaluates what the engine does not know
(a Kubernetes pod's nodeSelector, its required node affinity, the taints it does not tolerate) and hands
over the names of the nodes that pass. The engine honours that set wherever a member gets capacity; it
turns it into a node mask once per job (``Session.allowed_nodes``), so an unrestricted job pays nothing.

What a user submits, and its checks, is ``job_spec.JobSpec`` (re-exported here); this module holds what the
engine keeps of a submitted job.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from kubecell.core.book import BoolArray
from kubecell.core.engine.groups import MemberGroup, member_index, shape_text
from kubecell.core.engine.job_spec import OPPORTUNISTIC_PRIORITY, JobSpec
from kubecell.core.model import Allocation

__all__ = ["OPPORTUNISTIC_PRIORITY", "Job", "JobClass", "JobPhase", "JobSpec", "MemberGroup", "member_index",
           "shape_text"]

RESIZES_KEPT = 4
"""Resize reasons a running job keeps for ``explain`` (the oldest go first)."""


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


@dataclass(slots=True)
class Job:
    """A submitted job and its scheduling state (owned by the engine)."""

    spec: JobSpec
    phase: JobPhase = JobPhase.PENDING
    job_class: JobClass | None = None
    running_members: list[str] = field(default_factory=list)  # allocation names in the book
    member_milli: int = 0
    """GPU units (milli-GPU) each member of the first group (of a homogeneous job: every member) is
    charged against guarantees and limits; set at submission (``admission.charge``)."""
    group_milli: tuple[int, ...] = ()
    """GPU units each member of each group is charged (() : every member is charged ``member_milli``)."""
    short_of_minimum: bool = False
    """Restored with fewer members than its minimums (pods died while the scheduler was away): it runs
    below them until growth refills it, the one exception to the minimum invariant."""
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
    resized_at: float | None = None
    """When its current run last grew or shrank (``EngineOptions.resize_min_interval_seconds`` counts from it)."""
    resizes: list[str] = field(default_factory=list)
    """Why its current run grew or shrank, oldest first (the last ``RESIZES_KEPT``; ``Engine.queries.explain``
    shows them)."""
    spare: tuple[int, ...] | None = None
    """Members of each group the driver can still bind (pods it has for them), where it said so
    (``Engine.limit_growth``): growth adds no more. None: its whole headcount."""
    ranks: dict[str, int] = field(default_factory=dict)
    """The driver's rank of running members (``Engine.rank_members``): a shrink gives up the highest first."""
    node_mask: BoolArray | None = field(default=None, repr=False, compare=False)
    """``spec.nodes`` as a read-only mask over the book's nodes, made on first use (``Session.allowed_nodes``)."""
    gpu_mask: BoolArray | None = field(default=None, repr=False, compare=False)
    """``spec.gpus`` as a read-only GPU mask, made on first use (``Session.allowed_gpus``)."""

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
    def charges(self) -> tuple[int, ...]:
        """GPU units per member of each group."""
        groups = len(self.spec.member_groups)
        return self.group_milli if len(self.group_milli) == groups else (self.member_milli,) * groups

    def charge_of(self, allocation: str) -> int:
        """GPU units the member with this allocation name is charged."""
        if not self.spec.heterogeneous:
            return self.member_milli
        return self.charges[self.spec.group_position(member_index(allocation))]

    def running_counts(self) -> tuple[int, ...]:
        """Running members per group."""
        if not self.spec.heterogeneous:
            return (len(self.running_members),)
        return self.spec.counts_of(member_index(name) for name in self.running_members)

    @property
    def held_gpu_milli(self) -> int:
        if not self.spec.heterogeneous:
            return self.member_milli * len(self.running_members)
        return sum(c * m for c, m in zip(self.running_counts(), self.charges, strict=True))

    @property
    def held_cpu_milli(self) -> int:
        """Milli-CPU its running members ask for (fair share counts CPU too)."""
        if not self.spec.heterogeneous:
            return self.spec.member.cpu_milli * len(self.running_members)
        return sum(c * g.member.cpu_milli for c, g in zip(self.running_counts(), self.spec.member_groups,
                                                           strict=True))

    def milli_of_first(self, n: int) -> int:
        """GPU units of the first ``n`` members of the fill order."""
        if not self.spec.heterogeneous:
            return self.member_milli * n
        return sum(c * m for c, m in zip(self.spec.first_counts(n), self.charges, strict=True))

    @property
    def min_milli(self) -> int:
        """GPU units the job needs to start: the members the fill order starts with at the total minimum."""
        return self.milli_of_first(self.spec.minimum)

    def members_within(self, milli: int) -> int:
        """The most members (at most the headcount; the first of the fill order) whose charge fits ``milli``."""
        spec = self.spec
        if not spec.heterogeneous:
            per = self.member_milli
            return spec.members if per <= 0 else max(0, min(spec.members, milli // per))
        charges, total, left = self.charges, 0, milli
        for position, _, count in spec.fill_segments():
            per = charges[position]
            take = count if per <= 0 else max(0, min(count, left // per))
            total += take
            left -= take * per
            if take < count:
                break
        return total

    def missing_members(self) -> Iterator[int]:
        """The member indices it does not run, in fill order (what growth adds next), one at a time: a gang's
        headcount is what its pods say, up to ``MAX_GANG_MEMBERS`` (four million), and growth adds no more
        than the pods that exist (``spare``), so a caller takes only the first few. Listing them all at each
        growth attempt cost 0.5 s per such gang and cycle, for a single pod of ``group-max`` 4194304."""
        running = {member_index(name) for name in self.running_members}
        return (i for i in self.spec.fill_order() if i not in running)

    def bindable_first(self, n: int) -> int:
        """How many of the first ``n`` members of the fill order the driver has pods for (``spare``): a start
        places no more, since a member without a pod could never be bound."""
        if self.spare is None:
            return n
        taken = 0
        for have, want in zip(self.spare, self.spec.first_counts(n), strict=True):
            if have < want:
                return taken + have  # the fill order stops at the first group short of pods
            taken += want
        return taken

    def spare_after(self, allocations: Iterable[Allocation]) -> tuple[int, ...] | None:
        """``spare`` once ``allocations`` (members just placed) took their pods."""
        if self.spare is None:
            return None
        used = self.spec.counts_of(member_index(a.name) for a in allocations)
        return tuple(max(s - u, 0) for s, u in zip(self.spare, used, strict=True))

    def affordable(self, indices: Sequence[int], milli: int | None) -> int:
        """How many of ``indices``, taken in order, fit ``milli`` GPU units (None: no limit)."""
        if milli is None:
            return len(indices)
        taken, left = 0, milli
        for index in indices:
            per = self.charges[self.spec.group_position(index)]
            if per > left:
                break
            left -= per
            taken += 1
        return taken

    def meets_minimums(self) -> bool:
        return self.spec.meets_minimums(self.running_counts())

    def resized(self, now: float, reason: str) -> None:
        """It grew or shrank at ``now``: the interval counts from here and ``explain`` says why."""
        self.resized_at = now
        self.resizes.append(reason)
        del self.resizes[:-RESIZES_KEPT]
