"""What a user submits: a gang's members, groups, minimum, priority, topology and restrictions.

A ``JobSpec`` is immutable and checked when made, so a malformed request (a minimum above the headcount, a
share with an NVLink constraint, NaN work) is refused with the field that is wrong before the engine sees it.
It also answers the questions every driver asks of a gang's shape: which members run when n of them run (the
fill order), each member's request, the GPUs its first n members need. The scheduling state of a submitted
job is ``job.Job``; the life cycle is described there.
"""

from __future__ import annotations

import math
import reprlib
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kubecell.core.engine.groups import MemberGroup, Segment, check_groups, member_index, shape_text
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_GANG_MEMBERS, check_amount, is_whole
from kubecell.core.model import Request, TopologyLevel

__all__ = ["OPPORTUNISTIC_PRIORITY", "JobSpec", "MemberGroup", "member_index", "shape_text"]

OPPORTUNISTIC_PRIORITY = -1
"""The priority of work that only scavenges idle capacity and is reclaimed before anything else."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user submits. ``work`` is the seconds of execution the job needs at full size (for
    simulation); a job running with ``n`` of ``members`` members progresses at rate n / members.

    With ``groups`` the gang is heterogeneous: ``member`` is then the first group's request and
    ``members`` the sum of the groups' counts (``JobSpec.gang`` fills both in); ``min_members`` is the
    total minimum, at least the sum of the group minimums."""

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
    groups: tuple[MemberGroup, ...] = ()
    """The member groups; () is one group of ``members`` identical ``member`` requests."""
    gpus: frozenset[tuple[str, int]] | None = None
    """The only GPUs (node name, GPU index on that node) this job's members may take: what a DRA claim's
    device selectors left of the devices the nodes publish, evaluated by the driver; None: any GPU. It also
    limits the nodes (to those with such a GPU). An empty set is valid: the job fits nowhere and says so."""
    expected_seconds: float | None = None
    """How long the job is expected to run, from the history of its family (``core.estimates``); None: no
    history. Read only to order a VC's own waiting jobs (``EngineOptions.queue_order``), never for guarantees."""
    _groups: tuple[MemberGroup, ...] = field(default=(), init=False, repr=False, compare=False)
    _starts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _segments: tuple[Segment, ...] = field(default=(), init=False, repr=False, compare=False)
    _fill: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"job {self.name!r}"
        if not self.name:
            raise InvalidInputError("job name is empty", field="name")
        if self.nodes is not None and (not isinstance(self.nodes, frozenset)
                                       or not all(isinstance(n, str) and n for n in self.nodes)):
            raise InvalidInputError(f"node restriction {self.nodes!r}", location=where, field="nodes",
                                    accepted="None (any node) or a frozenset of non-empty node names")
        if self.gpus is not None and (not isinstance(self.gpus, frozenset) or not all(
                isinstance(g, tuple) and len(g) == 2 and isinstance(g[0], str) and g[0] and isinstance(g[1], int)
                and g[1] >= 0 for g in self.gpus)):
            raise InvalidInputError(f"GPU restriction {reprlib.repr(self.gpus)}", location=where, field="gpus",
                                    accepted="None (any GPU) or a frozenset of (node name, GPU index >= 0)")
        if not self.vc:
            raise InvalidInputError("job has no virtual cluster", location=where, field="vc",
                                    accepted="the name of a VC from the tenant configuration")
        if self.groups != ():
            self._check_against_groups(where)
        if self.members < 1:
            raise InvalidInputError(f"headcount {self.members} < 1", location=where, field="members")
        check_amount(self.members, MAX_GANG_MEMBERS, what="headcount", field="members", location=where, low=1)
        minimum = self.min_members if self.min_members is not None else self.members
        if not is_whole(minimum) or not 1 <= minimum <= self.members:
            raise InvalidInputError(f"minimum {minimum} outside 1..{self.members}", location=where,
                                    field="min_members")
        if self.expected_seconds is not None and not (math.isfinite(self.expected_seconds)
                                                      and self.expected_seconds >= 0):
            raise InvalidInputError(f"expected run time {self.expected_seconds!r}", location=where,
                                    field="expected_seconds", accepted="None or finite seconds >= 0")
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
        self._lay_out()

    def _check_against_groups(self, where: str) -> None:
        groups = check_groups(self.name, self.groups)
        if not isinstance(self.groups, tuple):
            raise InvalidInputError("member groups given as a list", location=where, field="groups",
                                    accepted="a tuple of MemberGroup (JobSpec.gang converts)")
        if self.member != groups[0].member:
            raise InvalidInputError("member differs from the first group's request", location=where,
                                    field="member", accepted="groups[0].member (JobSpec.gang fills it in)")
        total = sum(g.count for g in groups)
        if self.members != total:
            raise InvalidInputError(f"headcount {self.members} is not the groups' total {total}", location=where,
                                    field="members", accepted=f"{total} (JobSpec.gang fills it in)")
        check_amount(total, MAX_GANG_MEMBERS, what="headcount (all groups)", field="members", location=where,
                     low=1)
        floor = sum(g.minimum for g in groups)
        minimum = self.min_members if self.min_members is not None else total
        if not max(floor, 1) <= minimum <= total:
            raise InvalidInputError(f"total minimum {minimum} outside {max(floor, 1)}..{total}", location=where,
                                    field="min_members",
                                    accepted=f"{max(floor, 1)} (the sum of the group minimums, at least 1) to "
                                             f"{total} (the headcount)")

    def _lay_out(self) -> None:
        """The groups (explicit or implied), where each one's members start, and the fill order as runs of
        members (O(groups))."""
        groups = self.groups or (MemberGroup("", self.member, self.members, self.minimum),)
        starts, first = [], 0
        for group in groups:
            starts.append(first)
            first += group.count
        segments: list[Segment] = [(g, starts[g], group.minimum) for g, group in enumerate(groups) if group.minimum]
        segments += [(g, starts[g] + group.minimum, group.count - group.minimum) for g, group in enumerate(groups)
                     if group.count > group.minimum]
        object.__setattr__(self, "_groups", groups)
        object.__setattr__(self, "_starts", tuple(starts))
        object.__setattr__(self, "_segments", tuple(segments))

    @classmethod
    def gang(cls, name: str, vc: str, groups: Sequence[MemberGroup], *, min_members: int | None = None,
             priority: int = 0, topology: TopologyLevel | None = None, submit_time: float = 0.0,
             work: float = 0.0, labels: tuple[tuple[str, str], ...] = (),
             nodes: frozenset[str] | None = None, gpus: frozenset[tuple[str, int]] | None = None) -> JobSpec:
        """A gang of member groups; ``member`` and ``members`` come from the groups. ``min_members`` (the
        total minimum) defaults to the sum of the group minimums (at least 1): with every group's minimum
        equal to its count the gang is all-or-nothing."""
        checked = check_groups(name or "?", tuple(groups) if isinstance(groups, list) else groups)
        if min_members is None:
            min_members = max(1, sum(g.minimum for g in checked))
        return cls(name=name, vc=vc, member=checked[0].member, members=sum(g.count for g in checked),
                   min_members=min_members, priority=priority, topology=topology, submit_time=submit_time,
                   work=work, labels=labels, nodes=nodes, groups=checked, gpus=gpus)

    # ------------------------------------------------------------------ groups and the fill order
    @property
    def member_groups(self) -> tuple[MemberGroup, ...]:
        """The explicit groups, or the implied single group of a homogeneous job."""
        return self._groups

    @property
    def heterogeneous(self) -> bool:
        """Members of more than one group (a single group behaves exactly as a homogeneous job)."""
        return len(self.groups) > 1

    def group_position(self, index: int) -> int:
        """The position of the group member ``index`` belongs to (members are numbered group by group)."""
        if not 0 <= index < self.members:
            raise InvalidInputError(f"member index {index}", location=f"job {self.name!r}", field="index",
                                    accepted=f"0..{self.members - 1}")
        return bisect_right(self._starts, index) - 1 if len(self.groups) > 1 else 0

    def group_of(self, index: int) -> MemberGroup:
        return self.member_groups[self.group_position(index)]

    def group_start(self, position: int) -> int:
        """The index of the first member of group ``position``."""
        return self._starts[position]

    def fill_segments(self) -> tuple[Segment, ...]:
        """The fill order as runs (group position, first index, count): every group's minimum in group
        order, then the rest of each group in group order."""
        return self._segments

    def fill_order(self) -> Sequence[int]:
        """Member indices in the order a gang adds them: the ones it runs at n members are the first n.

        First each group's ``minimum`` members (group by group, lowest indices first), then the remaining
        members group by group. Starts, growth and the refill of a restored gang all follow it, so the
        first ``minimum`` members hold every group's minimum (the total minimum is at least their sum).
        For a homogeneous job it is ``range(members)``."""
        if len(self.groups) <= 1:
            return range(self.members)
        if self._fill is None:
            object.__setattr__(self, "_fill", tuple(i for _, first, count in self._segments
                                                    for i in range(first, first + count)))
        assert self._fill is not None
        return self._fill

    def first_counts(self, n: int) -> tuple[int, ...]:
        """Members of each group among the first ``n`` of the fill order (O(groups))."""
        counts = [0] * len(self.member_groups)
        left = max(n, 0)
        for position, _, count in self._segments:
            take = min(count, left)
            counts[position] += take
            left -= take
            if not left:
                break
        return tuple(counts)

    def counts_of(self, indices: Iterable[int]) -> tuple[int, ...]:
        """Members of each group among ``indices``."""
        counts = [0] * len(self.member_groups)
        for index in indices:
            counts[self.group_position(index)] += 1
        return tuple(counts)

    def meets_minimums(self, counts: Sequence[int]) -> bool:
        """Do these members per group satisfy every group's minimum, the total minimum and the counts?"""
        groups = self.member_groups
        return (self.minimum <= sum(counts) <= self.members
                and all(g.minimum <= c <= g.count for g, c in zip(groups, counts, strict=True)))

    # ------------------------------------------------------------------ aggregates over the groups
    @property
    def wants_gpu(self) -> bool:
        """Does any member ask for a GPU (then the job is GPU work, held in cells and charged)?"""
        return any(g.member.wants_gpu for g in self.member_groups)

    @property
    def gpu_models(self) -> frozenset[str] | None:
        """The GPU models any GPU member accepts (None: some accept any). Cell filters use it; every
        member's own models are checked again where it is placed, so the union only widens a search."""
        models: set[str] = set()
        for group in self.member_groups:
            if group.member.wants_gpu:
                if group.member.gpu_models is None:
                    return None
                models |= group.member.gpu_models
        return frozenset(models) if models else self.member.gpu_models

    def gpus_of_first(self, n: int, *, whole_only: bool = False) -> int:
        """GPUs (a share counts one GPU) the first ``n`` members of the fill order ask for; with
        ``whole_only``, the completely free GPUs their whole-GPU members need."""
        groups = self.member_groups
        return sum(c * g.member.gpu_count for g, c in zip(groups, self.first_counts(n), strict=True)
                   if not whole_only or g.member.is_whole)

    @property
    def minimum(self) -> int:
        return self.min_members if self.min_members is not None else self.members

    @property
    def opportunistic(self) -> bool:
        return self.priority == OPPORTUNISTIC_PRIORITY

    @property
    def gpu_milli_per_member(self) -> int:
        """A member of the first group (every member, for a homogeneous job)."""
        return self.member.total_gpu_milli

    @property
    def total_gpu_milli(self) -> int:
        return sum(g.member.total_gpu_milli * g.count for g in self.member_groups)

    @property
    def min_gpu_milli(self) -> int:
        counts = self.first_counts(self.minimum)
        return sum(g.member.total_gpu_milli * c for g, c in zip(self.member_groups, counts, strict=True))

    def describe(self) -> str:
        """``1 x 4000m CPU (launcher) + 4 x 8 GPU (worker, min 2), minimum 3`` (messages name the groups)."""
        parts = []
        for position, group in enumerate(self.member_groups):
            extra = f", min {group.minimum}" if group.minimum < group.count else ""
            parts.append(f"{group.count} x {shape_text(group.member)} ({group.label(position)}{extra})")
        return f"{' + '.join(parts)}, minimum {self.minimum}"

    def member_request(self, index: int) -> Request:
        """The request of member ``index`` (its group's), named ``<job>/<index>`` (allocation ids in the book)."""
        base = self.member if len(self.groups) <= 1 else self.group_of(index).member
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
            profile=base.profile,
        )
