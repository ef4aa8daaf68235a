"""What a simulated job tells its policy about itself: a goodput estimate per job.

Three kinds, chosen by the policy's registry entry (``policies.PolicySpec.estimate``):

- ``online``: kubecell's ``OnlineGoodput`` (``core/elastic/goodput.py``), seeded with the application's 1-GPU
  seed profiles and fed one ``StepReport`` per round the job runs, as a real job would report. It knows only
  what the job has measured, like Pollux's and Sia's agents.
- ``online-true-noise``: the same, except that the gradient noise is read from the validation curves at the
  job's current epoch (``true_noise.TrueNoise``): a diagnostic that splits the online model's error into its
  throughput half and its noise half.
- ``oracle``: the ground truth itself (this simulator's tables). Gavel is given the true throughput of every
  job on every GPU type (Sia's ``GavelPolicy.predict_throughput`` reads the tables), so the rigid baseline
  is too; at a fixed batch (TunedJobs) it is that batch's goodput, otherwise the best over candidate batches.

All answer ``goodput(gpu_type, num_nodes, num_replicas)`` for an even spread of the replicas over the nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from kubecell.core.elastic.types import GoodputEstimate, StepReport
from kubecell.sim.elastic.applications import ApplicationModel, Batch
from kubecell.sim.elastic.cluster import GpuKind

CANDIDATE_BATCHES = 50
"""Global batch sizes an oracle tries between the smallest and largest allowed (Pollux samples 50)."""


class JobEstimate(GoodputEstimate, Protocol):
    """A job's goodput model as the simulator drives it."""

    def observe(self, report: StepReport) -> bool:
        """Take one measurement; True when the model changed."""
        ...

    def best_batch(self, gpu_type: str, num_nodes: int, num_replicas: int) -> tuple[int, int] | None:
        """Per-replica micro-batch and micro-batches per optimizer step (>= 1, ``OnlineGoodput``'s count; Sia's
        ``accum_steps`` is one less) to run at, or None when unknown or infeasible."""
        ...


def spread(num_nodes: int, num_replicas: int) -> tuple[int, ...]:
    """``num_replicas`` over ``num_nodes`` as evenly as possible, larger counts first (``3, 10`` -> 4, 3, 3)."""
    if num_nodes <= 0 or num_replicas < num_nodes:
        return ()
    base, extra = divmod(num_replicas, num_nodes)
    return tuple(base + 1 if index < extra else base for index in range(num_nodes))


class OracleGoodput:
    """The true goodput of one job at its current epoch (see the module docstring)."""

    def __init__(self, app: ApplicationModel, *, fixed_batch: int | None = None,
                 epoch: Callable[[], int] = lambda: 0) -> None:
        self.app = app
        self.fixed_batch = fixed_batch
        self.epoch = epoch
        self._answers: dict[tuple[str, tuple[int, ...]], tuple[Batch | None, float]] = {}
        """Answers of the current epoch (a policy asks the same shapes many times per round)."""
        self._answers_epoch: int | None = None

    def observe(self, report: StepReport) -> bool:
        return False

    def _batch(self, gpu_type: str, placement: Sequence[int]) -> tuple[Batch | None, float]:
        epoch = self.epoch()
        if epoch != self._answers_epoch:
            self._answers.clear()
            self._answers_epoch = epoch
        key = (gpu_type, tuple(placement))
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = self._search(gpu_type, placement, epoch)
        return answer

    def _search(self, gpu_type: str, placement: Sequence[int], epoch: int) -> tuple[Batch | None, float]:
        app = self.app
        if gpu_type not in app.throughput or not placement:
            return None, 0.0
        if self.fixed_batch is not None:
            batch = app.fixed_batch(gpu_type, placement, self.fixed_batch)
            return batch, app.goodput(gpu_type, placement, batch, epoch) if batch else 0.0
        replicas = sum(placement)
        low = max(app.init_bsz, app.min_local_bsz[gpu_type] * replicas)
        if low > app.max_bsz:
            return None, 0.0
        best: tuple[Batch | None, float] = (None, 0.0)
        fits = min(app.throughput[gpu_type].max_local_bsz_at(placement), app.max_local_bsz[gpu_type])
        for size in np.geomspace(low, app.max_bsz, CANDIDATE_BATCHES):
            local = size / replicas
            accum = math.ceil(local / fits - 1e-8) - 1
            if replicas == 1 and local > app.init_bsz + 1e-8:
                accum = max(accum, 1)
            batch = app.settle(gpu_type, placement, math.ceil(local / (accum + 1) - 1e-8), accum)
            if batch is None:
                continue
            value = app.goodput(gpu_type, placement, batch, epoch)
            if value > best[1]:
                best = (batch, value)
        return best

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        return self._batch(gpu_type, spread(num_nodes, num_replicas))[1]

    def best_batch(self, gpu_type: str, num_nodes: int, num_replicas: int) -> tuple[int, int] | None:
        batch = self._batch(gpu_type, spread(num_nodes, num_replicas))[0]
        return None if batch is None else (batch.atomic_bsz, batch.accum_steps + 1)


def seed_reports(app: ApplicationModel, kinds: Sequence[GpuKind]) -> list[StepReport]:
    """The application's 1-GPU seed profiles as step reports of the cluster's GPU types (rows of GPU types the
    cluster does not have are left out)."""
    by_seed = {kind.seed: kind.gpu_type for kind in kinds}
    return [StepReport(gpu_type=by_seed[row.gpu_type], num_nodes=1, num_replicas=1, local_bsz=row.local_bsz,
                       step_time=row.step_time, sync_time=row.sync_time)
            for row in app.seeds if row.gpu_type in by_seed]


def online_estimate(app: ApplicationModel, kinds: Sequence[GpuKind], *,
                    true_noise_epoch: Callable[[], int] | None = None) -> JobEstimate:
    """kubecell's ``OnlineGoodput`` for one job, seeded with the 1-GPU profiles, told the application's batch
    limits (imported here, so runs of other policies do not depend on it). With ``true_noise_epoch``, its
    gradient noise is the application's true one at that epoch (``online-true-noise``)."""
    from kubecell.core.elastic.goodput import OnlineGoodput

    max_local: Mapping[str, int] = {kind.gpu_type: app.max_local_bsz[kind.gpu_type] for kind in kinds}
    model = OnlineGoodput(initial_bsz=app.init_bsz, max_bsz=app.max_bsz, max_local_bsz=max_local,
                          prior=seed_reports(app, kinds))
    if true_noise_epoch is not None:
        from kubecell.sim.elastic.true_noise import TrueNoise

        model.noise = TrueNoise(app, true_noise_epoch)
    return model
