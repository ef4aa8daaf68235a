"""What the ElasticJob controller writes besides the job's status: worker Pods, the rendezvous host and its
Service, and the gang headcount on live workers (``kubecell.elastic.controller`` decides, this carries out).

Every write is idempotent against the API server's answer: a create whose name is taken waits for the old
object to go (the expectations say what is owed), a delete names the uid it means (a new Pod under the name is
never deleted), and a refusal that a retry would repeat is told once through ``tell``.

**Names are not ownership.** The names the controller uses (``<job>-worker-<i>``, ``<job>-rdzv``) can be taken
by objects it did not make: made by hand, or left by an earlier job of the same name deleted with
``--cascade=orphan``. Only an object the job controls (its ``ownerReference`` with ``controller: true`` and the
job's UID) is taken for the job's own: another is never deleted (the controller may delete Services and Pods
its users may not, so deleting by name would delete for them), never taken for the rendezvous, and a create
its name blocks is told once (a ``FailedCreate`` Warning naming it) instead of being retried in silence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from kubecell.elastic import workers as readers
from kubecell.elastic.expectations import Expectations
from kubecell.elastic.metrics import ControllerMetrics
from kubecell.elastic.states import Emit
from kubecell.kube.elasticjob_objects import rendezvous_labels, rendezvous_pod, rendezvous_service, worker_pod
from kubecell.kube.elasticjobs import (
    ROLE_RENDEZVOUS,
    ROLE_WORKER,
    ElasticJobSpec,
    rendezvous_name,
    worker_index,
    worker_name,
)
from kubecell.kube.names import ANNOTATION_GROUP_SIZE
from kubecell.kube.rest import ApiError, Kube


class CreateRefusedError(Exception):
    """The API refused a write the job cannot run without (the rendezvous Service or host: quota, admission).
    Its Event is told (once); the pass stops, and the next resync tries again. Raised as its own type so that
    the controller logs one line for it (when ``told``: the Event was sent now), not the traceback of a bug at
    every resync."""

    def __init__(self, message: str, *, told: bool) -> None:
        super().__init__(message)
        self.told = told


class JobWrites:
    """The controller's writes of Pods and Services (see the module)."""

    def __init__(self, kube: Kube, metrics: ControllerMetrics, tell: Callable[[Mapping[str, Any], Emit], bool], *,
                 recheck_seconds: float, expectation_seconds: float) -> None:
        self.kube = kube
        self.metrics = metrics
        self.tell = tell
        """An Event that a retry would repeat, told once per job and message (True: told now)."""
        self.recheck_seconds = recheck_seconds
        self.expectation_seconds = expectation_seconds
        self.services: dict[str, tuple[bool, float]] = {}
        """Job key -> (whether its rendezvous Service exists, when that was learnt)."""

    def service_exists(self, obj: Mapping[str, Any], spec: ElasticJobSpec, now: float) -> bool:
        """Whether the job's own rendezvous Service exists: a Service of that name the job does not control is
        told once and counts as none (the workers' endpoint would reach whatever it selects)."""
        known = self.services.get(spec.key)
        if known is not None and (not known[0] or now - known[1] < self.recheck_seconds):
            return known[0]
        found = self._read(_service_path(spec))
        ours = found is not None and readers.controlled_by(found, spec.uid)
        if found is not None and not ours:
            self._tell_taken(obj, "rendezvous Service", found)
        elif found is not None and not _routes_to_host(found, spec):  # edited: made again as the job's
            self.tell(obj, Emit(True, "RendezvousServiceEdited",
                                f"rendezvous Service {rendezvous_name(spec.name)} was edited (its type, selector or "
                                f"port {spec.rendezvous_port} is not the job's): deleted, to be made again"))
            self._delete_service(found)
            ours = False
        self.services[spec.key] = (ours, now)
        return ours

    def _delete_service(self, found: Mapping[str, Any]) -> None:
        """Delete the Service read as ``found`` (that one: its uid is the precondition, so a Service made under
        the name meanwhile is never deleted)."""
        meta = found["metadata"]
        try:
            self.kube.delete(f"/api/v1/namespaces/{meta['namespace']}/services/{meta['name']}",
                             {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": meta["uid"]}})
        except ApiError as error:
            if not (error.not_found or error.conflict):
                raise

    def _read(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, None where there is none."""
        try:
            return self.kube.get(path)
        except ApiError as error:
            if error.not_found:
                return None
            raise

    def _tell_taken(self, obj: Mapping[str, Any], what: str, holder: Mapping[str, Any]) -> None:
        meta = holder.get("metadata") or {}
        kind = str(holder.get("kind") or "object")
        self.tell(obj, Emit(True, "FailedCreate",
                            f"{what} not created: the {kind} {meta.get('name')} exists and this job does not control "
                            "it (made by hand, left by an earlier job of the same name, or its labels or owner "
                            "edited); it is left alone: delete it and the job makes its own"))

    def create_worker(self, obj: Mapping[str, Any], spec: ElasticJobSpec, index: int, run: int,
                      expect: Expectations, now: float) -> bool:
        """Create worker ``index``; False where the API refused it (quota, admission), so that the caller
        makes no more of the job's workers this pass."""
        try:
            self.kube.create(f"/api/v1/namespaces/{spec.namespace}/pods", worker_pod(spec, index, run))
        except ApiError as error:
            if error.conflict:  # its name is still taken: by a worker leaving (created when that one is gone) ...
                self.metrics.pod_writes.labels("create", "exists").inc()
                expect.owed.add(index)
                holder = self._read(f"/api/v1/namespaces/{spec.namespace}/pods/{worker_name(spec.name, index)}")
                if holder is None or (_seen_as(holder, spec, ROLE_WORKER)
                                      and worker_index(holder, spec.name) == index):
                    return True
                self._tell_taken(obj, f"worker {index}", holder)  # ... or by a Pod that no retry will move
                return False
            if error.unavailable:
                raise
            self.metrics.pod_writes.labels("create", "refused").inc()
            expect.owed.add(index)  # refused (quota, admission): tried again at every resync, told once
            self.tell(obj, Emit(True, "FailedCreate", f"worker {index} not created: {error}"))
            return False
        self.metrics.pod_writes.labels("create", "ok").inc()
        expect.created[index] = now + self.expectation_seconds
        expect.owed.discard(index)
        return True

    def delete_pod(self, pod: Mapping[str, Any], grace: int) -> bool:
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace,
                "preconditions": {"uid": meta["uid"]}}
        try:
            self.kube.delete(f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}", body)
        except ApiError as error:
            if error.not_found or error.conflict:  # gone already, or a new Pod under the name: not ours to delete
                self.metrics.pod_writes.labels("delete", "gone").inc()
                return False
            raise
        self.metrics.pod_writes.labels("delete", "ok").inc()
        return True

    def ensure_rendezvous(self, obj: Mapping[str, Any], spec: ElasticJobSpec, host: Mapping[str, Any] | None,
                          now: float) -> None:
        if not self.services.get(spec.key, (False, 0.0))[0]:
            try:
                self.kube.create(f"/api/v1/namespaces/{spec.namespace}/services", rendezvous_service(spec))
                self.services[spec.key] = (True, now)
            except ApiError as error:
                if not error.conflict:
                    self._refused(obj, "rendezvous Service", error)
                found = self._read(_service_path(spec))
                if found is not None and not readers.controlled_by(found, spec.uid):
                    self._tell_taken(obj, "rendezvous Service", found)
                else:
                    self.services[spec.key] = (found is not None, now)
        if host is not None and readers.ended(host) and not readers.terminating(host):
            self.delete_pod(host, 0)  # a host that ended is replaced (its store is gone anyway)
        elif host is None:
            try:
                self.kube.create(f"/api/v1/namespaces/{spec.namespace}/pods", rendezvous_pod(spec))
                self.metrics.pod_writes.labels("create", "ok").inc()
            except ApiError as error:
                if not error.conflict:
                    if not error.unavailable:
                        self.metrics.pod_writes.labels("create", "refused").inc()
                    self._refused(obj, "rendezvous host", error)
                self.metrics.pod_writes.labels("create", "exists").inc()
                holder = self._read(f"/api/v1/namespaces/{spec.namespace}/pods/{rendezvous_name(spec.name)}")
                if holder is not None and not _seen_as(holder, spec, ROLE_RENDEZVOUS):
                    self._tell_taken(obj, "rendezvous host", holder)

    def _refused(self, obj: Mapping[str, Any], what: str, error: ApiError) -> None:
        """A create the job needs was refused: an API server that is unavailable is an error like any other
        (tried again, logged as one); a refusal that a retry would repeat is told once and raised as
        ``CreateRefusedError``."""
        if error.unavailable:
            raise error
        message = f"{what} not created: {error}"
        raise CreateRefusedError(message, told=self.tell(obj, Emit(True, "FailedCreate", message))) from error

    def remove_rendezvous(self, spec: ElasticJobSpec, host: Mapping[str, Any] | None, now: float) -> None:
        """Delete the job's rendezvous Service, if it controls the one of that name (and only that one: the uid
        is the delete's precondition), and its host."""
        with contextlib.suppress(ApiError):
            found = self._read(_service_path(spec))
            if found is not None and readers.controlled_by(found, spec.uid):
                self._delete_service(found)
        self.services[spec.key] = (False, now)
        if host is not None and not readers.terminating(host):
            self.delete_pod(host, 0)

    def align_gang(self, spec: ElasticJobSpec, pods_by_index: Mapping[int, dict[str, Any]]) -> None:
        """Every live worker states the target as its gang's headcount (``kubecell.io/group-size``), so the
        gang's members never disagree after a resize."""
        wanted = str(spec.replicas)
        for index, pod in sorted(pods_by_index.items()):
            if index >= spec.replicas or readers.terminating(pod) or readers.ended(pod):
                continue
            if readers.group_size(pod) == wanted:
                continue
            meta = pod["metadata"]
            body = {"metadata": {"uid": meta["uid"], "annotations": {ANNOTATION_GROUP_SIZE: wanted}}}
            try:
                self.kube.patch(f"/api/v1/namespaces/{spec.namespace}/pods/{meta['name']}", body)
            except ApiError as error:
                if not (error.not_found or error.conflict):
                    raise


def _service_path(spec: ElasticJobSpec) -> str:
    return f"/api/v1/namespaces/{spec.namespace}/services/{rendezvous_name(spec.name)}"


def _seen_as(pod: Mapping[str, Any], spec: ElasticJobSpec, role: str) -> bool:
    """Whether the controller's watch shows ``pod`` as the job's own, in ``role``: controlled by the job and
    carrying the labels it selects by. One that is not (its labels edited) blocks its name for good: no pass
    will see it leave."""
    return (readers.controlled_by(pod, spec.uid) and readers.job_key(pod) == spec.key
            and readers.role(pod) == role)


def _routes_to_host(service: Mapping[str, Any], spec: ElasticJobSpec) -> bool:
    """Whether the job's own Service still routes its rendezvous port to its host alone (a ClusterIP selecting
    the host's labels), as :func:`rendezvous_service` made it; anyone who may update Services can point it
    elsewhere."""
    body = service.get("spec") or {}
    listed = body.get("ports")
    ports = listed if isinstance(listed, list) else []
    return (body.get("type", "ClusterIP") == "ClusterIP" and body.get("selector") == rendezvous_labels(spec.name)
            and any(isinstance(port, Mapping) and port.get("port") == spec.rendezvous_port
                    and port.get("targetPort", spec.rendezvous_port) == spec.rendezvous_port for port in ports))
