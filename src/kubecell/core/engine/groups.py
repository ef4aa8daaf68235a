"""Member groups: the kinds of members a heterogeneous gang is made of, and how messages name them.

Volcano's tasks (``minTaskMember``), KAI-Scheduler's PodGroup ``subGroups`` and the MPI operator's
launcher + workers all describe a gang as groups of identical members, each with its own request, count
and minimum. ``JobSpec`` (``job.py``) holds them and defines the fill order over them; this module holds
the group itself, its checks (every error names the job, the group, the value and what is accepted), and
the few words reasons use for a member's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_GANG_MEMBERS, check_amount
from kubecell.core.model import Request, TopologyLevel


@dataclass(frozen=True, slots=True)
class MemberGroup:
    """One kind of member of a gang: ``count`` members that each ask for ``member``, of which at least
    ``minimum`` must run whenever the gang runs. Checked where it joins a gang (``JobSpec``), so every
    error names the job and the group."""

    name: str  # e.g. "worker", "launcher"; unique within the job; may be "" for the single-group case
    member: Request
    count: int  # >= 1
    minimum: int  # 0..count

    def label(self, position: int) -> str:
        """How a gang's description names the group: its name, or its position when it has none."""
        return self.name or f"group {position}"

    def title(self, position: int) -> str:
        """How a reason names the group: ``group 'worker'``, or ``group 1`` when it has no name."""
        return f"group {self.name!r}" if self.name else f"group {position}"


Segment = tuple[int, int, int]
"""A run of the fill order: (group position, first member index, how many members)."""


def check_groups(name: str, groups: object) -> tuple[MemberGroup, ...]:
    """The groups as a tuple, or InvalidInputError naming the job, the group, the value and what is accepted."""
    where = f"job {name!r}"
    if not isinstance(groups, tuple | list) or not groups:
        raise InvalidInputError(f"member groups {groups!r}", location=where, field="groups",
                                accepted="a non-empty sequence of MemberGroup")
    seen: set[str] = set()
    for position, group in enumerate(groups):
        if not isinstance(group, MemberGroup):
            raise InvalidInputError(f"member group {position} is a {type(group).__name__}", location=where,
                                    field="groups", accepted="MemberGroup(name, member, count, minimum)")
        at = f"{where} group {group.label(position)!r}"
        if not isinstance(group.name, str):
            raise InvalidInputError(f"group name {group.name!r}", location=at, field="name", accepted="a string")
        if group.name in seen:
            raise InvalidInputError(f"duplicate group name {group.name!r}", location=where, field="groups",
                                    accepted="names unique within the job")
        seen.add(group.name)
        if not isinstance(group.member, Request):
            raise InvalidInputError(f"member {group.member!r}", location=at, field="member", accepted="a Request")
        if isinstance(group.count, bool) or not isinstance(group.count, int) or group.count < 1:
            raise InvalidInputError(f"count {group.count!r}", location=at, field="count",
                                    accepted=f"an integer in 1..{MAX_GANG_MEMBERS}")
        check_amount(group.count, MAX_GANG_MEMBERS, what="group headcount", field="count", location=at, low=1)
        if isinstance(group.minimum, bool) or not isinstance(group.minimum, int) \
                or not 0 <= group.minimum <= group.count:
            raise InvalidInputError(f"minimum {group.minimum!r}", location=at, field="minimum",
                                    accepted=f"an integer in 0..{group.count} (the group's count)")
        topology = group.member.topology
        if topology is not None and topology < TopologyLevel.NODE and not group.member.is_whole:
            raise InvalidInputError(f"a {topology.name.lower()} constraint on a member that is not whole GPUs",
                                    location=at, field="member.topology",
                                    accepted="nvlink/numa only for members of whole GPUs; node, rack or zone "
                                             "go on the job")
    return tuple(groups)


def shape_text(member: Request, *, cpu_amount: bool = True) -> str:
    """``8 GPU``, ``500 milli-GPU``, ``4096 MiB of GPU memory``, ``4000m CPU`` (or ``CPU``)."""
    if member.is_whole:
        return f"{member.gpu_count} GPU"
    if member.gpu_milli:
        return f"{member.gpu_milli} milli-GPU"
    if member.wants_gpu:
        return f"{member.gpu_memory_mib} MiB of GPU memory"
    return f"{member.cpu_milli}m CPU" if cpu_amount else "CPU"


def member_index(allocation: str) -> int:
    """The member index of an allocation name ``<job>/<index>``."""
    return int(allocation.rsplit("/", 1)[1])
