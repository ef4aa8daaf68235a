"""What one application is in the Pollux/Sia simulator: its batch-size limits, its speed on each GPU type,
its statistical efficiency as training progresses, when it is done, and what a restart costs.

The constants are Sia's (``sia-simulator/applications.py`` and ``simulator_config.py``), checked there:

- the initial (and smallest) global batch size is the smallest validated one, the largest is the largest
  validated one; the per-replica batch ranges over what the placements table of the GPU type measured (Sia
  lowers DeepSpeech2's ceiling to 57 on RTX 2080Ti, where larger batches do not fit);
- training takes as many epochs as the shortest validation curve has rows (Sia's ``max_epochs``: bert 2,
  cifar10 100, deepspeech2 80, imagenet 90, ncf 10, yolov3 50) and a job is done at the end of the last one:
  epoch ``e`` ends at the smallest progress any validation curve reached at its ``e``-th row;
- the gradient statistics during epoch ``e`` at global batch ``B`` are linear in ``B`` between the validated
  batch sizes around it (``get_grad_stats``);
- real runs were slower than the tables: progress is divided by a per-model slowdown (``SLOWDOWNS``);
- every change of allocation stops the job for a checkpoint-restore delay per model (``rescale_time``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kubecell.core.errors import InvalidInputError
from kubecell.sim.elastic.cluster import GpuKind
from kubecell.sim.elastic.profiles import ApplicationProfile, SeedRow, ValidationCurve
from kubecell.sim.elastic.throughput import ThroughputModel

SLOWDOWNS: Mapping[str, float] = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2,
                                  "ncf": 1.5}
"""Sia's calibration of simulated speed to its real runs (``simulator_config.SLOWDOWNS``)."""

RESTART_SECONDS: Mapping[str, float] = {"cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 80.0,
                                        "imagenet": 250.0, "ncf": 15.0}
"""Checkpoint-restore delay per change of allocation (Sia's ``Application.rescale_time``; 30 s for others)."""

DEFAULT_RESTART_SECONDS = 30.0

MAX_LOCAL_BSZ_OVERRIDES: Mapping[tuple[str, str], int] = {("deepspeech2", "rtx"): 57}
"""Sia's per-(application, GPU profile) ceilings below the measured one (memory)."""

APPLICATIONS = tuple(SLOWDOWNS)
"""Applications the job model knows (Sia's data-parallel models; its pipeline model gpt_pmp is not modelled)."""


@dataclass(frozen=True, slots=True)
class Batch:
    """How a job runs one iteration: per-replica micro-batch, extra accumulation steps, replicas."""

    atomic_bsz: int
    accum_steps: int
    replicas: int

    @property
    def local_bsz(self) -> int:
        return self.atomic_bsz * (self.accum_steps + 1)

    @property
    def global_bsz(self) -> int:
        return self.replicas * self.local_bsz


class ApplicationModel:
    """One application's ground truth (see the module docstring for where each number comes from)."""

    def __init__(self, profile: ApplicationProfile, kinds: Sequence[GpuKind]) -> None:
        if profile.name not in SLOWDOWNS:
            raise InvalidInputError(f"no calibration for application {profile.name!r}", field="application",
                                    accepted=", ".join(APPLICATIONS))
        self.name = profile.name
        self.kinds = {kind.gpu_type: kind for kind in kinds}
        self.curves: tuple[ValidationCurve, ...] = profile.validation
        self.batch_sizes = [curve.batch_size for curve in self.curves]
        self.init_bsz = self.batch_sizes[0]
        self.max_bsz = self.batch_sizes[-1]
        self.throughput: dict[str, ThroughputModel] = {
            kind.gpu_type: ThroughputModel(profile.tables[kind.profile]) for kind in kinds}
        self.min_local_bsz = {gpu: model.min_local_bsz for gpu, model in self.throughput.items()}
        self.max_local_bsz = {
            gpu: MAX_LOCAL_BSZ_OVERRIDES.get((self.name, self.kinds[gpu].profile), model.max_local_bsz)
            for gpu, model in self.throughput.items()}
        self.epochs = min(curve.epochs for curve in self.curves)
        self.epoch_end = np.min(np.stack([curve.progress[: self.epochs] for curve in self.curves]), axis=0)
        """Progress at the end of each epoch."""
        self.target_progress = float(self.epoch_end[-1])
        self.slowdown = SLOWDOWNS[self.name]
        self.restart_seconds = RESTART_SECONDS.get(self.name, DEFAULT_RESTART_SECONDS)
        self.seeds: tuple[SeedRow, ...] = profile.seeds
        self.max_replicas = min(64, self.max_bsz // min(self.min_local_bsz.values()))
        """Sia's cap on a job's replicas: ``max_batch_size // min_local_bsz``, at most 64."""

    # ------------------------------------------------------------------ statistical efficiency
    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """Squared gradient norm and gradient variance during ``epoch`` at ``batch_size`` (clamped into the
        validated range), linear between the validated batch sizes around it."""
        epoch = min(max(epoch, 0), self.epochs - 1)
        batch = min(max(batch_size, self.init_bsz), self.max_bsz)
        index = bisect.bisect_left(self.batch_sizes, batch)
        upper = self.curves[index]
        if upper.batch_size == batch or index == 0:
            return float(upper.grad_sqr[epoch]), float(upper.grad_var[epoch])
        lower = self.curves[index - 1]
        weight = (batch - lower.batch_size) / (upper.batch_size - lower.batch_size)
        sqr = lower.grad_sqr[epoch] + weight * (upper.grad_sqr[epoch] - lower.grad_sqr[epoch])
        var = lower.grad_var[epoch] + weight * (upper.grad_var[epoch] - lower.grad_var[epoch])
        return float(sqr), float(var)

    def gain(self, batch_size: float, epoch: int) -> float:
        """Pollux's gain at ``batch_size``: progress per iteration in units of iterations at the initial batch
        size, ``(var + sqr) / (var / scale + sqr)`` with ``scale = batch_size / init_bsz``. Statistical
        efficiency is ``gain / scale``."""
        sqr, var = self.grad_stats(batch_size, epoch)
        scale = batch_size / self.init_bsz
        denominator = var / scale + sqr
        return (var + sqr) / denominator if denominator > 0 else 1.0

    def efficiency(self, batch_size: float, epoch: int) -> float:
        return self.gain(batch_size, epoch) * self.init_bsz / batch_size

    # ------------------------------------------------------------------ speed
    def iteration_time(self, gpu_type: str, placement: Sequence[int], batch: Batch) -> tuple[float, float] | None:
        """Seconds per iteration (accumulation steps included) and the step's sync time, from the tables
        (uncalibrated), or None where the tables say nothing."""
        times = self.throughput[gpu_type].times(tuple(placement), batch.atomic_bsz)
        if times is None:
            return None
        step, sync = times
        return step + (step - sync) * batch.accum_steps, sync

    def progress_rate(self, gpu_type: str, placement: Sequence[int], batch: Batch, epoch: int) -> float | None:
        """Progress per second (Sia's ``Job.step``): gain / seconds per iteration / slowdown."""
        times = self.iteration_time(gpu_type, placement, batch)
        if times is None:
            return None
        return self.gain(batch.global_bsz, epoch) / times[0] / self.slowdown

    def goodput(self, gpu_type: str, placement: Sequence[int], batch: Batch, epoch: int) -> float:
        """Pollux's goodput in examples per second (throughput x efficiency = init_bsz x progress rate),
        calibrated; 0.0 where the tables say nothing."""
        rate = self.progress_rate(gpu_type, placement, batch, epoch)
        return 0.0 if rate is None else rate * self.init_bsz

    # ------------------------------------------------------------------ batch sizes
    def fixed_batch(self, gpu_type: str, placement: Sequence[int], batch_size: int) -> Batch | None:
        """A user's global batch split over the placement, with accumulation where the per-replica batch does not
        fit (Sia's ``update_local_bsz`` with batch-size tuning off: Gavel and TunedJobs)."""
        replicas = sum(placement)
        if replicas <= 0:
            return None
        local = math.ceil(batch_size / replicas - 1e-8)
        fits = self.throughput[gpu_type].max_local_bsz_at(placement)
        accum = math.ceil(local / fits - 1e-8) - 1
        if replicas == 1 and batch_size > self.init_bsz:
            accum = max(1, accum)
        return self.settle(gpu_type, placement, math.ceil(local / (accum + 1) - 1e-8), accum)

    def initial_batch(self, gpu_type: str, placement: Sequence[int]) -> Batch | None:
        """What a job runs at before its goodput model can choose (Sia: the initial batch, at least the
        smallest per-replica batch on each replica)."""
        replicas = sum(placement)
        size = max(self.init_bsz, self.min_local_bsz[gpu_type] * replicas)
        return self.fixed_batch(gpu_type, placement, size)

    def settle(self, gpu_type: str, placement: Sequence[int], atomic_bsz: int, accum_steps: int) -> Batch | None:
        """The batch a job really runs at when asked for ``atomic_bsz`` x (``accum_steps`` + 1) per replica:
        Sia's corrections (no larger per-replica batch than any measured placement of that many replicas ran;
        no larger global batch than the largest validated), then two of ours, where Sia's tables would answer
        nothing: no larger per-replica batch than measured at this very placement, and at least the smallest
        measured one. None when no batch fits (too many replicas for the largest global batch)."""
        replicas = sum(placement)
        model = self.throughput[gpu_type]
        accum = max(0, accum_steps)
        atomic = atomic_bsz
        memory = model.max_local_bsz_for_replicas(replicas)
        if memory is not None:
            atomic = min(atomic, memory)
        atomic = min(atomic, model.max_local_bsz_at(placement))
        atomic = min(atomic, self.max_bsz // (replicas * (accum + 1)))
        if atomic < self.min_local_bsz[gpu_type]:
            if replicas * self.min_local_bsz[gpu_type] > self.max_bsz:
                return None
            atomic, accum = self.min_local_bsz[gpu_type], 0
        return Batch(atomic, accum, replicas)
