"""Each ElasticJob's goodput model kept in its ``status.goodputModel``, so that a restarted scheduler prices the
job's placements as the last one did (``core.elastic.saved_model`` says what is kept and why).

When: the model is saved as soon as it has learned a placement shape the saved value lacks (a resize, a move:
what a restart would otherwise cost again) or a new micro-batch limit, and otherwise at most every
``save_seconds`` while reports keep coming (the noise scale and the smoothed times drift as training goes). A
refused write is tried again after ``retry_seconds``, not at every pass. It is read once, when the sizer makes
the job's model (at the first report this scheduler reads), and taken up whole or not at all: a value that
fails a check is told in one Warning Event on the job, and the model learns afresh from the reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.saved_model import restore_model, saved_model
from kubecell.core.errors import InvalidInputError
from kubecell.kube.elasticjobs import MAX_BATCH_SIZE, ElasticRef
from kubecell.scheduler.elastic_sized import Sized

log = logging.getLogger("kubecell.scheduler.elastic")

MAX_BATCH = MAX_BATCH_SIZE
"""The CRD's bound on ``batchSize``: a kept batch beyond it is not one a job ran at."""

ReadModel = Callable[[ElasticRef], Any]
"""The job's ``status.goodputModel`` as stored (None: none, or no such job)."""
WriteModel = Callable[[Sized, dict[str, Any]], bool]
"""Keep a value there; False when the API refused it (told by the writer)."""
Tell = Callable[[ElasticRef, str], None]
"""A Warning Event on the job: its kept model was not taken up, and why."""


class ModelKeeper:
    """Makes each job's goodput model from what its status keeps, and keeps it there as it learns."""

    def __init__(self, read: ReadModel, write: WriteModel, tell: Tell, *, save_seconds: float = 300.0,
                 retry_seconds: float = 30.0) -> None:
        self.read, self.write, self.tell = read, write, tell
        self.save_seconds = save_seconds
        self.retry_seconds = retry_seconds

    def make(self, sized: Sized, initial_bsz: int, max_bsz: int, *, stated: bool = True,
             world: tuple[int, int] | None = None) -> OnlineGoodput:
        """A new model for the job (raises ``InvalidInputError`` for bounds it cannot have), with what its
        status keeps taken up when that holds up. ``stated``: whether the job states its batch range; one that
        does not is priced at the batch it first reported, so the kept model's batch is that batch (the job may
        have reported another since, e.g. a script that keeps its micro-batch as workers come and go).
        ``world``: the most nodes and replicas the job can form, which no kept shape may exceed (as no step
        report may)."""
        kept = self.read(sized.ref)
        model = None
        if kept is not None and not stated:
            fixed = _fixed_batch(kept)
            if fixed is not None:
                try:
                    model = OnlineGoodput(initial_bsz=fixed, max_bsz=fixed)
                except InvalidInputError:
                    model = None  # restore_model names what is wrong with it below
        if model is None:
            model = OnlineGoodput(initial_bsz=initial_bsz, max_bsz=max_bsz)
        if kept is None:
            return model
        most_nodes, most_replicas = world if world is not None else (None, None)
        problem = restore_model(model, kept, most_nodes=most_nodes, most_replicas=most_replicas)
        ref = sized.ref
        if problem is not None:
            log.warning("ElasticJob %s/%s: the goodput model its status keeps is not used (%s): it learns afresh",
                        ref.namespace, ref.name, problem)
            self.tell(ref, problem)
            return OnlineGoodput(initial_bsz=initial_bsz, max_bsz=max_bsz)  # nothing of it: not its batch either
        sized.model_kept = model.extent
        log.info("ElasticJob %s/%s: goodput model taken up from its status (%d placement shapes)",
                 ref.namespace, ref.name, sized.model_kept[0])
        return model

    def keep(self, sized: Sized, now: float) -> None:
        """Save the job's model if it learned something worth a write (see the module)."""
        model = sized.model
        if model is None or not sized.model_learned or now - sized.model_tried_at < self.retry_seconds:
            return
        extent = model.extent  # cheap: the value itself is built only when it is written
        if extent == sized.model_kept and now - sized.model_kept_at < self.save_seconds:
            return
        sized.model_tried_at = now
        if self.write(sized, saved_model(model)):
            sized.model_kept, sized.model_kept_at, sized.model_learned = extent, now, False


def _fixed_batch(kept: Any) -> int | None:
    """The one global batch a kept model was learned for, when it was learned for one (None otherwise)."""
    batch = kept.get("batchSize") if isinstance(kept, Mapping) else None
    if not isinstance(batch, Mapping):
        return None
    low, high = batch.get("min"), batch.get("max")
    if isinstance(low, bool) or not isinstance(low, int) or low != high or not 1 <= low <= MAX_BATCH:
        return None
    return low
