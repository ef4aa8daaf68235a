"""What the ElasticJob controller writes besides the job's status: worker Pods, the rendezvous host and its
Service, and the gang headcount on live workers (``kubecell.elastic.controller`` decides, this carries out).

Every write is idempotent against the API server's answer: a create whose name is taken waits for the old
object to go (the expectations say what is owed), a delete names the uid it means (a new Pod under the name is
never deleted), and a refusal that a retry would repeat is told once through ``tell``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from kubecell.elastic import workers as readers
from kubecell.elastic.expectations import Expectations
from kubecell.elastic.metrics import ControllerMetrics
from kubecell.elastic.states import Emit
from kubecell.kube.elasticjob_objects import rendezvous_pod, rendezvous_service, worker_pod
from kubecell.kube.elasticjobs import ElasticJobSpec, rendezvous_name
from kubecell.kube.names import ANNOTATION_GROUP_SIZE
from kubecell.kube.rest import ApiError, Kube


class JobWrites:
    """The controller's writes of Pods and Services (see the module)."""

    def __init__(self, kube: Kube, metrics: ControllerMetrics, tell: Callable[[Mapping[str, Any], Emit], None], *,
                 recheck_seconds: float, expectation_seconds: float) -> None:
        self.kube = kube
        self.metrics = metrics
        self.tell = tell
        """An Event that a retry would repeat, told once per job and message."""
        self.recheck_seconds = recheck_seconds
        self.expectation_seconds = expectation_seconds
        self.services: dict[str, tuple[bool, float]] = {}
        """Job key -> (whether its rendezvous Service exists, when that was learnt)."""

    def service_exists(self, key: str, namespace: str, name: str, now: float) -> bool:
        known = self.services.get(key)
        if known is not None and (not known[0] or now - known[1] < self.recheck_seconds):
            return known[0]
        try:
            self.kube.get(f"/api/v1/namespaces/{namespace}/services/{rendezvous_name(name)}")
            exists = True
        except ApiError as error:
            if not error.not_found:
                raise
            exists = False
        self.services[key] = (exists, now)
        return exists

    def create_worker(self, obj: Mapping[str, Any], spec: ElasticJobSpec, index: int, run: int,
                      expect: Expectations, now: float) -> bool:
        """Create worker ``index``; False where the API refused it (quota, admission), so that the caller
        makes no more of the job's workers this pass."""
        try:
            self.kube.create(f"/api/v1/namespaces/{spec.namespace}/pods", worker_pod(spec, index, run))
        except ApiError as error:
            if error.conflict:  # its name is still taken (a worker leaving): created when that one is gone
                self.metrics.pod_writes.labels("create", "exists").inc()
                expect.owed.add(index)
                return True
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
            except ApiError as error:
                if not error.conflict:
                    self.tell(obj, Emit(True, "FailedCreate", f"rendezvous Service not created: {error}"))
                    raise
            self.services[spec.key] = (True, now)
        if host is not None and readers.ended(host) and not readers.terminating(host):
            self.delete_pod(host, 0)  # a host that ended is replaced (its store is gone anyway)
        elif host is None:
            try:
                self.kube.create(f"/api/v1/namespaces/{spec.namespace}/pods", rendezvous_pod(spec))
                self.metrics.pod_writes.labels("create", "ok").inc()
            except ApiError as error:
                if not error.conflict:
                    self.tell(obj, Emit(True, "FailedCreate", f"rendezvous host not created: {error}"))
                    raise
                self.metrics.pod_writes.labels("create", "exists").inc()

    def remove_rendezvous(self, spec: ElasticJobSpec, host: Mapping[str, Any] | None, now: float) -> None:
        with contextlib.suppress(ApiError):
            self.kube.delete(f"/api/v1/namespaces/{spec.namespace}/services/{rendezvous_name(spec.name)}")
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
