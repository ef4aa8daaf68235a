"""The dashboard's view of a ``Snapshot``: compact, columnar JSON that a browser parses and draws quickly.

A cluster of 5,000 nodes with 8 GPUs each is 40,000 map cells, pushed to every open page on each update.
One dict per cell would repeat every key 40,000 times; here each per-GPU field is one array (parallel
arrays, GPUs grouped by node in node order), and every repeated string (VC, GPU model, pod, rack) is an
index into a name table. Sparse facts (unhealthy GPUs, GPUs shared by several VCs, excluded nodes) are
listed by position only where they occur. ``dashboard.js`` is the only reader; ``schema`` names the
layout so a page left open across an upgrade can tell it needs a reload.

Layout (``g`` = GPU position in the per-GPU arrays, ``n`` = node position)::

    nodes.name[n], nodes.rack[n] (-> racks), nodes.gpuStart[n] .. nodes.gpuStart[n+1] (its GPUs)
    gpus.index[g], gpus.kind[g] (-> kinds.model/memoryMib/milliTotal), gpus.milli[g], gpus.memoryMib[g],
    gpus.owner[g] (-> vcNames, -1 free), gpus.podStart[g] .. gpus.podStart[g+1] into gpus.pods (-> podNames)
    unhealthy: [g], coOwners: {g: [vc index, ...]} (owners after the first), excluded: {n: reason}
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Final

from kubecell.scheduler.observe.snapshot import GpuCell, NodeCell, Snapshot

SCHEMA: Final = "kubecell.io/dashboard/v1"
MAX_PENDING_ROWS: Final = 500
"""Rows of the queue table sent to the page (the count of all pending jobs is sent too): a queue of tens
of thousands of jobs is read from its head, and would otherwise dominate the payload."""
MAX_DECISION_ROWS: Final = 200


class _Names:
    """An index table: the first occurrence of a name gets the next index."""

    def __init__(self, initial: Iterable[str] = ()) -> None:
        self.index: dict[str, int] = {}
        for name in initial:
            self.of(name)

    def of(self, name: str) -> int:
        found = self.index.get(name)
        if found is None:
            found = self.index[name] = len(self.index)
        return found

    @property
    def names(self) -> list[str]:
        return list(self.index)


def _grouped(snapshot: Snapshot) -> list[tuple[NodeCell, list[GpuCell]]]:
    """Nodes in the snapshot's order, each with its GPUs by index; a GPU of a node the snapshot does not list
    (which capture should not produce) still shows, under a node of its own, rather than vanish."""
    by_node: dict[str, list[GpuCell]] = {}
    for gpu in snapshot.gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    nodes = list(snapshot.nodes)
    listed = {node.name for node in nodes}
    nodes.extend(NodeCell(name, "") for name in by_node if name not in listed)
    return [(node, sorted(by_node.get(node.name, ()), key=lambda g: g.index)) for node in nodes]


def _columns(rows: Sequence[Any], fields: dict[str, Any]) -> dict[str, list[Any]]:
    return {key: [get(row) for row in rows] for key, get in fields.items()}


def build_summary(snapshot: Snapshot) -> dict[str, Any]:
    """What every update carries, small whatever the cluster's size: the figures and the VCs (the page's
    history chart is drawn from these), without the map and the tables."""
    milli = [gpu.milli_allocated for gpu in snapshot.gpus]
    return {
        "schema": SCHEMA,
        "takenAt": snapshot.taken_at,
        "cycle": snapshot.cycle,
        "leading": snapshot.leading,
        "rebuilding": snapshot.rebuilding,
        "summary": {
            "totalGpus": snapshot.total_gpus,
            "allocatedGpus": round(sum(milli) / 1000, 3),
            "allocatedCells": sum(1 for m in milli if m > 0),
            "unallocatedGpus": round(snapshot.unallocated_gpus, 3),
            "fragmentation": round(snapshot.fragmentation, 4),
            "runningJobs": snapshot.running_jobs,
            "pendingJobs": len(snapshot.pending),
            "unhealthyGpus": sum(1 for gpu in snapshot.gpus if not gpu.healthy),
            "excludedNodes": sum(1 for node in snapshot.nodes if node.excluded),
        },
        "vcs": _columns(snapshot.vcs, {
            "name": lambda v: v.name, "guaranteed": lambda v: round(v.guaranteed_gpus, 3),
            "guaranteedInUse": lambda v: round(v.guaranteed_in_use_gpus, 3),
            "borrowed": lambda v: round(v.borrowed_gpus, 3), "opportunistic": lambda v: round(v.opportunistic_gpus, 3),
            "allocated": lambda v: round(v.allocated_gpus, 3), "pending": lambda v: v.pending_jobs,
            "running": lambda v: v.running_jobs}),
    }


def build_payload(snapshot: Snapshot) -> dict[str, Any]:
    """The JSON-ready payload of ``snapshot`` (see the module docstring for the layout)."""
    vcs = _Names(vc.name for vc in snapshot.vcs)
    kinds: dict[tuple[str, int, int], int] = {}
    racks, pods = _Names(), _Names()
    node_names: list[str] = []
    node_racks: list[int] = []
    gpu_start = [0]
    excluded: dict[str, str] = {}
    index: list[int] = []
    kind: list[int] = []
    milli: list[int] = []
    memory: list[int] = []
    owner: list[int] = []
    pod_start = [0]
    pod_refs: list[int] = []
    unhealthy: list[int] = []
    co_owners: dict[str, list[int]] = {}
    for n, (node, gpus) in enumerate(_grouped(snapshot)):
        node_names.append(node.name)
        node_racks.append(racks.of(node.rack))
        if node.excluded:
            excluded[str(n)] = node.excluded
        for gpu in gpus:
            g = len(index)
            index.append(gpu.index)
            key = (gpu.model, gpu.memory_total_mib, gpu.milli_total)
            kind.append(kinds.setdefault(key, len(kinds)))
            milli.append(gpu.milli_allocated)
            memory.append(gpu.memory_allocated_mib)
            owner.append(vcs.of(gpu.owners[0]) if gpu.owners else -1)
            if len(gpu.owners) > 1:
                co_owners[str(g)] = [vcs.of(name) for name in gpu.owners[1:]]
            if not gpu.healthy:
                unhealthy.append(g)
            pod_refs.extend(pods.of(pod) for pod in gpu.pods)
            pod_start.append(len(pod_refs))
        gpu_start.append(len(index))
    return {
        **build_summary(snapshot),
        "vcNames": vcs.names,
        "racks": racks.names,
        "kinds": {"model": [k[0] for k in kinds], "memoryMib": [k[1] for k in kinds],
                  "milliTotal": [k[2] for k in kinds]},
        "podNames": pods.names,
        "nodes": {"name": node_names, "rack": node_racks, "gpuStart": gpu_start},
        "excluded": excluded,
        "gpus": {"index": index, "kind": kind, "milli": milli, "memoryMib": memory, "owner": owner,
                 "podStart": pod_start, "pods": pod_refs},
        "unhealthy": unhealthy,
        "coOwners": co_owners,
        "pending": _columns(snapshot.pending[:MAX_PENDING_ROWS], {
            "job": lambda p: p.job, "vc": lambda p: p.vc, "pods": lambda p: len(p.pods),
            "gpus": lambda p: round(p.gpus, 3), "waitingSeconds": lambda p: round(p.waiting_seconds, 1),
            "reasonKind": lambda p: p.reason_kind, "reason": lambda p: p.reason}),
        "decisions": _columns(snapshot.decisions[-MAX_DECISION_ROWS:][::-1], {
            "at": lambda d: d.at, "job": lambda d: d.job, "vc": lambda d: d.vc, "action": lambda d: d.action,
            "nodes": lambda d: list(d.nodes), "gpus": lambda d: list(d.gpus),
            "score": lambda d: None if d.score is None else round(d.score, 4), "detail": lambda d: d.detail}),
    }


def encode(payload: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON: no spaces, and never a newline (an SSE ``data:`` line must hold it whole)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class Encoded:
    """One snapshot's payload, serialised once and shared by every request and stream that sends it."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.body = encode(build_payload(snapshot))
        self._gzipped: bytes | None = None
        self._lock = threading.Lock()

    @property
    def gzipped(self) -> bytes:
        """The body gzipped (level 6: nearly level 9's size in a fraction of its time), made on first use."""
        with self._lock:
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=6, mtime=0)
            return self._gzipped


class PayloadCache:
    """The encoded payload of the latest snapshot asked for: built at most once per snapshot, and only when a
    page asks (the scheduler may publish several snapshots a second that nobody looks at)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: Encoded | None = None

    def get(self, snapshot: Snapshot) -> Encoded:
        with self._lock:
            if self._latest is None or self._latest.snapshot is not snapshot:
                self._latest = Encoded(snapshot)
            return self._latest
