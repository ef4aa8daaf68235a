"""The allocation book: who holds which CPU, memory, milli-GPU and GPU memory, for every node at once.

Placement policies score thousands of nodes per decision, so the book keeps the whole cluster in numpy
arrays (one row per node, one column per GPU slot) and updates only the row an allocation touches.
Derived per-node figures that every filter needs (free GPUs, largest free share, total free share)
are maintained incrementally, and each node carries a version number so that score caches can
recompute exactly the nodes that changed since they last looked.

The book enforces its invariants on every change and raises before touching state: no oversubscribed
milli-GPU, GPU memory, CPU or host memory, and whole GPUs exclusive. ``check_invariants`` re-derives
everything from the list of allocations for tests and audits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubecell.core.errors import AllocationError, InvalidInputError
from kubecell.core.limits import MAX_GPU_MEMORY_MIB
from kubecell.core.model import MILLI_PER_GPU, Allocation, Node, Request, TopologyLevel

IntArray = npt.NDArray[np.int64]
"""Every amount is an int64; ``kubecell.core.limits`` bounds what nodes and requests may hold so that
neither the stored amounts nor the sums computed from them can overflow."""
BoolArray = npt.NDArray[np.bool_]

UNENFORCED_GPU_MEMORY_MIB = MAX_GPU_MEMORY_MIB
"""Capacity used for GPUs whose memory is unknown: memory requests always fit (no request may ask for
more than ``MAX_GPU_MEMORY_MIB``) and are not enforced."""

AFFINITY_CLASSES = 9
"""Affinity class of a GPU request: 0 = a share of one GPU, k = k whole GPUs (k >= 8 share class 8)."""


def affinity_class(request: Request) -> int:
    """-1 for CPU-only requests; 0 for shares; the number of whole GPUs (capped at 8) otherwise."""
    if not request.wants_gpu:
        return -1
    if request.is_share:
        return 0
    return min(request.gpu_count, AFFINITY_CLASSES - 1)


@dataclass(frozen=True, slots=True)
class BookSnapshot:
    """An opaque copy of the book's state; ``AllocationBook.restore`` puts it back."""

    cpu_free: IntArray
    mem_free: IntArray
    gpu_milli_free: IntArray
    gpu_mem_free: IntArray
    gpu_healthy: BoolArray
    node_ok: BoolArray
    affinity: IntArray
    allocations: dict[str, Allocation]


class AllocationBook:
    """Vectorized cluster state. Node order is fixed at construction; nodes are addressed by index."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        names = [node.name for node in nodes]
        seen: set[str] = set()
        for position, name in enumerate(names):
            if name in seen:
                raise InvalidInputError(
                    f"duplicate node name {name!r} (second occurrence is node #{position})",
                    field="name",
                    accepted="unique node names",
                )
            seen.add(name)
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.index: dict[str, int] = {name: i for i, name in enumerate(names)}
        n = len(self.nodes)
        g = max((node.gpu_count for node in self.nodes), default=0)
        self.max_gpus = g

        models = sorted({node.gpu_model for node in self.nodes} | {""})
        self.model_names: tuple[str, ...] = tuple(models)
        model_index = {name: i for i, name in enumerate(models)}
        self.model_id: IntArray = np.array([model_index[node.gpu_model] for node in self.nodes], np.int64)

        self.cpu_capacity: IntArray = np.array([node.cpu_milli for node in self.nodes], np.int64)
        self.mem_capacity: IntArray = np.array([node.memory_mib for node in self.nodes], np.int64)
        self.gpu_count: IntArray = np.array([node.gpu_count for node in self.nodes], np.int64)
        self.gpu_present: BoolArray = np.zeros((n, g), np.bool_)
        self.gpu_mem_capacity: IntArray = np.zeros((n, g), np.int64)
        self.memory_enforced: BoolArray = np.zeros((n, g), np.bool_)
        self.nvlink_group: IntArray = np.full((n, g), -1, np.int64)
        self.numa_group: IntArray = np.full((n, g), -1, np.int64)
        healthy = np.zeros((n, g), np.bool_)
        for i, node in enumerate(self.nodes):
            for gpu in node.gpus:
                self.gpu_present[i, gpu.index] = True
                healthy[i, gpu.index] = gpu.healthy
                known = gpu.memory_mib > 0
                self.memory_enforced[i, gpu.index] = known
                self.gpu_mem_capacity[i, gpu.index] = gpu.memory_mib if known else UNENFORCED_GPU_MEMORY_MIB
            for level, target in ((TopologyLevel.NVLINK, self.nvlink_group), (TopologyLevel.NUMA, self.numa_group)):
                for group_id, group in enumerate(node.groups_at(level)):
                    for gpu_index in group:
                        target[i, gpu_index] = group_id

        self.cpu_free: IntArray = self.cpu_capacity.copy()
        self.mem_free: IntArray = self.mem_capacity.copy()
        self.gpu_milli_free: IntArray = np.where(self.gpu_present, MILLI_PER_GPU, 0).astype(np.int64)
        self.gpu_mem_free: IntArray = self.gpu_mem_capacity.copy()
        self.gpu_healthy: BoolArray = healthy
        self.node_ok: BoolArray = np.ones(n, np.bool_)
        """Schedulable nodes: a failed or closed node takes no new work of any kind (CPU-only requests
        included); ``node_ok`` is "healthy and open" (``set_node_health``, ``set_node_open``)."""
        self.node_healthy: BoolArray = np.ones(n, np.bool_)
        self.node_open: BoolArray = np.ones(n, np.bool_)
        """Not closed by the operator or the cluster (a cordoned or NotReady Kubernetes node): its running work
        stays and is counted, and nothing new lands there until it opens again."""
        self.affinity: IntArray = np.zeros((n, AFFINITY_CLASSES), np.int64)

        # Derived, maintained per changed row: what filters and scores read.
        self.gpu_avail: IntArray = np.zeros((n, g), np.int64)
        self.gpu_full: BoolArray = np.zeros((n, g), np.bool_)
        self.full_count: IntArray = np.zeros(n, np.int64)
        self.max_avail: IntArray = np.zeros(n, np.int64)
        self.total_avail: IntArray = np.zeros(n, np.int64)
        self.version: IntArray = np.zeros(n, np.int64)
        self.clock = 0
        self.allocations: dict[str, Allocation] = {}
        self._allocated_milli = 0
        self._refresh(np.arange(n))

    # ------------------------------------------------------------------ derived state
    def _refresh(self, rows: npt.ArrayLike) -> None:
        if isinstance(rows, int | np.integer):
            self._refresh_row(int(rows))
            return
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        usable = self.gpu_present[rows] & self.gpu_healthy[rows] & self.node_ok[rows][:, None]
        avail = np.where(usable, self.gpu_milli_free[rows], 0)
        full = usable & (self.gpu_milli_free[rows] == MILLI_PER_GPU) & (
            self.gpu_mem_free[rows] == self.gpu_mem_capacity[rows]
        )
        self.gpu_avail[rows] = avail
        self.gpu_full[rows] = full
        self.full_count[rows] = full.sum(axis=1)
        self.max_avail[rows] = avail.max(axis=1) if self.max_gpus else 0
        self.total_avail[rows] = avail.sum(axis=1)
        self.clock += 1
        self.version[rows] = self.clock

    def _refresh_row(self, row: int) -> None:
        """The same for one node (every allocation and release): one-dimensional work on its GPU slots."""
        free = self.gpu_milli_free[row]
        usable = self.gpu_present[row] & self.gpu_healthy[row]
        if not self.node_ok[row]:
            usable[:] = False
        avail = free * usable
        full = usable & (free == MILLI_PER_GPU) & (self.gpu_mem_free[row] == self.gpu_mem_capacity[row])
        self.gpu_avail[row] = avail
        self.gpu_full[row] = full
        self.full_count[row] = int(full.sum())
        total = int(avail.sum())
        self.total_avail[row] = total
        self.max_avail[row] = int(avail.max()) if total else 0
        self.clock += 1
        self.version[row] = self.clock

    def changed_since(self, clock: int) -> IntArray:
        """Indices of the nodes whose state changed after ``clock`` (a value of ``self.clock``)."""
        return np.flatnonzero(self.version > clock)

    # ------------------------------------------------------------------ queries
    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpu_present.sum()) * MILLI_PER_GPU

    @property
    def allocated_gpu_milli(self) -> int:
        """Milli-GPU held by allocations (kept as they change; ``check_invariants`` re-derives it)."""
        return self._allocated_milli

    def node(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise InvalidInputError(f"unknown node {name!r}", field="node") from None

    def gpu_fits(self, node: int | IntArray, request: Request) -> BoolArray:
        """Per GPU slot of ``node`` (or of each node in an array: shape (nodes, slots)): could this GPU
        take (one GPU's worth of) the request?"""
        if request.is_whole:
            whole: BoolArray = self.gpu_full[node].copy()
            return whole
        fits: BoolArray = (
            (self.gpu_avail[node] >= max(request.gpu_milli, 1))
            & (self.gpu_mem_free[node] >= request.gpu_memory_mib)
            & self.gpu_present[node]
            & self.gpu_healthy[node]
        )
        return fits

    def _capacity_fits(self, node: int, request: Request) -> BoolArray:
        """``gpu_fits`` by capacity alone (health and node state aside), for adopting running work."""
        present = self.gpu_present[node]
        if request.is_whole:
            whole: BoolArray = present & (self.gpu_milli_free[node] == MILLI_PER_GPU) & (
                self.gpu_mem_free[node] == self.gpu_mem_capacity[node])
            return whole
        fits: BoolArray = (present & (self.gpu_milli_free[node] >= max(request.gpu_milli, 1))
                           & (self.gpu_mem_free[node] >= request.gpu_memory_mib))
        return fits

    # ------------------------------------------------------------------ changes
    def allocate(self, request: Request, node: int, gpu_indices: Iterable[int] = (), *, adopt: bool = False
                 ) -> Allocation:
        """Bind ``request`` to ``node`` (and those GPUs). Raises AllocationError and changes nothing
        if the request does not fit exactly as given.

        ``adopt``: the allocation already exists in the world (work found running when a scheduler restarts),
        so a failed or closed node, unhealthy GPUs and GPU models the request no longer allows (its pod's owner
        may edit them while it runs) do not refuse it; capacity still does: nothing is ever counted twice."""
        if request.name in self.allocations:
            raise AllocationError(f"allocation {request.name!r} already exists")
        if not 0 <= node < self.size:
            raise AllocationError(f"node index {node} out of range 0..{self.size - 1}")
        gpus = tuple(int(i) for i in gpu_indices)
        where = f"{request.name!r} on {self.nodes[node].name!r}"
        if len(gpus) != request.gpu_count or len(set(gpus)) != len(gpus):
            raise AllocationError(f"{where}: needs {request.gpu_count} distinct GPUs, got {gpus}")
        if not self.node_ok[node] and not adopt:
            raise AllocationError(f"{where}: the node has failed or is closed and takes no new work")
        if self.cpu_free[node] < request.cpu_milli or self.mem_free[node] < request.memory_mib:
            raise AllocationError(
                f"{where}: CPU/memory oversubscribed (free {self.cpu_free[node]}m / "
                f"{self.mem_free[node]}MiB, asked {request.cpu_milli}m / {request.memory_mib}MiB)"
            )
        model = self.nodes[node].gpu_model
        if request.gpu_models is not None and gpus and not adopt and model not in request.gpu_models:
            raise AllocationError(f"{where}: GPU model {self.nodes[node].gpu_model} not allowed")
        fits = (self._capacity_fits(node, request) if adopt else self.gpu_fits(node, request)) if gpus else None
        for gpu in gpus:
            if not 0 <= gpu < self.max_gpus or not self.gpu_present[node, gpu]:
                raise AllocationError(f"{where}: GPU {gpu} does not exist")
            if fits is not None and not fits[gpu]:
                raise AllocationError(
                    f"{where}: GPU {gpu} cannot take it (free {self.gpu_milli_free[node, gpu]} milli, "
                    f"{self.gpu_mem_free[node, gpu]} MiB, healthy={bool(self.gpu_healthy[node, gpu])})"
                )
        gpu_memory = request.gpu_memory_mib
        self.cpu_free[node] -= request.cpu_milli
        self.mem_free[node] -= request.memory_mib
        if gpus:
            idx = list(gpus)
            self.gpu_milli_free[node, idx] -= request.gpu_milli
            self._allocated_milli += request.gpu_milli * len(gpus)
            if request.is_whole:
                gpu_memory = int(self.gpu_mem_capacity[node, idx].max())
                self.gpu_mem_free[node, idx] = 0
            else:
                self.gpu_mem_free[node, idx] -= gpu_memory
            self.affinity[node, affinity_class(request)] += 1
        allocation = Allocation(request, self.nodes[node].name, gpus, request.gpu_milli, gpu_memory)
        self.allocations[request.name] = allocation
        self._refresh_row(int(node))
        return allocation

    def release(self, name: str) -> Allocation:
        """Free an allocation. Unknown names raise AllocationError."""
        allocation = self.allocations.pop(name, None)
        if allocation is None:
            raise AllocationError(f"no allocation named {name!r}")
        node = self.index[allocation.node]
        request = allocation.request
        self.cpu_free[node] += request.cpu_milli
        self.mem_free[node] += request.memory_mib
        if allocation.gpu_indices:
            idx = list(allocation.gpu_indices)
            self.gpu_milli_free[node, idx] += allocation.gpu_milli
            self._allocated_milli -= allocation.gpu_milli * len(allocation.gpu_indices)
            if request.is_whole:
                self.gpu_mem_free[node, idx] = self.gpu_mem_capacity[node, idx]
            else:
                self.gpu_mem_free[node, idx] += allocation.gpu_memory_mib
            self.affinity[node, affinity_class(request)] -= 1
        self._refresh_row(int(node))
        return allocation

    def set_node_health(self, node: int, healthy: bool) -> None:
        """Mark a node and every GPU of it healthy or not. Running allocations stay; a failed node takes
        no new work at all, whatever the request asks for."""
        self.node_healthy[node] = healthy
        self.node_ok[node] = healthy and self.node_open[node]
        self.gpu_healthy[node, self.gpu_present[node]] = healthy
        self._refresh_row(int(node))

    def set_node_open(self, node: int, open_: bool) -> None:
        """Open or close a node to new work (its GPUs keep their own health). Running allocations stay."""
        self.node_open[node] = open_
        self.node_ok[node] = open_ and self.node_healthy[node]
        self._refresh_row(int(node))

    def set_gpu_health(self, node: int, gpu: int, healthy: bool) -> None:
        """Mark a GPU healthy or not. Running allocations stay; an unhealthy GPU takes no new work."""
        if not self.gpu_present[node, gpu]:
            raise AllocationError(f"node {self.nodes[node].name!r} has no GPU {gpu}")
        self.gpu_healthy[node, gpu] = healthy
        self._refresh_row(int(node))

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> BookSnapshot:
        return BookSnapshot(
            self.cpu_free.copy(),
            self.mem_free.copy(),
            self.gpu_milli_free.copy(),
            self.gpu_mem_free.copy(),
            self.gpu_healthy.copy(),
            self.node_ok.copy(),
            self.affinity.copy(),
            dict(self.allocations),
        )

    def restore(self, snapshot: BookSnapshot) -> None:
        """Return to a snapshot. The clock keeps moving forward so score caches see the change."""
        changed = (
            (self.cpu_free != snapshot.cpu_free)
            | (self.mem_free != snapshot.mem_free)
            | (self.gpu_milli_free != snapshot.gpu_milli_free).any(axis=1)
            | (self.gpu_mem_free != snapshot.gpu_mem_free).any(axis=1)
            | (self.gpu_healthy != snapshot.gpu_healthy).any(axis=1)
            | (self.node_ok != snapshot.node_ok)
            | (self.affinity != snapshot.affinity).any(axis=1)
        )
        self.cpu_free[:] = snapshot.cpu_free
        self.mem_free[:] = snapshot.mem_free
        self.gpu_milli_free[:] = snapshot.gpu_milli_free
        self.gpu_mem_free[:] = snapshot.gpu_mem_free
        self.gpu_healthy[:] = snapshot.gpu_healthy
        self.node_ok[:] = snapshot.node_ok
        self.affinity[:] = snapshot.affinity
        self.allocations = dict(snapshot.allocations)
        self._allocated_milli = self._derived_allocated_milli()
        rows = np.flatnonzero(changed)
        if rows.size:
            self._refresh(rows)

    def _derived_allocated_milli(self) -> int:
        return int((np.where(self.gpu_present, MILLI_PER_GPU - self.gpu_milli_free, 0)).sum())

    # ------------------------------------------------------------------ audit
    def check_invariants(self) -> None:
        """Re-derive the state from the allocations and compare; raise AllocationError on any drift."""
        cpu = self.cpu_capacity.copy()
        mem = self.mem_capacity.copy()
        milli = np.where(self.gpu_present, MILLI_PER_GPU, 0).astype(np.int64)
        gmem = self.gpu_mem_capacity.copy()
        affinity = np.zeros_like(self.affinity)
        holders: dict[tuple[int, int], list[Allocation]] = {}
        for allocation in self.allocations.values():
            node = self.index[allocation.node]
            request = allocation.request
            cpu[node] -= request.cpu_milli
            mem[node] -= request.memory_mib
            for gpu in allocation.gpu_indices:
                milli[node, gpu] -= allocation.gpu_milli
                gmem[node, gpu] -= allocation.gpu_memory_mib if not request.is_whole else gmem[node, gpu]
                holders.setdefault((node, gpu), []).append(allocation)
            if allocation.gpu_indices:
                affinity[node, affinity_class(request)] += 1
        problems = []
        if (cpu < 0).any() or (mem < 0).any():
            problems.append("CPU or host memory oversubscribed")
        if (milli < 0).any() or (gmem < 0).any():
            problems.append("milli-GPU or GPU memory oversubscribed")
        for (node, gpu), owners in holders.items():
            if len(owners) > 1 and any(o.request.is_whole for o in owners):
                problems.append(f"whole GPU {self.nodes[node].name}/{gpu} shared by {len(owners)} allocations")
        if not np.array_equal(cpu, self.cpu_free) or not np.array_equal(mem, self.mem_free):
            problems.append("CPU/memory free amounts drifted from the allocations")
        if not np.array_equal(milli, self.gpu_milli_free) or not np.array_equal(gmem, self.gpu_mem_free):
            problems.append("GPU free amounts drifted from the allocations")
        if not np.array_equal(affinity, self.affinity):
            problems.append("affinity counts drifted from the allocations")
        if self._allocated_milli != self._derived_allocated_milli():
            problems.append("the allocated milli-GPU total drifted from the allocations")
        if problems:
            raise AllocationError("; ".join(problems))
