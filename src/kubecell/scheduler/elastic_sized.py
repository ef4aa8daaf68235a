"""What the scheduler keeps per ElasticJob between passes of its sizer (``scheduler.elastic``) and of the
chooser of its GPU model (``scheduler.elastic_types``): its goodput model, what it has read and told, the
targets it wrote and why, and the model its gang runs on. In memory, but for the goodput model and the GPU
model: a restarted scheduler reads those from the job's ``status.goodputModel`` (``scheduler.elastic_model``)
and ``status.gpuModel``, and learns the rest again from the pods (see docs/elastic.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.per_worker import in_workers
from kubecell.core.elastic.types import GoodputEstimate
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.scheduler.elastic_conditions import ReportsSeen, Said


@dataclass
class Sized:
    """What the sizer keeps per ElasticJob (by the reference its pods give)."""

    ref: ElasticRef
    model: OnlineGoodput | None = None
    model_learned: bool = False
    """Whether the model took a report since it was last kept in ``status.goodputModel``."""
    model_kept: tuple[int, tuple[tuple[str, int], ...]] | None = None
    """The model's ``extent`` when it was last kept or taken up (placement shapes measured, micro-batch limits;
    None: nothing kept by this scheduler, nor taken up)."""
    model_kept_at: float = float("-inf")
    model_tried_at: float = float("-inf")
    consumed: dict[str, float] = field(default_factory=dict)
    """Pod uid -> the time of the last report taken from it."""
    read: dict[str, object] = field(default_factory=dict)
    """Pod uid -> the annotation text read last (so an unchanged report is not parsed again every cycle)."""
    told: set[tuple[str, str]] = field(default_factory=set)
    """(pod uid, problem reason) already told in an Event."""
    raised_to: int | None = None
    """The target the sizer last raised (while its pods are being made)."""
    raised_at: float = 0.0
    waiting_since: float | None = None
    """Since when the job has pods that wait to be bound."""
    last_reason: str = ""
    restart_seconds: int | None = None
    """What a resize costs the job, as its ElasticJob states (``spec.restartSeconds``; None: the default)."""
    grace_seconds: int | None = None
    """Its workers' ``terminationGracePeriodSeconds`` (None: not read yet)."""
    nproc: int | None = None
    """Processes per worker (``spec.nprocPerNode``; None: not read yet): with the job's most workers, the
    largest world a step report of it may state."""
    patient_until: float = float("-inf")
    """A raise that counts on members other jobs give up waits for their workers to end until then, not only
    ``pending_grace_seconds``."""
    lowered_to: int | None = None
    """The target the sizer last lowered the job to, to give members to another job (its workers are ending)."""
    lowered_until: float = float("-inf")
    """Until when the job is left alone while those workers end (their grace period, then the pods' grace)."""
    room: int = 0
    room_key: tuple[int, int, float | None] | None = None
    """(the book's clock, the job's size, when it last resized) when ``room`` was computed."""
    room_at: float = float("-inf")
    pin: str | None = None
    """The GPU model its next gang runs on, where its pods accept several (``pin_model``; moves change it)."""
    pin_kept: str | None = None
    """The pin as the ElasticJob's ``status.gpuModel`` holds it (read once, written when ``pin`` changes), so
    that a restarted scheduler forms the job's next gang where the last one chose: a move under way, or a
    waiting gang started on another model, survive the restart."""
    pin_read: bool = False
    """Whether ``status.gpuModel`` was read (once per job and scheduler life, when its first gang forms)."""
    moved_at: float | None = None
    """When the sizer last moved it to another model (the allocator's minimum interval counts from there)."""
    served: float = 0.0
    """Member-seconds its earlier gangs ran (a moved job keeps its attained service)."""
    checked: bool = False
    """Whether the cluster was asked if it could ever hold its maximum (told once, with a Warning, if not)."""
    reach: Said | None = None
    """The answer as the job's ``MaxReplicasReachable`` condition (None: not asked yet)."""
    reports: ReportsSeen = field(default_factory=ReportsSeen)
    """What was refused and taken of its step reports, kept in its ``StepReports`` condition."""
    say_after: float = float("-inf")
    """Until when its conditions are not written again (the API refused the last write)."""
    said: dict[str, tuple[bool, str]] = field(default_factory=dict)
    """Condition type -> (status, reason) as the job's status holds it, as far as this scheduler wrote or read it
    (``elastic_conditions``: each is written only when that changes)."""
    seen_at: float = float("-inf")
    """When a job of its pods was last tracked (forgotten ``forget_seconds`` after)."""

    def estimate(self) -> GoodputEstimate | None:
        """Its goodput model asked in workers (``core.elastic.per_worker``: the model is fitted in the
        processes its step reports state, ``nproc`` per worker; the engine and the allocator count workers);
        None while it has no model."""
        return None if self.model is None else in_workers(self.model, self.nproc)
