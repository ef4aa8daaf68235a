"""Finished ElasticJobs deleted ``spec.ttlSecondsAfterFinished`` after they ended, as batch/v1 Jobs are by the
TTL-after-finished controller (same field, same meaning: 0 deletes the job as soon as it has ended; absent keeps it).

Why: a finished job is kept until someone deletes it, with its entry in the controller's record (``finished``:
about 110,000 jobs fit), and a cluster that runs thousands of jobs a day fills it. The time counts from the end as
the controller recorded it (``Entry.ended_at``, in its ConfigMaps), never from the job's status, which others may
write: a forged ``lastTransitionTime`` or phase deletes nothing early, and a restarted controller counts from the
same moment. The delete is conditional on the job's uid (another job made under the name is not touched) and
Background: the garbage collector removes the workers and the rendezvous it owns. An API error is logged and
tried again ``retry_seconds`` later; a job the controller may not delete (RBAC from before this field: the rules
grant ``delete`` on ``elasticjobs``) is told once in the log, not at every pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter

from kubecell.elastic.finished import Entry
from kubecell.kube.elasticjobs import job_path, ttl_after_finished
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.elastic")

RETRY_SECONDS = 30.0


class Expiries:
    """When each finished job with a time to live is due (epoch seconds, the controller's clock), and its delete."""

    def __init__(self, kube: Kube, counted: Counter | None = None, *, retry_seconds: float = RETRY_SECONDS) -> None:
        self.kube = kube
        self.counted = counted
        """``kubecell_elastic_expired_jobs_total{outcome}`` (deleted, refused), where the controller exports it."""
        self.retry_seconds = retry_seconds
        self.due: dict[str, tuple[float, str]] = {}
        """Job key -> (when it is deleted, its uid): only jobs that ended and state a time to live."""
        self._refused: dict[str, set[int]] = {}
        """Job key -> the statuses its deletes were refused with (each logged once as a warning)."""

    def track(self, key: str, obj: Mapping[str, Any], entry: Entry | None) -> None:
        """Note (or drop) job ``key``'s due time from its recorded end and its ``spec.ttlSecondsAfterFinished``."""
        ttl = ttl_after_finished(obj)
        if entry is None or entry.phase is None or entry.ended_at is None or ttl is None:
            self.forget(key)
            return
        self.due[key] = (entry.ended_at + ttl, entry.uid)

    def forget(self, key: str) -> None:
        self.due.pop(key, None)
        self._refused.pop(key, None)

    def expire(self, now: float) -> list[str]:
        """Delete every job due by ``now``; the keys deleted (or found gone). A refused delete is due again
        ``retry_seconds`` later."""
        deleted = []
        for key, (due, uid) in sorted(self.due.items(), key=lambda item: item[1][0]):
            if due > now:
                break
            namespace, name = key.split("/", 1)
            try:
                self.kube.delete(job_path(namespace, name), {"preconditions": {"uid": uid},
                                                            "propagationPolicy": "Background"})
            except ApiError as error:
                if error.not_found or error.conflict:  # gone, or another job under the name (uid precondition)
                    self.forget(key)
                    continue
                self.due[key] = (now + self.retry_seconds, uid)
                self._count("refused")
                told = self._refused.setdefault(key, set())
                level = logging.DEBUG if error.status in told else logging.WARNING
                told.add(error.status)
                hint = " (the controller's rules need delete on elasticjobs: deploy/elastic/rbac.yaml)" \
                    if error.status == 403 else ""
                log.log(level, "ElasticJob %s: its ttlSecondsAfterFinished has run out since it finished, but the "
                        "delete was refused: %s%s; tried again in %g s", key, error, hint, self.retry_seconds)
                continue
            log.info("ElasticJob %s deleted: it has finished, and its ttlSecondsAfterFinished ran out %.0f s ago",
                     key, now - due)
            self.forget(key)
            deleted.append(key)
            self._count("deleted")
        return deleted

    def _count(self, outcome: str) -> None:
        if self.counted is not None:
            self.counted.labels(outcome).inc()
