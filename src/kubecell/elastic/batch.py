"""The worker side of Pollux's adaptive batch: the batch size a job trains at on the placement it was given.

Why: the scheduler sizes an ElasticJob whose spec bounds its batch (``spec.batchSize``) by its goodput *at the
batch that maximises it* on each placement (``core.elastic.goodput``): more GPUs are worth more to a job that
then trains at a larger batch, when its gradients are noisy enough for a larger batch to help. That price is
only honest if the job does train at that batch. AdaptDL, Pollux's job-side library, does it inside its data
loader; this is kubecell's equivalent, for any training loop. It runs the same model as the scheduler
(``OnlineGoodput``, same bounds, same reports), so the job trains at the batch the scheduler priced.

Use, on every rank (each start of torchrun is a new world, so every start asks again)::

    from kubecell.elastic.batch import BatchAdvisor

    advisor = BatchAdvisor.from_environment(default_batch=256, max_local_batch=64,
                                            state=checkpoint.get("batch_advisor"))
    chosen = advisor.batch()          # local micro-batch, accumulation steps, global batch, learning-rate scale
    lr = base_lr * chosen.lr_scale    # AdaScale's gain, for SGD
    for step ...:
        ... train on chosen.local_batch examples per micro-batch, chosen.accumulation_steps per step ...
        advisor.observe(step_seconds=..., sync_seconds=..., local_batch=chosen.local_batch,
                        accumulation_steps=chosen.accumulation_steps, grad_sqr=..., grad_var=...)
    checkpoint["batch_advisor"] = advisor.state_dict()   # what it learned survives the next restart

The measurements are the step report's (``kubecell.elastic.report``): pass the advisor what the reporter is
passed. Every rank must train at the same batch: either all ranks observe the same synchronised values (the
step time of rank 0 broadcast, or the world's mean), or only rank 0 observes and chooses and broadcasts its
choice (what ``examples/elastic/train.py`` does, at each start and every ``--choose-every`` steps).

Bounds: ``KUBECELL_BATCH_SIZE_MIN``/``_MAX``, which the ElasticJob controller sets on the workers from
``spec.batchSize``; the job's initial batch ``M0`` is the minimum. Without them (or with values that are not a
range) the batch is fixed at ``default_batch``, as the scheduler fixes it at what the job reports. The
micro-batch never exceeds ``max_local_batch`` (what fits in one GPU's memory); beyond it the advisor
accumulates. Before any measurement, and whenever the model has no answer, the advice is the initial batch
split over the replicas.

The learning-rate scale is AdaScale's gain (Johnson et al., ICML '20; Pollux uses it): a step at global batch
``M`` makes the progress of ``r = S * E(M)`` steps at ``M0``, with ``S = M / M0`` and ``E`` the statistical
efficiency, so SGD's learning rate is scaled by ``r`` (1 at ``M0``, at most ``S``). For adaptive optimisers
(Adam) a gentler rule is the script's choice.

Untrusted input: the saved state is read back from a checkpoint, and the bounds from the environment; a state
that cannot be read is dropped with one warning (the advisor starts afresh), and nothing here raises into the
training loop once built.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubecell.core.elastic.goodput import OnlineGoodput, synchronising_step_seconds
from kubecell.core.elastic.types import StepReport
from kubecell.core.errors import InvalidInputError
from kubecell.kube.elasticjobs import MAX_BATCH_SIZE
from kubecell.kube.names import ENV_BATCH_SIZE_MAX, ENV_BATCH_SIZE_MIN

log = logging.getLogger(__name__)

STATE_VERSION = 1
MAX_KEPT = 256
"""Measurements kept in ``state_dict`` (the newest): enough for the model's fit, small in a checkpoint."""
MAX_BATCH = MAX_BATCH_SIZE
"""The CRD's bound on ``batchSize``."""


@dataclass(frozen=True, slots=True)
class Batch:
    """The advice for this world: ``global_batch = replicas * local_batch * accumulation_steps``."""

    local_batch: int
    """Examples per forward/backward pass on one replica (never above ``max_local_batch``)."""
    accumulation_steps: int
    """Micro-batches accumulated per optimizer step."""
    global_batch: int
    lr_scale: float
    """AdaScale's gain at this batch: multiply SGD's learning rate (tuned at the initial batch) by it."""
    reason: str
    """Why this batch: the model's choice, or why the initial batch is used."""


class BatchAdvisor:
    """Chooses a job's batch for its current world from its own measurements (see the module)."""

    def __init__(self, *, min_batch: int, max_batch: int, max_local_batch: int, replicas: int = 1, nodes: int = 1,
                 gpu_type: str = "gpu", state: Mapping[str, Any] | None = None) -> None:
        for name, value in (("min_batch", min_batch), ("max_batch", max_batch), ("max_local_batch", max_local_batch),
                            ("replicas", replicas), ("nodes", nodes)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
                raise InvalidInputError(f"{name} {value!r} is not a whole number in 1..{MAX_BATCH}", field=name,
                                        accepted=f"an integer in 1..{MAX_BATCH}")
        if min_batch > max_batch:
            raise InvalidInputError(f"min_batch {min_batch} is above max_batch {max_batch}", field="min_batch",
                                    accepted="min_batch <= max_batch")
        if nodes > replicas:
            raise InvalidInputError(f"nodes {nodes} is above replicas {replicas}", field="nodes",
                                    accepted="1 <= nodes <= replicas")
        if not isinstance(gpu_type, str) or not gpu_type:
            raise InvalidInputError(f"gpu_type {gpu_type!r} is not a name", field="gpu_type",
                                    accepted="a non-empty string (the GPU model, or cpu)")
        self.min_batch, self.max_batch, self.max_local_batch = min_batch, max_batch, max_local_batch
        self.replicas, self.nodes, self.gpu_type = replicas, nodes, gpu_type
        self.model = OnlineGoodput(initial_bsz=min_batch, max_bsz=max_batch,
                                   max_local_bsz={gpu_type: max_local_batch})
        self._kept: list[list[Any]] = []
        if state is not None:
            self._load(state)

    @classmethod
    def from_environment(cls, *, default_batch: int, max_local_batch: int, gpu_type: str = "gpu",
                         state: Mapping[str, Any] | None = None) -> BatchAdvisor:
        """The advisor of this worker: bounds from ``KUBECELL_BATCH_SIZE_MIN``/``_MAX`` (else ``default_batch``,
        fixed), the world from torchrun's ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` (1 when absent). Bounds that
        are not a range are told once and replaced by ``default_batch``; ``default_batch`` and
        ``max_local_batch`` are the script's own, so a bad one raises."""
        environ = os.environ
        low, high = _env_int(environ, ENV_BATCH_SIZE_MIN), _env_int(environ, ENV_BATCH_SIZE_MAX)
        if low is None or high is None or low > high:
            if ENV_BATCH_SIZE_MIN in environ or ENV_BATCH_SIZE_MAX in environ:
                log.warning("%s=%r and %s=%r are not a batch range; training at the fixed batch %d",
                            ENV_BATCH_SIZE_MIN, environ.get(ENV_BATCH_SIZE_MIN), ENV_BATCH_SIZE_MAX,
                            environ.get(ENV_BATCH_SIZE_MAX), default_batch)
            low = high = default_batch
        replicas = _env_int(environ, "WORLD_SIZE") or 1
        local = _env_int(environ, "LOCAL_WORLD_SIZE") or 1
        return cls(min_batch=low, max_batch=high, max_local_batch=max_local_batch, replicas=replicas,
                   nodes=max(1, min(replicas, replicas // local)), gpu_type=gpu_type, state=state)

    # -- advice -----------------------------------------------------------------------------------------

    def batch(self) -> Batch:
        """The batch that maximises goodput in this world, as the scheduler's model of the job prices it."""
        best = self.model.best_batch(self.gpu_type, self.nodes, self.replicas)
        if best is None:
            local, accumulation = self._split()
            reason = ("no measurements yet" if not self._kept
                      else f"no model of {self.replicas} replicas on {self.gpu_type} yet")
            return self._advice(local, accumulation, f"the initial batch ({reason})")
        local, accumulation = best
        return self._advice(local, accumulation, "the batch of the best goodput on this placement")

    def _split(self) -> tuple[int, int]:
        """The initial batch over the replicas, in the fewest micro-batches within ``max_local_batch``: the
        smallest equal share that reaches ``min_batch``, or the largest that stays within ``max_batch`` where
        none does both (one example per replica at least). Where the share must be accumulated and does not
        divide evenly, each micro-batch is rounded down (the global batch stays within ``max_batch``)."""
        lowest, highest = math.ceil(self.min_batch / self.replicas), self.max_batch // self.replicas
        per_replica = lowest if lowest <= highest else max(1, highest)
        accumulation = math.ceil(per_replica / self.max_local_batch)
        return max(1, per_replica // accumulation), accumulation

    def _advice(self, local: int, accumulation: int, reason: str) -> Batch:
        global_batch = self.replicas * local * accumulation
        scale = global_batch / self.min_batch
        gain = scale * self.model.efficiency(global_batch) if scale > 1.0 else 1.0
        return Batch(local, accumulation, global_batch, max(1.0, min(gain, scale)), reason)

    # -- learning ---------------------------------------------------------------------------------------

    def observe(self, *, step_seconds: float, sync_seconds: float, local_batch: int, accumulation_steps: int = 1,
                grad_sqr: float | None = None, grad_var: float | None = None) -> bool:
        """One optimizer step (or a mean over several) measured in this world, as for the step report; False
        (and nothing learned) for values that are not a measurement. Never raises."""
        try:
            if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) \
                    or accumulation_steps < 1:
                return False
            step = synchronising_step_seconds(float(step_seconds), float(sync_seconds), accumulation_steps)
            report = StepReport(self.gpu_type, self.nodes, self.replicas, local_batch, step, float(sync_seconds),
                                grad_sqr, grad_var)
            row = [self.gpu_type, self.nodes, self.replicas, int(local_batch), step, float(sync_seconds),
                   _optional(grad_sqr), _optional(grad_var), accumulation_steps]
        except (TypeError, ValueError, OverflowError):
            return False
        if not self.model.observe(report, accumulation_steps=accumulation_steps):  # refuses what is no measurement
            return False
        self._kept.append(row)  # plain ints and floats: a checkpoint loads them with weights_only
        del self._kept[:-MAX_KEPT]
        return True

    def state_dict(self) -> dict[str, Any]:
        """What to save in the checkpoint (plain JSON-able values): the newest measurements, so that the next
        start, in whatever world, advises from everything learned so far."""
        return {"v": STATE_VERSION, "min": self.min_batch, "max": self.max_batch, "reports": list(self._kept)}

    def _load(self, state: Mapping[str, Any]) -> None:
        """Replay a saved state's measurements; a state that is not one, or of other bounds, is dropped."""
        problem = _state_problem(state, self.min_batch, self.max_batch)
        if problem is not None:
            log.warning("the batch advisor's saved state is not used (%s): it learns afresh", problem)
            return
        for row in state["reports"][-MAX_KEPT:]:
            gpu_type, nodes, replicas, local, step, sync, sqr, var, accumulation = row
            report = StepReport(gpu_type, nodes, replicas, local, step, sync, sqr, var)
            if self.model.observe(report, accumulation_steps=accumulation):
                self._kept.append(list(row))


def _state_problem(state: Mapping[str, Any], low: int, high: int) -> str | None:
    if not isinstance(state, Mapping):
        return f"a {type(state).__name__}, not a mapping"
    if state.get("v") != STATE_VERSION:
        return f"version {state.get('v')!r}, this reader knows {STATE_VERSION}"
    if (state.get("min"), state.get("max")) != (low, high):
        return f"saved for batches {state.get('min')!r}..{state.get('max')!r}, now {low}..{high}"
    rows = state.get("reports")
    if not isinstance(rows, Sequence) or isinstance(rows, str | bytes):
        return "reports is not a list"
    for row in rows[-MAX_KEPT:]:  # only the newest are replayed
        if not (isinstance(row, Sequence) and not isinstance(row, str | bytes) and len(row) == 9
                and isinstance(row[0], str) and all(_number(v) for v in row[1:6])
                and all(v is None or _number(v) for v in row[6:8])
                and isinstance(row[8], int) and not isinstance(row[8], bool) and row[8] >= 1):
            return (f"a report {str(row)[:80]!r} is not [gpu, nodes, replicas, local, step, sync, sqr, var, "
                    "accumulation]")
    return None


def _optional(value: float | None) -> float | None:
    return None if value is None else float(value)


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name)
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 1 <= value <= MAX_BATCH else None
