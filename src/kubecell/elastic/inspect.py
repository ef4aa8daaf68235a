"""What ``kubecell elasticjobs`` shows of each ElasticJob: where it stands, and what the scheduler's goodput model
says it is worth at other sizes, read from the job's status (``status.goodputModel``, ``core.elastic.saved_model``).

Why: the scheduler resizes a job by a model its owner cannot see in the pods. The model the scheduler keeps in
the status answers "why 4 workers and not 8?": the goodput it predicts per GPU model and size (relative to one
GPU of the job's best model), where it has measured, where it stops pricing (a size beyond ``explore_factor`` times the
largest it ran is worth nothing until a report there confirms it), the batch it would train at, and the noise
scale that makes a larger batch worth more. The status is read as the scheduler reads it: a value that fails a
check is shown as dropped, with the reason, never trusted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.per_worker import PerWorker
from kubecell.core.elastic.saved_model import restore_model
from kubecell.core.errors import InvalidInputError
from kubecell.elastic.status import read_status
from kubecell.kube.elasticjobs import read_elastic_job

SIZES = (1, 2, 4, 8, 16, 32, 64)
"""The sizes a model is shown at (up to the job's maximum), besides the job's own."""


@dataclass(frozen=True, slots=True)
class TypeView:
    """What the model says of the job on one GPU model."""

    gpu_type: str
    shapes: int
    """Placement shapes measured there."""
    max_local_batch: int | None
    speedup: dict[int, float | None]
    """Workers -> goodput over one worker's on the job's best GPU model (so models compare: 1.0 is one GPU of
    its best model; None: the model does not price that size yet)."""
    batch: dict[int, tuple[int, int] | None]
    """Workers -> (micro-batch, accumulation steps) it would train at."""


@dataclass(frozen=True, slots=True)
class ModelView:
    state: str
    """``kept`` (the scheduler's model is in the status), ``none`` (nothing kept yet) or ``dropped``."""
    reason: str = ""
    types: tuple[TypeView, ...] = ()
    noise_ratio: float | None = None
    """The gradient noise ratio at the job's smallest batch (None: no gradient statistics yet)."""
    batch_range: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class JobView:
    namespace: str
    name: str
    phase: str
    message: str
    minimum: int | None
    maximum: int | None
    target: int | None
    replicas: int
    ready: int
    gpu_model: str
    restarts: int
    problem: str = ""
    """Why the spec cannot be run (the controller's ``InvalidSpec``), else empty."""
    model: ModelView = field(default_factory=lambda: ModelView("none"))

    def to_data(self) -> dict[str, Any]:
        model = self.model
        return {
            "namespace": self.namespace, "name": self.name, "phase": self.phase, "message": self.message,
            "minReplicas": self.minimum, "maxReplicas": self.maximum, "targetReplicas": self.target,
            "replicas": self.replicas, "readyReplicas": self.ready, "gpuModel": self.gpu_model,
            "restarts": self.restarts, "problem": self.problem,
            "goodputModel": {
                "state": model.state, "reason": model.reason, "noiseRatio": model.noise_ratio,
                "batchSize": None if model.batch_range is None else {"min": model.batch_range[0],
                                                                      "max": model.batch_range[1]},
                "types": [{"gpuType": t.gpu_type, "shapes": t.shapes, "maxLocalBatch": t.max_local_batch,
                           "speedup": {str(n): s for n, s in t.speedup.items()},
                           "batch": {str(n): None if b is None else {"localBatch": b[0], "accumulationSteps": b[1]}
                                     for n, b in t.batch.items()}} for t in model.types],
            },
        }


def job_view(obj: Mapping[str, Any], *, gpus_per_node: int = 8) -> JobView:
    """One ElasticJob as listed by the API (``gpus_per_node``: how many workers a node holds, for the
    placements the model is asked about)."""
    raw_meta, raw_status = obj.get("metadata"), obj.get("status")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    status_obj: Mapping[str, Any] = raw_status if isinstance(raw_status, Mapping) else {}
    status = read_status(obj)
    problem = ""
    minimum = maximum = target = None
    world: tuple[int, int] | None = None
    processes = 1
    try:
        spec = read_elastic_job(obj)
        minimum, maximum, target = spec.min_replicas, spec.max_replicas, spec.replicas
        world = (spec.max_replicas, spec.max_replicas * spec.nproc_per_node)
        processes = spec.nproc_per_node
    except InvalidInputError as error:
        problem = str(error)
    kept = status_obj.get("goodputModel")
    return JobView(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""), phase=str(status.phase),
        message=status.message, minimum=minimum, maximum=maximum, target=target,
        replicas=_count(status_obj.get("replicas")), ready=_count(status_obj.get("readyReplicas")),
        gpu_model=str(status_obj.get("gpuModel") or "")[:63], restarts=status.restarts, problem=problem,
        model=model_view(kept, maximum=maximum, current=status.target or target, gpus_per_node=gpus_per_node,
                         world=world, processes=processes))


def model_view(kept: Any, *, maximum: int | None, current: int | None, gpus_per_node: int = 8,
               world: tuple[int, int] | None = None, processes: int = 1) -> ModelView:
    """What a kept ``status.goodputModel`` says (see the module). ``world``: the most nodes and processes the
    job can form, as the scheduler bounds the kept model by them (a kept shape of a larger world drops it).
    Sizes are workers of ``processes`` processes (GPUs) each, as the scheduler asks the model
    (``core.elastic.per_worker``)."""
    if kept is None:
        return ModelView("none", "the scheduler has kept no model yet (no step report read)")
    if not isinstance(kept, Mapping):
        return ModelView("dropped", f"a {type(kept).__name__}, not a mapping")
    batch = kept.get("batchSize")
    low, high = (batch.get("min"), batch.get("max")) if isinstance(batch, Mapping) else (None, None)
    try:
        model = OnlineGoodput(initial_bsz=low, max_bsz=high)  # type: ignore[arg-type]  # checked by the model
    except (InvalidInputError, TypeError):
        return ModelView("dropped", f"batchSize {batch!r} is not a range")
    most_nodes, most_replicas = world if world is not None else (None, None)
    problem = restore_model(model, kept, most_nodes=most_nodes, most_replicas=most_replicas)
    if problem is not None:
        return ModelView("dropped", problem)
    sizes = sorted({n for n in SIZES if maximum is None or n <= maximum} | ({current} if current else set()))
    per_node = max(int(gpus_per_node) // max(processes, 1), 1)  # workers a node holds
    measured = model.measurements()
    workers = PerWorker(model, max(processes, 1))
    one = max((workers.goodput(gpu_type, 1, 1) for gpu_type in measured), default=0.0)
    types = []
    for gpu_type, rows in sorted(measured.items()):
        speedup: dict[int, float | None] = {}
        batches: dict[int, tuple[int, int] | None] = {}
        for n in sizes:
            nodes = math.ceil(n / per_node)
            value = workers.goodput(gpu_type, nodes, n)
            speedup[n] = round(value / one, 3) if value > 0 and one > 0 else None
            batches[n] = workers.best_batch(gpu_type, nodes, n) if value > 0 else None
        types.append(TypeView(gpu_type, len(rows), model.max_local_bsz.get(gpu_type), speedup, batches))
    phi = model.noise.phi_at(model.initial_bsz) if model.noise.known else None
    return ModelView("kept", types=tuple(types), noise_ratio=None if phi is None else round(phi, 4),
                     batch_range=(model.initial_bsz, model.max_bsz))


def job_views(objects: Sequence[Any], *, gpus_per_node: int = 8) -> list[JobView]:
    """Every object that is an ElasticJob's mapping, sorted by namespace and name."""
    views = [job_view(obj, gpus_per_node=gpus_per_node) for obj in objects if isinstance(obj, Mapping)]
    return sorted(views, key=lambda view: (view.namespace, view.name))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
