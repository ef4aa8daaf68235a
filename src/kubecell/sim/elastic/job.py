"""One simulated training job: where it runs, at which batch, how far it has got, and what it has cost.

The dynamics are Sia's ``Job.step`` and ``Job.reallocate`` (``sia-simulator/job.py``):

- a change of allocation (a first start, a resize, a move, a resume after suspension) stops the job for its
  application's restart delay; the GPUs are held (and counted) meanwhile; every change but the first start
  counts as a restart;
- then it progresses at ``gain / seconds per iteration / slowdown`` (``ApplicationModel.progress_rate``),
  the gain taken from the gradient statistics of the epoch it is in, so the rate changes at each epoch end;
- it is done when the progress reaches the end of its last epoch, within the round (not at its end);
- as in Sia, the time to finish an epoch is rounded to whole seconds (an artefact kept on purpose: with it,
  a job alone on a fixed placement finishes at exactly the second Sia's ``Job.step`` says; without it,
  CIFAR-10's 100 short epochs on A100s drift by up to 4.5 %).

The batch is set by the simulator (``set_batch``) whenever it is (re)placed and at each round: the caller
decides whether it is the user's fixed batch (TunedJobs) or what the job's goodput model advises.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubecell.core.errors import KubecellError
from kubecell.sim.elastic.applications import ApplicationModel, Batch
from kubecell.sim.elastic.workload import WorkloadJob


class JobModelError(KubecellError):
    """A running job at a placement or batch the profile tables say nothing about."""


class SimJob:
    """A job's true state in the simulator (never shown to a policy; see ``ElasticJobView``)."""

    def __init__(self, spec: WorkloadJob, app: ApplicationModel) -> None:
        self.spec = spec
        self.app = app
        self.name = spec.name
        self.gpu_type: str | None = None
        self.nodes: tuple[str, ...] = ()
        """Node name per replica, as the policy gave it."""
        self.placement: tuple[int, ...] = ()
        """Replicas per node, in cluster node order."""
        self.batch: Batch | None = None
        self.progress = 0.0
        self.epoch = 0
        self.restart_left = 0.0
        self.completion: float | None = None
        self.first_start: float | None = None
        self.last_resize: float | None = None
        self.restarts = 0
        self.gpu_seconds = 0.0
        self.restart_gpu_seconds = 0.0
        self.ran_seconds = 0.0
        """Seconds of useful work in the last ``advance`` (the measurement a round reports)."""

    @property
    def done(self) -> bool:
        return self.completion is not None

    @property
    def running(self) -> bool:
        return bool(self.nodes) and not self.done

    def reallocate(self, now: float, gpu_type: str | None, nodes: Sequence[str], placement: Sequence[int]) -> bool:
        """Take a new allocation (empty: suspended); True when it differs from the one held (the job then
        pays its restart delay before progressing again)."""
        new_nodes = tuple(nodes)
        if sorted(new_nodes) == sorted(self.nodes):
            self.nodes = new_nodes
            return False
        self.nodes = new_nodes
        self.placement = tuple(placement) if new_nodes else ()
        self.gpu_type = gpu_type if new_nodes else None
        self.last_resize = now
        if not new_nodes:
            self.batch = None
            self.restart_left = 0.0
            return True
        if self.first_start is None:
            self.first_start = now
        else:
            self.restarts += 1
        self.restart_left = self.app.restart_seconds
        return True

    def set_batch(self, batch: Batch) -> None:
        if batch.replicas != sum(self.placement):
            raise JobModelError(f"job {self.name}: a batch for {batch.replicas} replicas on {sum(self.placement)}")
        self.batch = batch

    def rate(self) -> float:
        """Progress per second where it runs now, in the current epoch."""
        if self.gpu_type is None or self.batch is None:
            raise JobModelError(f"job {self.name} has no placement or batch")
        rate = self.app.progress_rate(self.gpu_type, self.placement, self.batch, self.epoch)
        if rate is None or rate <= 0:
            raise JobModelError(
                f"job {self.name} ({self.app.name}): the {self.gpu_type} profiles say nothing about placement "
                f"{self.placement} at a per-replica batch of {self.batch.atomic_bsz}")
        return rate

    def advance(self, now: float, seconds: float) -> None:
        """Run from ``now`` for ``seconds``: first what is left of the restart delay, then training, epoch by
        epoch; the GPUs held count for the whole interval (Sia frees them only at the next round)."""
        self.ran_seconds = 0.0
        if self.done or not self.nodes:
            return
        gpus = len(self.nodes)
        self.gpu_seconds += gpus * seconds
        delay = min(self.restart_left, seconds)
        self.restart_left -= delay
        self.restart_gpu_seconds += gpus * delay
        clock = now + delay
        left = seconds - delay
        while left > 0 and not self.done:
            rate = self.rate()
            end = float(self.app.epoch_end[self.epoch])
            if self.progress + rate * left < end:
                self.progress += rate * left
                self.ran_seconds += left
                left = 0.0
                break
            used = min(left, float(round((end - self.progress) / rate)))
            self.progress = end
            self.ran_seconds += used
            clock += used
            left -= used
            self.epoch += 1
            if self.epoch >= self.app.epochs:
                self.completion = clock
