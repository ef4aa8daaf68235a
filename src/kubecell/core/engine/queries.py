"""What a driver may ask the engine without changing it: where a job runs, why it waits, how far it could grow.

Kept apart from ``Engine`` (whose methods are the events that change state and the cycle) so that a reader of
the engine sees its inputs in one place and a driver sees at a glance which calls are free of side effects.
Every answer reads the engine's session as it is; none is cached.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from kubecell.core.engine.admission import charge
from kubecell.core.engine.explain import resize_text, status
from kubecell.core.engine.growth import headroom, room_on
from kubecell.core.engine.job import Job, JobSpec
from kubecell.core.engine.session import Session
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Allocation
from kubecell.core.tenancy.config import VirtualCluster

__all__ = ["EngineQueries", "job_named"]


def job_named(session: Session, name: str) -> Job:
    """The job ``name``, or InvalidInputError naming it: a driver asking about a job the engine does not
    know is a caller's mistake, reported as such rather than as a KeyError."""
    job = session.jobs.get(name)
    if job is None:
        raise InvalidInputError(f"no job named {name!r}", field="job")
    return job


class EngineQueries:
    """Read-only questions about one engine's state (``Engine.queries``)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def next_wake(self) -> float | None:
        """When a time-based rule (minimum runtime, back-off, starvation threshold) next needs a cycle."""
        return self._session.queue.next_wake

    def explain(self, name: str) -> str:
        """Why a job waits, or how it runs: its class, and every resize of its current run with the reason
        ("shrunk 8 -> 5 members at t=60: reclaimed for guaranteed job j7 (VC a)")."""
        job = self._session.jobs.get(name)
        if job is None:
            return f"no job named {name!r}"
        return f"{job.name}: {job.phase.value}: {job.wait_reason}{resize_text(self._session, job)}"

    def status(self) -> dict[str, dict[str, float]]:
        """Per VC: guaranteed, doomed, and used GPUs by class, and bound cells."""
        return status(self._session)

    def counts(self) -> Counter[str]:
        """Jobs by phase (``pending``, ``running``, ``rejected`` ...), finished ones included."""
        return Counter(job.phase.value for job in self._session.jobs.values())

    def allocations_of(self, name: str) -> list[Allocation]:
        """Where a running job's members are (node and GPUs of each), for the driver to bind."""
        book = self._session.book
        return [book.allocations[member] for member in job_named(self._session, name).running_members]

    def headroom(self, name: str, now: float) -> int:
        """How many more members growth could give the running job ``name`` now if the driver had pods for
        them (``growth.headroom``): what an elastic gang's driver may raise its target by."""
        return headroom(self._session, job_named(self._session, name), now)

    def room_on(self, name: str, model: str, now: float) -> int:
        """How many members job ``name`` could run with on GPU model ``model`` if it started there now, giving
        up what it holds (``growth.room_on``): where an elastic gang's driver may move or start it."""
        return room_on(self._session, job_named(self._session, name), model, now)

    def could_ever_run_all(self, name: str) -> bool:
        """Could the empty cluster hold every member of job ``name`` at once (its headcount, not only its
        minimum)? An elastic gang whose maximum it could not is told so: it never grows that far."""
        spec = job_named(self._session, name).spec
        return self._session.admission.cluster_could_hold(dataclasses.replace(spec, min_members=spec.members))

    def guarantee_could_hold(self, vc: VirtualCluster, spec: JobSpec) -> bool:
        """Could this job ever run inside the VC's guarantee (size and cell shapes permitting)?"""
        job = charge(self._session.book, Job(spec))
        return self._session.admission.never_guaranteed(vc, job) is None
