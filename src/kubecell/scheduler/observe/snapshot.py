"""An immutable picture of the scheduler's state, taken on the scheduler thread and read by any other.

The scheduler thread owns the engine and the mirror; HTTP handlers (metrics, the dashboard, the extender's
read-only answers) must never walk them while they change. After a step the scheduler publishes a new
``Snapshot`` (at most a few per second: building one reads every GPU); readers take the latest one, which is
never modified again. During a rebuild or a relist the previous snapshot stays published with
``rebuilding`` set, so a request then gets a clear, consistent (if slightly old) answer instead of an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuCell:
    """One GPU of the allocation map."""

    node: str
    index: int
    model: str
    healthy: bool
    milli_allocated: int
    memory_allocated_mib: int
    memory_total_mib: int
    owners: tuple[str, ...]
    """VCs holding a share of it, largest share first ("other" for pods another scheduler bound)."""
    pods: tuple[str, ...]
    """namespace/name of the pods holding it."""
    milli_total: int = 1000


@dataclass(frozen=True, slots=True)
class NodeCell:
    name: str
    excluded: str
    """Why kubecell places nothing here (cordoned, not Ready, unhealthy); empty when it does."""
    rack: str = ""


@dataclass(frozen=True, slots=True)
class VcState:
    """One virtual cluster: what it is guaranteed, and what it holds now by class (in GPUs, fractions count)."""

    name: str
    guaranteed_gpus: float
    guaranteed_in_use_gpus: float
    borrowed_gpus: float
    opportunistic_gpus: float
    pending_jobs: int
    running_jobs: int

    @property
    def allocated_gpus(self) -> float:
        return self.guaranteed_in_use_gpus + self.borrowed_gpus + self.opportunistic_gpus


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting, with the sentence the engine gives for it (the same as its pods' PodScheduled message)."""

    job: str
    vc: str
    pods: tuple[str, ...]
    gpus: float
    """GPUs it asks for in all (members x per-member share)."""
    waiting_seconds: float
    reason: str
    reason_kind: str
    """A short, low-cardinality category of ``reason`` (a metrics label): e.g. ``quota``, ``capacity``,
    ``gang``, ``constraints``, ``victims``."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One placement (or eviction) the engine made, newest last in ``Snapshot.decisions``."""

    at: float
    job: str
    vc: str
    action: str
    """``placed``, ``preempted``, ``grown``, ``shrunk`` (where the rest runs on), ``failed`` (a write the API
    server refused)."""
    nodes: tuple[str, ...]
    gpus: tuple[str, ...]
    """``node/index`` of each GPU it holds (empty for CPU-only or evicted work)."""
    score: float | None
    """The placement policy's score of the chosen node (higher is better), where one was computed."""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: float
    cycle: int
    leading: bool
    rebuilding: bool
    nodes: tuple[NodeCell, ...] = ()
    gpus: tuple[GpuCell, ...] = ()
    vcs: tuple[VcState, ...] = ()
    pending: tuple[PendingJob, ...] = ()
    decisions: tuple[Decision, ...] = ()
    fragmentation: float = 0.0
    """Share of the free GPU capacity (0-1) that the workload's typical pods cannot use (FGD's measure)."""
    unallocated_gpus: float = 0.0
    running_jobs: int = 0
    pods_by_isolation: dict[str, int] = field(default_factory=dict)
    """Pods holding GPUs through kubecell, by isolation mode (``accounting`` enforces nothing: say how many)."""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return len(self.gpus)

    @property
    def allocated_gpus(self) -> float:
        return sum(gpu.milli_allocated for gpu in self.gpus) / 1000
