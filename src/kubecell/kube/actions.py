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
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubecell.kube import pods
from kubecell.kube.clock import rfc3339, rfc3339_micro
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import AllocationRecord
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.scheduler")


def pod_path(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}"


def eviction(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A ``policy/v1`` Eviction of the pod; the UID precondition keeps a pod recreated under the name safe."""
    meta = pod["metadata"]
    return {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "default")},
            "deleteOptions": {"preconditions": {"uid": meta["uid"]}}}


def event_body(involved: Mapping[str, Any], namespace: str, *, event_type: str, reason: str, message: str,
               component: str, action: str, host: str | None = None) -> dict[str, Any]:
    """A ``core/v1`` Event about ``involved`` (its apiVersion, kind, name, uid and, if namespaced, namespace)
    in ``namespace``, as client-go's recorder writes one (both the old and the ``events.k8s.io`` fields).
    ``host``: the node a per-node component runs on, as the kubelet names its own (``source.host``, and the
    reporting instance), so that ``kubectl describe`` says which node's agent spoke; the agent's admission policy
    lets it write no other."""
    now = rfc3339()
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": dict(involved), "reason": reason, "message": message[:1024], "type": event_type,
            "count": 1, "firstTimestamp": now, "lastTimestamp": now, "eventTime": rfc3339_micro(),
            "reportingComponent": component, "reportingInstance": host or component, "action": action,
            "source": {"component": component, **({"host": host} if host else {})}}


CRASH_AFTER_WRITES = "KUBECELL_CRASH_AFTER_WRITES"
"""Fault injection for the restart tests: after this many successful writes the process SIGKILLs itself,
so a crash can be placed exactly between any two writes of a decision. Unset (the default): never."""


class Actions:
    """The scheduler's writes, as ``component`` (the ``schedulerName``); the node agent's, with its ``host``."""

    def __init__(self, kube: Kube, component: str, *, host: str | None = None) -> None:
        self.kube = kube
        self.component = component
        self.host = host
        self._writes = 0
        self._lock = threading.Lock()
        self.crash_after = int(os.environ.get(CRASH_AFTER_WRITES) or 0)

    @property
    def writes(self) -> int:
        """Writes that carry decisions (records, bindings, evictions, conditions, FailedScheduling)."""
        return self._writes

    def _wrote(self) -> None:
        with self._lock:  # the writes of a cycle go out from many threads
            self._writes += 1
            if self.crash_after and self._writes >= self.crash_after:
                log.error("fault injection: SIGKILL after %d writes", self._writes)
                os.kill(os.getpid(), signal.SIGKILL)

    def write_record(self, pod: Mapping[str, Any], record: AllocationRecord) -> None:
        """Put the record on the pod; the uid in the patch makes it fail on a pod recreated under the name."""
        self.kube.patch(pod_path(pod), {"metadata": {"uid": pods.uid(pod),
                                                     "annotations": {ANNOTATION_ALLOCATION: record.to_annotation()}}})
        self._wrote()

    def clear_record(self, pod: Mapping[str, Any]) -> None:
        """Remove a record whose bind will not happen (a rolled-back gang); a pod already gone is fine."""
        try:
            self.kube.patch(pod_path(pod), {"metadata": {"uid": pods.uid(pod),
                                                         "annotations": {ANNOTATION_ALLOCATION: None}}})
            self._wrote()
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
        self._wrote()

    def bound_to(self, pod: Mapping[str, Any], node: str) -> bool:
        """Whether the pod (this very pod: same UID) is bound to ``node`` now, read from the API server: a 409
        on a Binding is success only then (a lost answer of our own earlier bind), never for a pod bound
        elsewhere or one whose Binding the API server refused (non-empty schedulingGates)."""
        try:
            current = self.kube.get(pod_path(pod))
        except ApiError as error:
            if error.not_found:
                return False
            raise
        meta = current.get("metadata") or {}
        return meta.get("uid") == pods.uid(pod) and pods.node_of(current) == node

    def evict(self, pod: Mapping[str, Any], reason: str) -> None:
        """Through the Eviction API, so PodDisruptionBudgets are honoured; a pod already gone is fine."""
        try:
            self.kube.create(f"{pod_path(pod)}/eviction", eviction(pod))
            self._wrote()
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
            self._wrote()
        except ApiError as error:
            if not error.not_found:
                raise
        if event:
            self.event(pod, "Warning", "FailedScheduling", message)

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str, *, counted: bool = True) -> None:
        meta = pod["metadata"]
        namespace = meta.get("namespace", "default")
        involved = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": namespace, "uid": meta["uid"]}
        body = event_body(involved, namespace, event_type=kind, reason=reason, message=message,
                          component=self.component, action="Scheduling", host=self.host)
        try:
            self.kube.create(f"/api/v1/namespaces/{namespace}/events", body)
            if counted:
                self._wrote()
        except ApiError as error:  # an event is advice: never let it stop a decision
            log.warning("event for %s not recorded: %s", pods.key(pod), error)

    def node_warning(self, node: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event on a Node (events of cluster-scoped objects go to ``default``, as client-go puts
        them): what kubecell did not believe of what the node reports. Advice, never a decision."""
        meta = node["metadata"]
        involved = {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta.get("uid", "")}
        body = event_body(involved, "default", event_type="Warning", reason=reason, message=message,
                          component=self.component, action="Inventory", host=self.host)
        try:
            self.kube.create("/api/v1/namespaces/default/events", body)
        except ApiError as error:
            log.warning("event on node %s not recorded: %s", meta["name"], error)

    def configuration_refused(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event on a configuration object the scheduler refused (the tenant ConfigMap), so
        ``kubectl describe`` on it says what is wrong. Not a decision: not counted in ``writes``."""
        meta = obj["metadata"]
        namespace, kind = meta.get("namespace", "default"), obj.get("kind", "ConfigMap")
        involved = {"apiVersion": obj.get("apiVersion", "v1"), "kind": kind, "name": meta["name"],
                    "namespace": namespace, "uid": meta.get("uid", "")}
        body = event_body(involved, namespace, event_type="Warning", reason=reason, message=message,
                          component=self.component, action="Configure", host=self.host)
        try:
            self.kube.create(f"/api/v1/namespaces/{namespace}/events", body)
        except ApiError as error:
            log.warning("event on %s %s/%s not recorded: %s", kind, namespace, meta["name"], error)


class EventSink:
    """Events that only inform (``Scheduled``) go out behind the decisions, from their own thread, and are
    dropped rather than queued without bound when the API server falls behind (as kube-scheduler's event
    broadcaster drops them): a decision never waits for its announcement."""

    def __init__(self, actions: Actions, *, backlog: int = 1000) -> None:
        self.actions = actions
        self.room = threading.BoundedSemaphore(backlog)
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kubecell-events")
        self.dropped = 0

    def scheduled(self, pod: Mapping[str, Any], node: str) -> None:
        """kube-scheduler's ``Scheduled`` Event, in its words, so ``kubectl describe pod`` reads the same."""
        if not self.room.acquire(blocking=False):
            self.dropped += 1
            return
        message = f"Successfully assigned {pods.key(pod)} to {node}"

        def send() -> None:
            try:
                self.actions.event(pod, "Normal", "Scheduled", message, counted=False)
            finally:
                self.room.release()

        self.pool.submit(send)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


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
