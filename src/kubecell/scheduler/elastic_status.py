"""The ElasticJob object as the scheduler's sizer reads and writes it: the fields it keeps in the job's status
(``status.gpuModel``, ``status.goodputModel``), always on the job its pods name, checked by uid.

Why apart from ``scheduler.elastic``: what the sizer decides and how it keeps it in the API server change for
different reasons (a status field, a retry policy), and every read here treats the object as input a user may
have replaced (deleted and made again under the same name: another uid, not this job).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubecell.kube import elasticjobs
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.rest import ApiError
from kubecell.scheduler.elastic_sized import Sized
from kubecell.scheduler.elastic_tell import SizerTelling

log = logging.getLogger("kubecell.scheduler.elastic")


class SizerStatus(SizerTelling):
    """The sizer's reads and status writes of ElasticJobs (a base of ``ElasticSizer``, which sets ``jobs``)."""

    jobs: dict[ElasticRef, Sized]

    def _read_pin(self, ref: ElasticRef) -> str | None:
        """The model ``status.gpuModel`` keeps, from the job the pods name (its uid checked), or None."""
        try:
            current = self._own(ref)
        except ApiError as error:
            if not error.not_found:
                log.warning("cannot read the GPU model of ElasticJob %s/%s: %s", ref.namespace, ref.name, error)
            return None
        return elasticjobs.kept_gpu_model(current) if current is not None else None

    def _read_model(self, ref: ElasticRef) -> Any:
        """What ``status.goodputModel`` holds, from the job the pods name (its uid checked), or None; raises
        ``ApiError`` when the API cannot say (a model made without it would overwrite it at its first save)."""
        try:
            current = self._own(ref)
        except ApiError as error:
            if error.not_found:
                return None
            raise
        status = current.get("status") if current is not None else None
        return status.get("goodputModel") if isinstance(status, Mapping) else None

    def _write_pin(self, ref: ElasticRef, model: str) -> bool:
        """Keep the job's model in its ``status.gpuModel``."""
        return self._write_status(ref, {"gpuModel": model}, f"the GPU model {model}")

    def _write_model(self, sized: Sized, value: dict[str, Any]) -> bool:
        """Keep the job's goodput model in its ``status.goodputModel``."""
        return self._write_status(sized.ref, {"goodputModel": value}, "the goodput model")

    def _write_status(self, ref: ElasticRef, fields: dict[str, Any], what: str) -> bool:
        """A merge patch of ``fields`` alone into the status (the controller's fields are untouched), on the
        job the pods name only."""
        try:
            if self._own(ref) is None:
                return False
            self.kube.patch(f"{elasticjobs.job_path(ref.namespace, ref.name)}/status",
                            {"metadata": {"uid": ref.uid}, "status": fields})
        except ApiError as error:
            sized = self.jobs.get(ref)
            message = f"cannot keep {what} of ElasticJob {ref.namespace}/{ref.name}"
            if sized is not None:
                self._refused(sized, message, error)
            else:
                log.warning("%s: %s", message, error)
            return False
        return True

    def _own(self, ref: ElasticRef) -> dict[str, Any] | None:
        """The ElasticJob the pods name, or None where the object of that name is another one (deleted and
        made again: its uid differs); raises ``ApiError``."""
        current = self._get(ref)
        return current if (current.get("metadata") or {}).get("uid") == ref.uid else None

    def _get(self, ref: ElasticRef) -> dict[str, Any]:
        """The ElasticJob as stored now (raises ``ApiError``)."""
        return self.kube.get(elasticjobs.job_path(ref.namespace, ref.name))
