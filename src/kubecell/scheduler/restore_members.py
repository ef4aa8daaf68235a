"""The pods of one recorded job as the restore reads them: which pods make each gang's job, which member each pod
is, where its GPUs are now, and when the job was placed.

Split from ``restore`` (which decides whether a record is believed and rolled forward) because these answers
are plain arithmetic on records the restore has already checked, and the MIG tests ask ``held_indices`` alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubecell.core.engine.job import JobSpec
from kubecell.kube import pods
from kubecell.kube.dialects import PodDemand
from kubecell.kube.records import AllocationRecord
from kubecell.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler")

__all__ = ["Member", "gang_pods", "generation_of", "held_indices", "member_indices", "oldest_created", "one_model",
           "placed_at"]


@dataclass(frozen=True, slots=True)
class Member:
    """One pod of a recorded job, with its record and its own ask."""

    pod: dict[str, Any]
    record: AllocationRecord
    demand: PodDemand

    @property
    def bound(self) -> bool:
        return bool(pods.node_of(self.pod))



def gang_pods(by_job: Mapping[str, list[Member]], candidates: Iterable[dict[str, Any]],
              demand_of: Callable[[dict[str, Any]], PodDemand]) -> dict[str, list[tuple[dict[str, Any], PodDemand]]]:
    """Every pod of each recorded gang's job, by job name, read in one pass over ``candidates`` (the pods kubecell
    places) of their namespaces; ``demand_of`` reads a pod without a record.
    A gang restored as one job is made of all its pods, recorded or not (a gang's spec is made of all its pods,
    and its unrecorded pods are where it grows); of a gang restored as several generations, each is made of
    its own recorded pods, and the unrecorded ones form the next when complete, as before the restart."""
    keys = {m.demand.group.key for members in by_job.values() for m in members if m.demand.group is not None}
    found: dict[str, list[tuple[dict[str, Any], PodDemand]]] = {key: [] for key in keys}
    if not keys:
        return found
    recorded = {pods.uid(m.pod): m for members in by_job.values() for m in members}
    namespaces = {key.split("/", 1)[0] for key in keys}
    for pod in candidates:
        if (pod["metadata"].get("namespace") or "default") not in namespaces:
            continue
        member = recorded.get(pods.uid(pod))
        if member is not None:
            demand = member.demand
        elif pods.node_of(pod) or pods.is_done(pod) or pods.gated(pod):
            continue  # bound without a record kubecell believes: held where it runs, never a free member
        else:
            try:
                demand = demand_of(pod)
            except Exception:  # told when intake reads it; it is no member of the gang meanwhile
                continue
        if demand.group is not None and demand.group.key in found:
            found[demand.group.key].append((pod, demand))
    jobs_of: dict[str, list[str]] = {}
    for name, members in by_job.items():
        if members[0].demand.group is not None:
            jobs_of.setdefault(members[0].demand.group.key, []).append(name)
    by_name: dict[str, list[tuple[dict[str, Any], PodDemand]]] = {}
    for key, names in jobs_of.items():
        if len(names) == 1:
            by_name[names[0]] = sorted(found[key], key=lambda item: pods.key(item[0]))
        else:
            for name in names:
                by_name[name] = sorted(((m.pod, m.demand) for m in by_job[name]),
                                       key=lambda item: pods.key(item[0]))
    return by_name


def oldest_created(members: Sequence[Member]) -> float:
    """When the API server created the oldest of ``members``' pods (set by it, written by no one else); infinity
    where a time cannot be read."""
    try:
        return min(pods.created(m.pod) for m in members)
    except (ValueError, TypeError):
        return float("inf")


def placed_at(members: Sequence[Member], now: float) -> float:
    """When a job was placed, as its records say, but never before its pods existed (``creationTimestamp`` is the
    API server's; a record's time is only as honest as its writer) nor after ``now`` (a record from the future,
    ``createdAt`` 9999-12-31, would keep its job inside its minimum run time for ever, safe from reclaim). Jobs are
    restored in this order, so that where a guarantee shrank since, the jobs placed first keep its standing, as
    they held it before the restart (in name order, a job named ``a-...`` took it from an older ``b-...``); and a
    restored job has run since then (its ``started_at``)."""
    def one(member: Member) -> float:
        try:
            created = pods.created(member.pod)
        except (ValueError, TypeError):
            created = 0.0
        return min(max(member.record.created_at.timestamp(), created), now)

    return min(one(member) for member in members)


def generation_of(key: str, name: str) -> int | None:
    """The generation in job name ``name`` of gang ``key`` where kubecell could have written it (``<key>#<n>``: ASCII
    digits, no leading zero, as ``job_name`` writes them), else None."""
    suffix = name[len(key) + 1:] if name.startswith(f"{key}#") else ""
    return int(suffix) if suffix.isascii() and suffix.isdecimal() and not suffix.startswith("0") and len(suffix) < 10 \
        else None


def member_indices(spec: JobSpec, parts: Mapping[str, int], members: Sequence[Member]) -> dict[str, int]:
    """Each recorded pod's member index in ``spec``: its recorded index where that index is of the pod's own
    member group and free, else the lowest free index of that group (a gang whose pods changed since it was
    recorded: indices only pair the engine's members with pods, so renumbering loses nothing)."""
    taken: set[int] = set()
    chosen: dict[str, int] = {}
    waiting = []
    for member in sorted(members, key=lambda m: m.record.member):
        uid = pods.uid(member.pod)
        position = parts.get(uid, 0)
        index = member.record.member
        if index < spec.members and spec.group_position(index) == position and index not in taken:
            chosen[uid] = index
            taken.add(index)
        else:
            waiting.append((uid, position))
    for uid, position in waiting:
        start = spec.group_start(position)
        count = spec.member_groups[position].count
        index = next((i for i in range(start, start + count) if i not in taken), start + count)
        chosen[uid] = index  # past the group only when more pods were recorded than it has: the restore refuses
        taken.add(index)
    return chosen


def held_indices(state: Tracking, record: AllocationRecord) -> tuple[int, ...]:
    """The node's GPU indices a record holds, found by UUID: a GPU's index can change under a running pod (MIG
    instances recreated in another order, a board replaced), and its UUID is what the pod was given. A UUID
    the node no longer reports keeps the recorded index (the pod still holds that capacity)."""
    view = state.views.get(record.node)
    where = {uuid: index for index, uuid in enumerate(view.uuids)} if view is not None else {}
    found = tuple(where.get(gpu.uuid, gpu.index) for gpu in record.gpus)
    if found != tuple(gpu.index for gpu in record.gpus):
        log.info("%s: its GPUs are now at indices %s on %s (recorded %s)", record.allocation_id, found, record.node,
                 [gpu.index for gpu in record.gpus])
    return found


def one_model(state: Tracking, spec: JobSpec, members: Sequence[Member]) -> str | None:
    """The GPU model an elastic gang restored from ``members`` runs on, when its whole-GPU members accept more
    than that one and all run on it (then its job is pinned there, as the intake pins a gang that forms); None
    otherwise (members across models keep what their pods accept)."""
    member = spec.member
    if spec.heterogeneous or not member.wants_gpu or (member.gpu_models is not None and len(member.gpu_models) < 2):
        return None
    book = state.engine.book
    held = {book.model_names[book.model_id[book.index[m.record.node]]] for m in members
            if m.record.node in book.index}
    return held.pop() if len(held) == 1 else None
