"""Jobs that share a GPU slow each other: the dynamic simulator's optional speed hook.

Without it the simulator treats a share like a whole GPU: a job on half a GPU runs as fast as alone, which
is what blind packing hopes for and what measurements of time-sliced GPUs deny (two busy jobs get about half
the GPU each). With a ``SpeedModel`` the simulator asks, for every running job, how fast it runs beside the
jobs now on its GPUs, and multiplies its rate by that factor.

Why the simulator re-rates after every cycle rather than at each start or stop: the set of sharers of a GPU
changes through finishes, evictions, node failures, starts and resizes, often several in one cycle; reading
the book once after the cycle sees the final set, so a job is never rated against a partner that left in the
same instant. No simulated time passes between an event and the re-rating, so it is work-conserving.

A multi-GPU job runs at its slowest GPU's speed (synchronous training waits for the slowest member), so the
model is given the partners of every GPU of the job and decides. A job alone on all its GPUs runs at 1.0
without asking the model.

The tracker also records what the metrics need and the engine does not know: every segment of constant speed
(job, partners, speed, start, end) and the GPU occupancy integral (a GPU holding any job counts once, however
many share it). Given a ``PairHistory`` it tells it, as a cluster's profiler would, what each segment of a job
sharing its GPUs with one other job showed: the job's key, the partner's, the speed and how long (at the
segment's end: what a scheduler knows of a pair is what already ran).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobSpec
from kubecell.core.interference.history import PairHistory
from kubecell.core.interference.profile import JobKey
from kubecell.core.placement.colocation import usage_of

Partners = tuple[tuple[str, ...], ...]
"""For each GPU of a job (in (node, GPU) order), the names of the other jobs on it, sorted."""


class SpeedModel(Protocol):
    """A job's throughput beside ``partners`` (for each of its GPUs, the other jobs there) over its solo
    throughput: above 0, about 1.5 at most (some pairs measurably help each other), 1.0 alone."""

    def speed(self, job: JobSpec, partners: Sequence[Sequence[JobSpec]]) -> float: ...


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of simulated time in which ``job`` ran beside ``partners`` at ``speed``."""

    job: str
    partners: Partners
    speed: float
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def shared(self) -> bool:
        return any(self.partners)


@dataclass(slots=True)
class _State:
    partners: Partners
    speed: float
    since: float
    pair: tuple[JobKey, JobKey] | None = None
    """The job's key and its one partner's, where it shares its GPUs with one job (for the history)."""


class SharingTracker:
    """Who shares which GPU, each running job's speed, and the log of both over time."""

    def __init__(self, model: SpeedModel, history: PairHistory | None = None) -> None:
        self.model = model
        self.history = history
        self.segments: list[Segment] = []
        self.gpu_seconds_occupied = 0.0
        self._state: dict[str, _State] = {}
        self._occupied = 0
        self._last = 0.0
        self._started = False

    def speed_of(self, name: str) -> float:
        """The speed the job runs at now (1.0 before it was first rated)."""
        state = self._state.get(name)
        return 1.0 if state is None else state.speed

    def update(self, engine: Engine, running: Iterable[str], now: float) -> list[str]:
        """Re-read who shares which GPU after a cycle; returns the running jobs whose partners or speed
        changed (the simulator re-rates them), and closes the segments of jobs that stopped."""
        if self._started:
            self.gpu_seconds_occupied += self._occupied * (now - self._last)
        self._started, self._last = True, now
        book = engine.book
        gpus_of: dict[str, list[tuple[str, int]]] = {}
        holders: dict[tuple[str, int], list[str]] = {}
        for name in running:
            job = engine.jobs[name]
            gpus = sorted({(book.allocations[member].node, gpu) for member in job.running_members
                           for gpu in book.allocations[member].gpu_indices})
            gpus_of[name] = gpus
            for gpu in gpus:
                holders.setdefault(gpu, []).append(name)
        self._occupied = len(holders)
        for name in [name for name in self._state if name not in gpus_of]:
            self._close(name, now)
        changed: list[str] = []
        for name, gpus in gpus_of.items():
            partners = tuple(tuple(sorted(other for other in holders[gpu] if other != name)) for gpu in gpus)
            state = self._state.get(name)
            if state is not None and state.partners == partners:
                continue
            speed = self._speed(engine, name, partners)
            pair = self._pair(engine, name, partners)
            if state is None:
                self._state[name] = _State(partners, speed, now, pair)
                if speed != 1.0:
                    changed.append(name)  # it began at 1.0 in this cycle
                continue
            self._close(name, now)
            self._state[name] = _State(partners, speed, now, pair)
            changed.append(name)
        return changed

    def finish(self, now: float) -> None:
        """Close every open segment and the occupancy integral at the end of the run."""
        if self._started:
            self.gpu_seconds_occupied += self._occupied * (now - self._last)
            self._last = now
        for name in list(self._state):
            self._close(name, now)

    def _speed(self, engine: Engine, name: str, partners: Partners) -> float:
        if not any(partners):
            return 1.0
        specs: Mapping[str, JobSpec] = {other: engine.jobs[other].spec for gpu in partners for other in gpu}
        speed = self.model.speed(engine.jobs[name].spec, [[specs[other] for other in gpu] for gpu in partners])
        if not speed > 0:
            raise ValueError(f"speed model gave {speed!r} for job {name}; a running job needs a speed above 0")
        return speed

    def _pair(self, engine: Engine, name: str, partners: Partners) -> tuple[JobKey, JobKey] | None:
        others = {other for gpu in partners for other in gpu}
        if self.history is None or len(others) != 1 or any(len(gpu) != 1 for gpu in partners):
            return None
        (other,) = others
        return usage_of(engine.jobs[name].spec.member).key, usage_of(engine.jobs[other].spec.member).key

    def _close(self, name: str, now: float) -> None:
        state = self._state.pop(name)
        if now > state.since:
            self.segments.append(Segment(name, state.partners, state.speed, state.since, now))
            if self.history is not None and state.pair is not None:
                self.history.observe(*state.pair, state.speed, now - state.since)
