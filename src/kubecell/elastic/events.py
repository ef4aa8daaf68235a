"""The Events the ElasticJob controller sends about a job, and which of them it has told already.

A decision a retry would repeat (a refused create, workers the kubelet cannot start, Pods only finalizers keep)
is told once while its message stays the same, so a job stuck for a day sends one Warning, not one per resync.
An Event is advice: a refused one is logged and never stops a decision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubecell.elastic.metrics import ControllerMetrics
from kubecell.elastic.states import Emit
from kubecell.kube.actions import event_body
from kubecell.kube.elasticjobs import KIND, involved
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.elastic")

TOLD_KEPT = 8
"""Repeated-failure Events remembered per job (a bound: their messages carry what the API server said)."""


def object_key(obj: Mapping[str, Any]) -> str:
    """``<namespace>/<name>`` of an ElasticJob as the API server gave it (the key the controller keeps jobs by;
    not ``workers.job_key``, which reads a Pod's job label)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


class JobEvents:
    """Sends a job's Events and remembers, per job key, the last ``TOLD_KEPT`` repeated-failure messages."""

    def __init__(self, kube: Kube, metrics: ControllerMetrics, component: str) -> None:
        self.kube = kube
        self.metrics = metrics
        self.component = component
        self.told: dict[str, tuple[str, ...]] = {}
        """Job key -> the last ``TOLD_KEPT`` repeated-failure messages sent for it."""

    def tell_once(self, obj: Mapping[str, Any], action: Emit) -> bool:
        """An Event that a retry would repeat: sent when its message is not among the last ``TOLD_KEPT`` sent
        for the job (True: sent now). Several, not one: a pass that meets two refusals (a Service and a host
        whose names are taken) would otherwise tell both again at every resync, each undoing the other's
        memory."""
        key = object_key(obj)
        recent = self.told.get(key, ())
        if action.message in recent:
            return False
        self.told[key] = (*recent, action.message)[-TOLD_KEPT:]
        self.send(obj, action)
        return True

    def send(self, obj: Mapping[str, Any], action: Emit) -> None:
        subject = involved(obj)
        body = event_body(subject, subject["namespace"], event_type="Warning" if action.warning else "Normal",
                          reason=action.reason, message=action.message, component=self.component,
                          action="Reconcile")
        try:
            self.kube.create(f"/api/v1/namespaces/{subject['namespace']}/events", body)
            self.metrics.events.labels("Warning" if action.warning else "Normal", action.reason).inc()
        except ApiError as error:  # an Event is advice: it never stops a decision
            log.warning("event %s on %s %s/%s not recorded: %s", action.reason, KIND, subject["namespace"],
                        subject["name"], error)
