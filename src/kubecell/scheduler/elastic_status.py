"""The ElasticJob object as the scheduler's sizer reads and writes it: the fields it keeps in the job's status
(``status.gpuModel``, ``status.goodputModel``), always on the job its pods name, checked by uid; and its holds,
kept in a ConfigMap of the scheduler's own namespace (``kube.kept_holds``), never in a job's status.

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
from kubecell.kube.kept_holds import HoldStore, KeptHold
from kubecell.kube.rest import ApiError
from kubecell.scheduler.elastic_holds import Hold, Holds
from kubecell.scheduler.elastic_sized import Sized
from kubecell.scheduler.elastic_tell import SizerTelling

log = logging.getLogger("kubecell.scheduler.elastic")


class SizerStatus(SizerTelling):
    """The sizer's reads and status writes of ElasticJobs, and its kept holds (a base of ``ElasticSizer``, which
    sets ``jobs``, ``holds``, ``hold_store`` and ``pending_grace_seconds``)."""

    jobs: dict[ElasticRef, Sized]
    holds: Holds
    hold_store: HoldStore
    pending_grace_seconds: float

    def _keep_hold(self, ref: ElasticRef, hold: Hold | None) -> None:
        """Keep a hold made (or ended: None) where a restarted scheduler reads it (``kube.kept_holds``)."""
        self.hold_store.keep(ref, None if hold is None else KeptHold(ref, hold.kind, hold.model, hold.target,
                                                                     hold.member_gpus, hold.until))

    def _restore_holds(self, now: float) -> bool:
        """Take on the holds a previous scheduler kept (False: the API did not answer; asked again at the next
        pass), each for no longer than the longest hold the sizer makes (a move's: its workers' grace, at most
        a day, and the pods' grace). A refusal (RBAC without ``deploy/base/rbac.yaml``'s rule) is told once:
        the sizer then holds what it gives from now on, as before holds were kept."""
        try:
            kept = self.hold_store.restore(now)
        except ApiError as error:
            log.warning("cannot read the holds a previous scheduler kept%s: %s",
                        " (asked again at the next pass)" if error.unavailable else "", error)
            return not error.unavailable
        longest = elasticjobs.MAX_GRACE_SECONDS + self.pending_grace_seconds
        taken, gone = 0, []
        for hold in kept:
            if self._exists(hold.ref) is False:  # deleted while no scheduler held for it
                gone.append(hold.ref)
                continue
            self.holds.restore(hold.ref, hold.kind, hold.gpu_model, target=hold.replicas,
                               member_gpus=hold.member_gpus, until=min(hold.until, now + longest), now=now)
            taken += 1
        for ref in gone:
            self.hold_store.keep(ref, None)
        if kept:
            log.info("took on %d holds a previous scheduler kept (%d of deleted jobs let go)", taken, len(gone))
        return True

    def _exists(self, ref: ElasticRef) -> bool | None:
        """Whether the ElasticJob is there (its uid checked) and not being deleted (its namespace, say); None
        where the API cannot say."""
        try:
            current = self._own(ref)
        except ApiError as error:
            return False if error.not_found else None
        return current is not None and not (current.get("metadata") or {}).get("deletionTimestamp")

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
