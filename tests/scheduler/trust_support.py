"""What the trust and Kubernetes-semantics tests share: pods made as a tenant would make them, records forged
as a tenant could forge them, and the scheduler's own view read back to check what it holds where."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kubecell.core.engine.job import JobClass
from kubecell.core.model import MILLI_PER_GPU, Allocation, Request
from kubecell.kube.inventory import node_view
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import record_for
from kubecell.kube.rest import Kube
from kubecell.scheduler.scheduler import Scheduler


def pod_body(namespace: str, name: str, limits: Mapping[str, str], *, annotations: Mapping[str, str] | None = None,
             labels: Mapping[str, str] | None = None, spec: Mapping[str, Any] | None = None,
             scheduler: str = "kubecell") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "main", "image": "busybox", "resources": {"limits": dict(limits)}}],
                     **(spec or {})}}


def create_pod(kube: Kube, namespace: str, name: str, limits: Mapping[str, str], **kwargs: Any) -> dict[str, Any]:
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_body(namespace, name, limits, **kwargs))


def pod(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def node_obj(kube: Kube, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/nodes/{name}")


def forged_record(target: Mapping[str, Any], node: Mapping[str, Any], gpus: tuple[int, ...], *, job: str,
                  vc: str = "default", job_class: JobClass = JobClass.GUARANTEED, milli: int = MILLI_PER_GPU,
                  member: int = 0, batch: int = 1, cpu_milli: int = 0, memory_mib: int = 0) -> str:
    """A complete, well-formed record for ``target`` on ``node``, exactly as a tenant could write it by hand."""
    meta = target["metadata"]
    view = node_view(node)
    request = Request(f"{job}/{member}", cpu_milli=cpu_milli, memory_mib=memory_mib, gpu_count=len(gpus),
                      gpu_milli=milli)
    allocation = Allocation(request, node["metadata"]["name"], gpus, milli, 0)
    record = record_for(allocation, view, pod=f"{meta['namespace']}/{meta['name']}", pod_uid=meta["uid"], attempt=0,
                        job=job, vc=vc, job_class=job_class, member=member, scheduler="kubecell/forged",
                        created_at=datetime.datetime.now(datetime.UTC), batch=batch)
    return record.to_annotation()


def write_record(kube: Kube, namespace: str, name: str, text: str | None) -> None:
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}",
               {"metadata": {"annotations": {ANNOTATION_ALLOCATION: text}}})


def alone(target: Mapping[str, Any]) -> str:
    """The engine's name for a pod alone (``ns/pod@uid8``)."""
    meta = target["metadata"]
    return f"{meta['namespace']}/{meta['name']}@{meta['uid'][:8]}"


def warnings_of(kube: Kube, namespace: str, name: str, reason: str | None = None) -> list[str]:
    events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e["message"] for e in events if e["involvedObject"].get("name") == name and e["type"] == "Warning"
            and (reason is None or e["reason"] == reason)]


def scheduled_condition(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    for condition in pod(kube, namespace, name).get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled":
            return dict(condition)
    return None


def held_on(scheduler: Scheduler, node: str) -> list[tuple[str, tuple[int, ...], int]]:
    """What the scheduler's engine holds on ``node``: (allocation name, GPU indices, milli per GPU)."""
    engine = scheduler.engine
    assert engine is not None
    return sorted((a.name, a.gpu_indices, a.gpu_milli) for a in engine.book.allocations.values() if a.node == node)


def free_whole_gpus(scheduler: Scheduler, node: str) -> int:
    engine = scheduler.engine
    assert engine is not None
    return int(engine.book.full_count[engine.book.index[node]])
