"""One job's turn in a scheduling cycle, and what a cycle decided.

An ``Attempt`` is the per-attempt state kube-scheduler keeps in its CycleState: which class the engine
is trying to start the job in (that decides whom the job may evict and which reservations it must
respect), the lower-priority jobs of its own VC it may evict, when a protected victim becomes
evictable, and why it has not started so far. The rules read it from here, never from the job, so
nothing of one attempt leaks into the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kubecell.core.engine.job import Job, JobClass


class Outcome(Enum):
    """What one attempt came to."""

    STARTED = "started"
    WAITING = "waiting"
    DEFERRED = "deferred"
    """It cannot start inside its guarantee now, but may use idle capacity once every guarantee has had
    its turn in this cycle (so that nothing borrowed is started only to be reclaimed at once)."""
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Shrink:
    """Members a running elastic job gave up (it runs on with the rest): what the driver stops."""

    job: Job
    members: tuple[str, ...]
    """The allocation names (``<job>/<index>``) released, newest first."""
    reason: str


@dataclass(slots=True)
class CycleResult:
    """What one cycle did; the driver binds ``started``, deletes ``evicted``, stops exactly the members of
    ``shrunk`` (the rest of each job runs on) and binds the new members of ``grown``. A job may appear in
    ``shrunk`` and later in ``evicted`` of the same cycle: drivers act on ``shrunk`` first."""

    started: list[Job] = field(default_factory=list)
    evicted: list[Job] = field(default_factory=list)
    downgraded: list[Job] = field(default_factory=list)
    grown: list[Job] = field(default_factory=list)
    rejected: list[Job] = field(default_factory=list)
    shrunk: list[Shrink] = field(default_factory=list)


@dataclass(slots=True)
class Attempt:
    job: Job
    now: float
    result: CycleResult
    job_class: JobClass | None = None
    """The class the job is being started in: guaranteed work reclaims borrowed work, borrowed work only
    scavenges opportunistic work, opportunistic work evicts nobody."""
    extra_victims: tuple[Job, ...] = ()
    """Lower-priority jobs of its own VC, downgraded for it, that it may evict if it needs their GPUs."""
    protected_until: float | None = None
    """The earliest time a victim it could not evict (minimum runtime) becomes evictable."""
    shrunk: list[Job] = field(default_factory=list)
    """Jobs that gave up members for it: like victims, it starts RESERVED until the driver confirms."""
    reason: str = ""

    def protected(self, until: float) -> None:
        if self.protected_until is None or until < self.protected_until:
            self.protected_until = until
