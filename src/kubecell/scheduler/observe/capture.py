"""Taking a ``Snapshot`` of a running scheduler, on its own thread, in a few milliseconds per changed node.

The per-GPU figures are read from the engine's allocation book as whole arrays (allocated milli and MiB,
health); only allocations (not GPUs) are walked in Python, to name who holds each GPU. A GPU map of
5,000 nodes x 8 GPUs is 40,000 immutable cells, and building that many objects is what costs; so a
``CaptureCache`` keeps each node's cells and rebuilds only the nodes whose book version moved since the
last snapshot of the same engine (a new engine, after a rebuild, starts afresh).

Fragmentation is FGD's measure (``kubecell.core.placement.frag``): the share of the free GPU milli that
the workload's typical pods cannot use. The typical pods are the placement policy's own (FGD's given
distribution, or the demand the ``kubecell`` policy learned from arrivals), else the configured ones
(``LoopView.typical_pods``); when none is known yet (a scheduler that has seen no arrival), it is the share
of free milli that sits on partially used GPUs, and ``extra["fragmentation_typical_pods"]`` is 0.

A snapshot reads the loop through ``LoopView`` alone (``kubecell.scheduler.observe.view``): the loop imports this
module to publish snapshots, so this module never imports the loop.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.digits import decimal_digits
from kubecell.core.engine.engine import Engine
from kubecell.core.model import MILLI_PER_GPU
from kubecell.core.placement.frag import FragmentationMeasure, TypicalPod
from kubecell.core.placement.policies.expected_waste import ExpectedWastePolicy
from kubecell.core.placement.policies.fgd import FragmentationGradientDescent
from kubecell.core.placement.policy import Policy
from kubecell.kube import pods
from kubecell.scheduler.observe.reasons import reason_kind
from kubecell.scheduler.observe.snapshot import GpuCell, NodeCell, PendingJob, Snapshot, VcState
from kubecell.scheduler.observe.view import LoopView
from kubecell.scheduler.tracking import Tracking

OTHER = "other"
"""The owner shown for capacity held by pods another scheduler bound."""
_NONE: tuple[str, ...] = ()
_VC_OF = attrgetter("spec.vc")


@dataclass
class CaptureCache:
    """What one engine's snapshots share: GPU cells per node (valid while the node's book version stands),
    the node list, and the fragmentation measure (valid while the typical pods stand)."""

    engine: Engine | None = None
    versions: Any = None
    """Book version of each node when its cells were built (numpy int64 array)."""
    cells: list[tuple[GpuCell, ...]] = field(default_factory=list)
    nodes: tuple[NodeCell, ...] = ()
    node_generation: int = 0
    """``Tracking.node_generation`` the node list was made for (nodes closed or opened in place)."""
    measure: tuple[tuple[TypicalPod, ...], FragmentationMeasure] | None = None


GHOST = "lost: a ghost of the cluster the tenants were accepted on (its cells doomed)"
"""Why a node the engine holds but the cluster no longer has takes nothing (``kubecell.kube.accepted``)."""


def capture(scheduler: LoopView, *, cache: CaptureCache | None = None, leading: bool = True,
            previous: Snapshot | None = None, now: float | None = None) -> Snapshot:
    """A snapshot of ``scheduler`` (call on its thread). Without an engine (before the first rebuild, or
    with no node) it is ``previous`` marked ``rebuilding``, or an empty one."""
    now = time.time() if now is None else now
    state = scheduler.state
    rebuilding = scheduler.needs_rebuild or state is None
    if state is None:
        if previous is not None:
            return replace(previous, rebuilding=True, leading=leading)
        return Snapshot(taken_at=now, cycle=scheduler.cycles, leading=leading, rebuilding=True)
    cache = cache if cache is not None else CaptureCache()
    engine = state.engine
    if cache.engine is not engine or cache.node_generation != state.node_generation:
        if cache.engine is not engine:
            cache.engine, cache.versions, cache.cells, cache.measure = engine, None, [], None
        cache.node_generation = state.node_generation
        views = state.views
        cache.nodes = tuple(NodeCell(view.name, view.excluded, view.node.rack if view.node is not None else "")
                            for view in views.values())
        cache.nodes += tuple(NodeCell(node.name, GHOST, node.rack) for node in engine.book.nodes
                             if node.name not in views)
    book = engine.book
    mirror = scheduler.mirrored_pods
    gpus = _gpu_cells(book, state, mirror, cache)
    fragmentation, typical = _fragmentation(book, engine.policy, scheduler.typical_pods, cache)
    present = book.gpu_present
    free_milli = int(np.where(present, book.gpu_milli_free, 0).sum())
    return Snapshot(
        taken_at=now, cycle=scheduler.cycles, leading=leading, rebuilding=rebuilding, nodes=cache.nodes, gpus=gpus,
        vcs=_vcs(engine), pending=_pending(state, mirror, now),
        decisions=scheduler.recorder.decisions, fragmentation=fragmentation,
        unallocated_gpus=free_milli / MILLI_PER_GPU, running_jobs=len(engine.running),
        pods_by_isolation=_by_isolation(state),
        extra={"fragmentation_typical_pods": float(typical), "api_writes": float(scheduler.api_writes)})


def _by_isolation(state: Tracking) -> dict[str, int]:
    """Pods holding a member of a running job, by the isolation mode their records name."""
    counts: Counter[str] = Counter()
    running = state.engine.running
    for name, tracked in state.tracked.items():
        if name in running:
            for uid in tracked.members.values():  # a heterogeneous gang's pods may differ
                counts[tracked.isolation_for(uid)] += 1
    return dict(counts)


def _holders(state: Tracking, mirror: Mapping[str, Mapping[str, Any]], nodes: set[str]
             ) -> dict[tuple[int, int], list[tuple[int, str, str]]]:
    """(node index, GPU) -> (milli, owner VC, pod) of every allocation holding a share of a GPU on ``nodes``
    (one pass over the allocations; pods are looked up only for those on ``nodes``)."""
    engine = state.engine
    book = engine.book
    external = {name: uid for uid, name in state.external.items()}
    held: dict[tuple[int, int], list[tuple[int, str, str]]] = {}
    jobs, tracked_jobs = engine.jobs, state.tracked
    for name, allocation in book.allocations.items():
        if not allocation.gpu_indices or allocation.node not in nodes:
            continue
        uid = external.get(name)
        if uid is not None:
            owner = OTHER
        else:
            job_name, _, member = name.rpartition("/")
            job = jobs.get(job_name)
            owner = job.vc if job is not None else OTHER
            tracked = tracked_jobs.get(job_name)
            uid = tracked.members.get(int(member)) if tracked is not None and decimal_digits(member) \
                else None
        pod = mirror.get(uid) if uid is not None else None
        pod_name = pods.key(pod) if pod is not None else (uid or name)
        row = book.index[allocation.node]
        milli = allocation.gpu_milli if not allocation.request.is_whole else MILLI_PER_GPU
        for gpu in allocation.gpu_indices:
            held.setdefault((row, gpu), []).append((milli, owner, pod_name))
    return held


def _gpu_cells(book: AllocationBook, state: Tracking, mirror: Mapping[str, Mapping[str, Any]],
               cache: CaptureCache) -> tuple[GpuCell, ...]:
    """Every GPU in book order; the cells of nodes unchanged since the cached ones are reused (a node's
    book version moves with every allocation, release and health change on it)."""
    n = book.size
    if cache.versions is None or len(cache.cells) != n:
        stale = np.arange(n)
        cache.cells = [()] * n
    else:
        stale = np.flatnonzero(book.version != cache.versions)
    if stale.size:
        held = _holders(state, mirror, {book.nodes[row].name for row in stale.tolist()})
        present = book.gpu_present[stale]
        allocated = np.where(present, MILLI_PER_GPU - book.gpu_milli_free[stale], 0)
        known = book.memory_enforced[stale]
        total_mib = np.where(known, book.gpu_mem_capacity[stale], 0)
        used_mib = np.where(known, book.gpu_mem_capacity[stale] - book.gpu_mem_free[stale], 0)
        healthy = book.gpu_healthy[stale] & book.node_ok[stale][:, None]
        for k, row in enumerate(stale.tolist()):
            node = book.nodes[row]
            slots = np.flatnonzero(present[k]).tolist()
            milli, mib, cap, ok = (allocated[k].tolist(), used_mib[k].tolist(), total_mib[k].tolist(),
                                   healthy[k].tolist())
            cells = []
            for gpu in slots:
                owners, holders = _owners(held.get((row, gpu)))
                cells.append(GpuCell(node.name, gpu, node.gpu_model, ok[gpu], milli[gpu], mib[gpu], cap[gpu],
                                     owners, holders))
            cache.cells[row] = tuple(cells)
        cache.versions = book.version.copy()
    return tuple(cell for cells in cache.cells for cell in cells)


def _owners(entries: list[tuple[int, str, str]] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Owning VCs, largest share first, and the pods, for one GPU."""
    if not entries:
        return _NONE, _NONE
    share: dict[str, int] = {}
    for milli, owner, _ in entries:
        share[owner] = share.get(owner, 0) + milli
    owners = tuple(sorted(share, key=lambda owner: (-share[owner], owner)))
    return owners, tuple(sorted(pod for _, _, pod in entries))


def typical_pods_of(policy: Policy, configured: Sequence[TypicalPod]) -> tuple[TypicalPod, ...]:
    """The typical pods the placement policy measures fragmentation against (FGD's given distribution,
    the ``kubecell`` policy's learned demand), else the configured ones."""
    if isinstance(policy, FragmentationGradientDescent) and policy.typical:
        return tuple(policy.typical)
    if isinstance(policy, ExpectedWastePolicy) and policy.demand:
        return tuple(TypicalPod(t.shape, t.share) for t in policy.demand)
    return tuple(configured)


def _fragmentation(book: AllocationBook, policy: Policy, configured: Sequence[TypicalPod],
                   cache: CaptureCache) -> tuple[float, int]:
    """(fragmentation ratio 0-1, number of typical pods it was measured against; 0: the fallback)."""
    free = int(book.total_avail.sum())
    if free <= 0:
        return 0.0, 0
    typical = typical_pods_of(policy, configured)
    if not typical:
        avail = book.gpu_avail
        partial = int(avail[(avail > 0) & (avail < MILLI_PER_GPU)].sum())
        return partial / free, 0
    if cache.measure is None or cache.measure[0] != typical:
        cache.measure = (typical, FragmentationMeasure(typical, book.model_names))
    fragment = float(cache.measure[1].node_fragmentation(book.cpu_free, book.gpu_avail, book.model_id).sum())
    return min(1.0, max(0.0, fragment / free)), len(typical)


def _vcs(engine: Engine) -> tuple[VcState, ...]:
    pending = Counter(map(_VC_OF, engine.pending.values()))
    running = Counter(map(_VC_OF, engine.running.values()))
    out = []
    for vc in engine.tenants.vcs:
        usage = engine.usage.get(vc.name)
        g, b, o = ((usage.guaranteed_milli, usage.borrowed_milli, usage.opportunistic_milli) if usage is not None
                   else (0, 0, 0))
        out.append(VcState(vc.name, float(vc.guaranteed_gpus), g / MILLI_PER_GPU, b / MILLI_PER_GPU,
                           o / MILLI_PER_GPU, pending.get(vc.name, 0), running.get(vc.name, 0)))
    return tuple(out)


def _pending(state: Tracking, mirror: Mapping[str, Mapping[str, Any]], now: float) -> tuple[PendingJob, ...]:
    engine = state.engine
    out = []
    for job in sorted(engine.pending.values(), key=lambda j: (j.queued_at or 0.0, j.name)):
        tracked = state.tracked.get(job.name)
        names = tuple(pods.key(mirror[uid]) for uid in (tracked.pod_uids if tracked else ()) if uid in mirror)
        reason = engine.queries.explain(job.name)
        excluded = state.excluded_by_constraints.get(job.name)
        if excluded:
            reason += f" (its node constraints rule out {excluded})"
        waiting = max(0.0, now - job.queued_at) if job.queued_at is not None else 0.0
        out.append(PendingJob(job.name, job.vc, names, job.milli_of_first(job.spec.members) / MILLI_PER_GPU,
                              waiting, reason, reason_kind(reason, members=job.spec.members)))
    return tuple(out)


__all__ = ["OTHER", "CaptureCache", "capture", "typical_pods_of"]
