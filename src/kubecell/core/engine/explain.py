"""What the engine tells people: why a job waits, and what each virtual cluster holds.

Every waiting job carries one specific sentence: the rule that stopped it and the numbers behind it
("VC a guarantee in use (16 of 16 GPUs) by work of equal or higher priority", "needs 2 member(s) of
8 GPU within one rack in its VC's cells; the roomiest node takes 1 member(s) now; 0/40 nodes fit one
member: 38 insufficient GPUs, 2 failed (unhealthy)").

The last part is kube-scheduler's "0/5000 nodes are available: 3 Insufficient nvidia.com/gpu, ...":
every node that cannot take one member is counted once, under the first check it fails in the fixed
order of ``NODE_REASONS`` (constraints the job or its tenancy puts on the node first, then the node's
health and hardware, then what is free on it, then reservations), so an operator sees at once whether
the job asks for something no node offers or waits for capacity. The checks are those of
``capacity.member_capacity``, vectorised over all nodes (waiting jobs are explained every cycle).

A heterogeneous gang names its groups ("needs gang of 1 x 4000m CPU (launcher) + 4 x 8 GPU (worker),
minimum 5 ...; group 'worker' needs 4, the nodes take 2 now ..."), the groups that cannot fit on their
own first; when each fits on its own, it names the group that does not fit beside the others.
"""

from __future__ import annotations

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, IntArray
from kubecell.core.engine.attempt import Attempt
from kubecell.core.engine.capacity import BIG, group_ids
from kubecell.core.engine.hetero import by_group
from kubecell.core.engine.job import Job, shape_text
from kubecell.core.engine.regions import Region
from kubecell.core.engine.session import Session
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.core.placement.filters import model_mask

NODE_REASONS = (
    "not allowed by the job's node constraints",
    "outside {scope}",
    "failed (unhealthy)",
    "no GPU of the requested model",
    "insufficient CPU",
    "insufficient memory",
    "insufficient GPUs",
    "insufficient GPUs within one {level} domain",
    "no GPU with enough free share",
    "no GPU with enough free memory",
    "reserved for a starving job",
    "too few healthy GPUs",
)
"""Why a node takes no member, in the order the checks are made: a node is counted under the first."""
(CONSTRAINED, OUTSIDE, FAILED, MODEL, CPU, MEMORY, GPUS, GROUP, SHARE, GPU_MEMORY, RESERVED,
 UNHEALTHY_GPUS) = range(len(NODE_REASONS))
FITS = len(NODE_REASONS)


def node_reasons(book: AllocationBook, member: Request, *, allowed: BoolArray | None = None,
                 gpus: BoolArray | None = None, scope: BoolArray | None = None,
                 blocked: BoolArray | None = None) -> tuple[IntArray, IntArray]:
    """Members each node can take now, and per node the index in ``NODE_REASONS`` of the first reason it
    takes none (``FITS`` where it takes one). ``allowed``: the nodes the job may use; ``gpus`` and
    ``scope``: its region's GPU and node masks; ``blocked``: nodes reservations hold against it. The
    capacity is ``member_capacity`` with those masks applied (the tests hold the two to it)."""
    first = np.full(book.size, FITS, np.int64)
    cap: IntArray = np.where(book.node_ok, BIG, 0).astype(np.int64)
    if member.cpu_milli:
        cpu = book.cpu_free // member.cpu_milli
        first[cpu == 0] = CPU
        cap = np.minimum(cap, cpu)
    if member.memory_mib:
        memory = book.mem_free // member.memory_mib
        first[(memory == 0) & (first == FITS)] = MEMORY
        cap = np.minimum(cap, memory)
    outside = None if scope is None else ~scope
    if member.wants_gpu:
        usable = book.gpu_present if gpus is None else book.gpu_present & gpus
        if gpus is not None:
            no_gpus: BoolArray = np.logical_not(usable.any(axis=1))
            outside = no_gpus if outside is None else outside | no_gpus
        healthy = usable & book.gpu_healthy
        gpu_cap, gpu_reason = _gpu_capacity(book, member, healthy)
        if not book.gpu_healthy[usable].all():  # would a node take it but for its unhealthy GPUs?
            gpu_reason = np.where((gpu_cap == 0) & _fits_if_healthy(book, member, usable), UNHEALTHY_GPUS,
                                  gpu_reason)
        first = np.where((gpu_cap == 0) & (first == FITS), gpu_reason, first)
        cap = np.minimum(cap, gpu_cap)
        if member.gpu_models is not None:
            wrong = ~model_mask(book, member)
            first[wrong] = MODEL
            cap = np.where(wrong, 0, cap)
    first[~book.node_ok] = FAILED
    if outside is not None:
        first[outside] = OUTSIDE
        cap = np.where(outside, 0, cap)
    if allowed is not None:
        first[~allowed] = CONSTRAINED
        cap = np.where(allowed, cap, 0)
    if blocked is not None:
        first[blocked & (cap > 0)] = RESERVED
        cap = np.where(blocked, 0, cap)
    first[cap > 0] = FITS
    return cap, first


def _fits_if_healthy(book: AllocationBook, member: Request, usable: BoolArray) -> BoolArray:
    """Nodes whose ``usable`` GPUs would take one member if every one of them were healthy (the raw free
    arrays: the book's derived ones already count an unhealthy GPU as full)."""
    if member.is_whole:
        free = (book.gpu_milli_free >= MILLI_PER_GPU) & usable
        return np.asarray(free.sum(axis=1) >= member.gpu_count)
    per_gpu = np.where(usable, book.gpu_milli_free // max(member.gpu_milli, 1), 0)
    if member.gpu_memory_mib:
        per_gpu = np.minimum(per_gpu, book.gpu_mem_free // member.gpu_memory_mib)
    return np.asarray(per_gpu.any(axis=1))


def _gpu_capacity(book: AllocationBook, member: Request, usable: BoolArray) -> tuple[IntArray, IntArray]:
    """Members each node's ``usable`` GPUs take, and the GPU reason for the nodes where that is none."""
    if member.is_whole:
        full = book.gpu_full & usable
        total = full.sum(axis=1)
        groups = group_ids(book, member.topology)
        if groups is None:
            return total // member.gpu_count, np.full(book.size, GPUS, np.int64)
        cap = np.zeros(book.size, np.int64)
        for group in range(book.max_gpus):
            cap += (full & (groups == group)).sum(axis=1) // member.gpu_count
        return cap, np.where(total < member.gpu_count, GPUS, GROUP)
    share = book.gpu_avail // max(member.gpu_milli, 1)
    per_gpu = np.where(usable, share, 0)
    shared = per_gpu.any(axis=1)
    if member.gpu_memory_mib:
        per_gpu = np.minimum(per_gpu, book.gpu_mem_free // member.gpu_memory_mib)
    return per_gpu.sum(axis=1), np.where(shared, GPU_MEMORY, SHARE)


def node_breakdown(first: IntArray, *, scope: str = "its region", level: TopologyLevel | None = None) -> str:
    """"3/40 nodes fit one member: 30 insufficient GPUs, 7 failed (unhealthy)": the non-zero reasons, most
    frequent first (ties in check order)."""
    counts = np.bincount(first, minlength=FITS + 1)
    text = f"{int(counts[FITS])}/{first.size} nodes fit one member"
    found = sorted((-int(counts[code]), code) for code in range(FITS) if counts[code])
    if not found:
        return text
    name = level.name.lower() if level is not None else "group"
    parts = [f"{-count} {NODE_REASONS[code].format(scope=scope, level=name)}" for count, code in found]
    return f"{text}: {', '.join(parts)}"


def no_room_reason(session: Session, attempt: Attempt, region: Region | None, where: str) -> str:
    spec = attempt.job.spec
    if spec.heterogeneous:
        return _gang_reason(session, attempt, region, where)
    blocking = session.reservations.blocking(attempt, session.jobs)
    member = spec.member_request(0)
    cap, first = node_reasons(
        session.book, member, allowed=session.allowed_nodes(attempt.job),
        gpus=None if region is None else region.mask, scope=None if region is None else region.nodes,
        blocked=None if region is None else blocking)
    best = int(cap.max(initial=0))
    what = f"{spec.minimum} member(s) of {shape_text(spec.member, cpu_amount=False)}"
    if spec.topology is not None and spec.members > 1:
        what += f" within one {spec.topology.name.lower()}"
    blocked = " (some capacity is reserved for starving jobs)" if blocking is not None else ""
    breakdown = node_breakdown(first, scope=region.label if region is not None else "", level=member.topology)
    return f"needs {what} {where}; the roomiest node takes {best} member(s) now{blocked}; {breakdown}"


def _gang_reason(session: Session, attempt: Attempt, region: Region | None, where: str) -> str:
    """A heterogeneous gang: what it needs, and per group of its minimum how the nodes fare; the groups
    that cannot fit even on their own come first, else the members do not fit together."""
    job = attempt.job
    spec = job.spec
    blocking = session.reservations.blocking(attempt, session.jobs)
    what = f"gang of {spec.describe()}"
    if spec.topology is not None:
        what += f" within one {spec.topology.name.lower()}"
    blocked = " (some capacity is reserved for starving jobs)" if blocking is not None else ""
    missing = [i for i in spec.fill_order()[:spec.minimum] if f"{spec.name}/{i}" not in job.running_members]
    short: list[str] = []
    other: list[str] = []
    for position, members in sorted(by_group(spec, missing).items()):
        group = spec.member_groups[position]
        member = spec.member_request(members[0])
        scope = None if region is None else region.nodes
        if region is not None and region.mask is not None and not member.wants_gpu:
            scope = session.gangs.hetero.group_nodes(member, region.mask, scope)
        cap, first = node_reasons(
            session.book, member, allowed=session.allowed_nodes(job), gpus=None if region is None else region.mask,
            scope=scope, blocked=None if region is None else blocking)
        total = int(np.minimum(cap, len(members)).sum())
        breakdown = node_breakdown(first, scope=region.label if region is not None else "", level=member.topology)
        text = (f"{group.title(position)} needs {len(members)}, the nodes take {total} now "
                f"(the roomiest {int(cap.max(initial=0))}); {breakdown}")
        (short if total < len(members) else other).append(text)
    if short:
        return f"needs {what} {where}{blocked}; " + "; ".join(short)
    together = "every group fits on its own but not all of them together"
    if spec.topology is not None:
        together += f" within one {spec.topology.name.lower()}"
    else:
        mask, nodes = (None, None) if region is None else session.filters(region, attempt)
        stuck = session.gangs.hetero.blocking_group(spec, mask, nodes, missing)
        if stuck is not None:
            together += (f": {spec.member_groups[stuck].title(stuck)} does not fit beside the others "
                         "(placed hardest first)")
    return f"needs {what} {where}{blocked}; {together}" + ("; " + "; ".join(other) if other else "")


def resize_text(session: Session, job: Job) -> str:
    """``; shrunk 8 -> 5 members at t=60: ...; grows again no earlier than t=360``: every resize of the
    job's current run, and when the resize interval holds its growth back (empty when neither applies)."""
    parts = list(job.resizes)
    interval = session.options.resize_min_interval_seconds
    if (job.name in session.growable and job.resized_at is not None and job.size < job.spec.members
            and interval > 0):
        parts.append(f"grows again no earlier than t={job.resized_at + interval:g} "
                     f"(resize_min_interval_seconds {interval:g})")
    return "".join(f"; {part}" for part in parts)


def status(session: Session) -> dict[str, dict[str, float]]:
    """Per VC: guaranteed, doomed, and used GPUs by class, and the cells bound to it."""
    out: dict[str, dict[str, float]] = {}
    for vc in session.tenants.vcs:
        usage = session.ledger.of(vc.name)
        out[vc.name] = {
            "guaranteed_gpus": vc.guaranteed_gpus,
            "doomed_gpus": session.tenancy.doomed_gpus(vc.name) if session.options.cells else 0,
            "guaranteed_used_gpus": usage.guaranteed_milli / 1000,
            "borrowed_gpus": usage.borrowed_milli / 1000,
            "opportunistic_gpus": usage.opportunistic_milli / 1000,
            "bound_cells": len(session.tenancy.bound_cells(vc.name)),
        }
    return out
