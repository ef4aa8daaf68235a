"""Everything the scheduler writes to the API server, each write idempotent and explicit about failure.

Order matters for restart safety: a gang's allocation records are written on every member before the
first Binding is created, so a scheduler killed in between leaves either records without bindings
(rolled back or forward by the next instance, see ``scheduler.rebuild``) or bindings that all carry
records; a single member's Binding carries its record itself. Nothing is written that the API server
would not accept from a real scheduler.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from kubecell.k8s.clock import rfc3339, rfc3339_micro
from kubecell.k8s.names import ANNOTATION_ALLOCATION
from kubecell.k8s.records import AllocationRecord
from kubecell.k8s.rest import ApiError, Kube
from kubecell.k8s.scheduler import pods

log = logging.getLogger("kubecell.scheduler")


def pod_path(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}"


CRASH_AFTER_WRITES = "KUBECELL_CRASH_AFTER_WRITES"
"""Fault injection for the restart tests: after this many successful writes the process SIGKILLs itself,
so a crash can be placed exactly between any two writes of a decision. Unset (the default): never."""


class Actions:
    """The scheduler's writes, as ``component`` (the ``schedulerName``)."""

    def __init__(self, kube: Kube, component: str) -> None:
        self.kube = kube
        self.component = component
        self._writes = 0
        self.crash_after = int(os.environ.get(CRASH_AFTER_WRITES) or 0)

    @property
    def writes(self) -> int:
        return self._writes

    @writes.setter
    def writes(self, value: int) -> None:
        self._writes = value
        if self.crash_after and value >= self.crash_after:
            log.error("fault injection: SIGKILL after %d writes", value)
            os.kill(os.getpid(), signal.SIGKILL)

    def write_record(self, pod: Mapping[str, Any], record: AllocationRecord) -> None:
        """Put the record on the pod; the uid in the patch makes it fail on a pod recreated under the name."""
        self.kube.patch(pod_path(pod), {"metadata": {"uid": pods.uid(pod),
                                                     "annotations": {ANNOTATION_ALLOCATION: record.to_annotation()}}})
        self.writes += 1

    def clear_record(self, pod: Mapping[str, Any]) -> None:
        """Remove a record whose bind will not happen (a rolled-back gang); a pod already gone is fine."""
        try:
            self.kube.patch(pod_path(pod), {"metadata": {"uid": pods.uid(pod),
                                                         "annotations": {ANNOTATION_ALLOCATION: None}}})
            self.writes += 1
        except ApiError as error:
            if not (error.not_found or error.conflict):
                raise

    def bind(self, pod: Mapping[str, Any], node: str, record: AllocationRecord | None = None) -> None:
        """Bind the pod to the node; with ``record``, the Binding carries it (the API server copies a
        Binding's annotations onto the pod in the same write, so pod and record are bound atomically)."""
        meta = pod["metadata"]
        metadata: dict[str, Any] = {"name": meta["name"], "namespace": meta.get("namespace", "default"),
                                    "uid": meta["uid"]}
        if record is not None:
            metadata["annotations"] = {ANNOTATION_ALLOCATION: record.to_annotation()}
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self.kube.create(f"{pod_path(pod)}/binding", body)
        self.writes += 1

    def evict(self, pod: Mapping[str, Any], reason: str) -> None:
        """Through the Eviction API, so PodDisruptionBudgets are honoured; a pod already gone is fine."""
        meta = pod["metadata"]
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "default")},
                "deleteOptions": {"preconditions": {"uid": meta["uid"]}}}
        try:
            self.kube.create(f"{pod_path(pod)}/eviction", body)
            self.writes += 1
            self.event(pod, "Warning", "Preempted", reason)
        except ApiError as error:
            if not error.not_found:
                raise

    def unschedulable(self, pod: Mapping[str, Any], message: str, *, reason: str = "Unschedulable",
                      event: bool = True) -> None:
        """The PodScheduled=False condition kube-scheduler sets, plus (``event``) a FailedScheduling Warning."""
        condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                     "lastTransitionTime": rfc3339(), "lastProbeTime": None}
        try:
            self.kube.patch(f"{pod_path(pod)}/status", {"status": {"conditions": [condition]}}, kind="strategic")
            self.writes += 1
        except ApiError as error:
            if not error.not_found:
                raise
        if event:
            self.event(pod, "Warning", "FailedScheduling", message)

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        namespace = meta.get("namespace", "default")
        now = rfc3339()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": namespace,
                                   "uid": meta["uid"]},
                "reason": reason, "message": message[:1024], "type": kind, "count": 1,
                "firstTimestamp": now, "lastTimestamp": now, "eventTime": rfc3339_micro(),
                "reportingComponent": self.component, "reportingInstance": self.component,
                "action": "Scheduling", "source": {"component": self.component}}
        try:
            self.kube.create(f"/api/v1/namespaces/{namespace}/events", body)
            self.writes += 1
        except ApiError as error:  # an event is advice: never let it stop a decision
            log.warning("event for %s not recorded: %s", pods.key(pod), error)


def retry(action: str, call: Any, *, attempts: int = 5) -> Any:
    """Run ``call`` again after an unavailable API server (bounded back-off); other errors go to the caller."""
    delay = 0.2
    for attempt in range(attempts):
        try:
            return call()
        except ApiError as error:
            if not error.unavailable or attempt == attempts - 1:
                raise
            log.warning("%s: API server unavailable (%s); retrying in %.1f s", action, error, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")
