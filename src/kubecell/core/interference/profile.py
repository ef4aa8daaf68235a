"""What a job uses when it runs alone on a GPU, and what happened when jobs shared one.

The interference model predicts from solo profiles only, because that is what a scheduler can know about a
job before it has ever shared a GPU: one profiling run alone (nvidia-smi means), not a measurement against
every possible partner. Values are checked on construction so that a NaN from a broken profiler or a
percentage written as a fraction fails here, naming the job and the field, instead of silently admitting a
pair that the model scored with garbage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kubecell.core.errors import InvalidInputError


class InvalidProfileError(InvalidInputError):
    """A solo profile or a shared-run measurement with a value that is missing, not finite, or out of range."""


class UnknownJobError(InvalidInputError):
    """A shared run names a job that has no solo profile, so nothing can be predicted for it."""


@dataclass(frozen=True, order=True)
class JobKey:
    """Identifies a job configuration; two runs of the same configuration share one solo profile.

    ``model`` alone is the unit of the leave-models-out evaluation: configurations of one model (other batch
    sizes, AMP on or off) resemble each other far more than they resemble another model.
    """

    model: str
    dataset: str = ""
    batch_size: int = 0
    amp: bool = False

    def __str__(self) -> str:
        text = self.model
        if self.dataset:
            text += f"/{self.dataset}"
        if self.batch_size:
            text += f"/bs{self.batch_size}"
        return text + ("/amp" if self.amp else "")


def _check_number(value: float, field: str, where: str, *, high: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidProfileError(f"must be a number, got {value!r}", location=where, field=field)
    if math.isnan(value) or math.isinf(value):
        raise InvalidProfileError(f"must be a finite number, got {value}", location=where, field=field,
                                  accepted="a finite number")
    if value < 0:
        raise InvalidProfileError(f"must not be negative, got {value}", location=where, field=field)
    if high is not None and value > high:
        raise InvalidProfileError(f"must be at most {high:g}, got {value}", location=where, field=field,
                                  accepted=f"0 to {high:g} (a percentage, not a fraction)" if high == 100 else None)


@dataclass(frozen=True)
class SoloProfile:
    """A job's means over a solo run on one GPU.

    ``gpu_util``: percent of time a kernel was running (nvidia-smi "utilization.gpu"); ``gmem_util``: percent
    of time the memory controller was busy ("utilization.memory"); ``memory_mib``: device memory held.
    """

    key: JobKey
    gpu_util: float
    gmem_util: float
    memory_mib: float

    def __post_init__(self) -> None:
        where = f"job {self.key}"
        _check_number(self.gpu_util, "gpu_util", where, high=100.0)
        _check_number(self.gmem_util, "gmem_util", where, high=100.0)
        _check_number(self.memory_mib, "memory_mib", where)

    @property
    def busy(self) -> float:
        """Fraction of solo time the GPU was computing for this job (0..1)."""
        return self.gpu_util / 100.0

    @property
    def memory_busy(self) -> float:
        """Fraction of solo time the memory controller was busy for this job (0..1)."""
        return self.gmem_util / 100.0


@dataclass(frozen=True)
class SharedRun:
    """Jobs that ran together on one GPU, and each one's throughput there divided by its solo throughput."""

    jobs: tuple[JobKey, ...]
    speeds: tuple[float, ...]
    gpu_util: float | None = None
    """The GPU's utilization while they shared it (percent, nvidia-smi "utilization.gpu"), where measured."""

    def __post_init__(self) -> None:
        names = " + ".join(str(job) for job in self.jobs)
        if self.gpu_util is not None:
            _check_number(self.gpu_util, "gpu_util", f"run {names}", high=100.0)
        if len(self.jobs) < 2:
            raise InvalidProfileError(f"a shared run needs at least two jobs, got {len(self.jobs)}",
                                      location=f"run {names or '(empty)'}", field="jobs")
        if len(self.speeds) != len(self.jobs):
            raise InvalidProfileError(f"{len(self.jobs)} jobs but {len(self.speeds)} speeds",
                                      location=f"run {names}", field="speeds")
        for index, speed in enumerate(self.speeds, start=1):
            _check_number(speed, f"speed{index}", f"run {names}")
            if speed == 0:
                raise InvalidProfileError("must be above 0 (a job that made no progress has no speed ratio)",
                                          location=f"run {names}", field=f"speed{index}")

    def profiles(self, solos: Mapping[JobKey, SoloProfile]) -> tuple[SoloProfile, ...]:
        """The solo profile of every job of the run, in the run's order."""
        missing = [job for job in self.jobs if job not in solos]
        if missing:
            raise UnknownJobError(f"no solo profile for {', '.join(str(job) for job in missing)}",
                                  location="run " + " + ".join(str(job) for job in self.jobs), field="jobs")
        return tuple(solos[job] for job in self.jobs)

    def reading_shortfall(self, solos: Mapping[JobKey, SoloProfile]) -> float | None:
        """The GPU's measured utilization over what it would read if each job's GPU time per step were the same
        as alone and the driver ran one job at a time: the sum of each job's solo utilization times its speed,
        at most 100 %. None without a measured utilization, or where the jobs would have left the GPU idle.

        Why: the profiler reads a time-sliced job's speed as its busy fraction beside a partner over its busy
        fraction alone (``kubecell.profiler.pairs``), which holds only if utilization adds up that way. A
        shortfall below 1 says the readings do not: under it, a reading-based speed is too low by up to that
        factor.
        """
        if self.gpu_util is None:
            return None
        expected = min(100.0, sum(solo.gpu_util * speed for solo, speed in zip(self.profiles(solos), self.speeds,
                                                                             strict=True)))
        return self.gpu_util / expected if expected > 0 else None

    def worst_speed(self) -> float:
        """The speed of the job that suffered most: a shared run is as bad as its worst-off job."""
        return min(self.speeds)
