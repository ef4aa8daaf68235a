"""What the ElasticJob tests on the testbed share: the CRD installed, a controller running in a thread,
jobs created and read back, their pods, Service and Events."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from kubecell.elastic.controller import ControllerOptions, ElasticController
from kubecell.kube import elasticjobs as ej
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.scheduler.deploy_support import ensure_namespace, kubectl

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "elastic"
CRD = DEPLOY / "elasticjob-crd.yaml"
STEP = 60.0
"""Seconds for one step (pods created, bound, Running, a status written) on a 2-core machine."""


def install_crd(testbed: ControlPlaneState) -> None:
    """The ElasticJob CRD applied for real and served (Established), and the controller's own namespace, where
    it records the jobs it saw end (``kubecell.elastic.finished``)."""
    kubectl(testbed, "apply", "-f", str(CRD))
    kubectl(testbed, "wait", "--for=condition=Established", "--timeout=60s",
            "customresourcedefinition/elasticjobs.kubecell.io")
    kube = Kube.from_kubeconfig(testbed.admin_kubeconfig)
    try:
        ensure_namespace(kube)
    finally:
        kube.close()


class RunningController:
    """The ElasticJob controller in a thread against the testbed (one namespace), stopped by ``close``."""

    def __init__(self, kubeconfig: str | Path, namespace: str, *, resync_seconds: float = 1.0,
                 stuck_seconds: float = 300.0) -> None:
        self.kube = Kube.from_kubeconfig(kubeconfig)
        self.controller = ElasticController(self.kube, ControllerOptions(
            namespace=namespace, resync_seconds=resync_seconds, stuck_seconds=stuck_seconds))
        self.thread = threading.Thread(target=self.controller.run, name="elastic-controller", daemon=True)
        self.thread.start()
        if not self.controller.ready.wait(STEP):
            raise AssertionError("the ElasticJob controller did not complete its first pass")

    def close(self) -> None:
        self.controller.shutdown()
        self.thread.join(timeout=10)
        self.kube.close()


def template(scheduler: str = "default-scheduler", *, annotations: dict[str, str] | None = None,
             limits: dict[str, str] | None = None) -> dict[str, Any]:
    """Workers for the testbed's fake kubelet (bound pods become Running and Ready)."""
    return {"metadata": {"labels": {"app": "train"}, "annotations": annotations or {}},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "trainer", "image": "pytorch/pytorch:2.5.1",
                                     "command": ["torchrun", "train.py"],
                                     "resources": {"limits": limits or {}}}]}}


def create_job(kube: Kube, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": ej.API_VERSION, "kind": ej.KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": template(), **spec}}
    return kube.create(ej.collection_path(namespace), body)


def get_job(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(ej.job_path(namespace, name))


def scale(kube: Kube, namespace: str, name: str, replicas: int) -> dict[str, Any]:
    """What ``kubectl scale elasticjob/<name> --replicas=N`` sends: a patch of the /scale subresource."""
    return kube.patch(f"{ej.job_path(namespace, name)}/scale", {"spec": {"replicas": replicas}})


def workers(kube: Kube, namespace: str, name: str) -> dict[int, dict[str, Any]]:
    """The job's worker pods by index (those not being deleted)."""
    found = kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=ej.worker_selector(name))["items"]
    return {int(p["metadata"]["labels"][ej.LABEL_INDEX]): p for p in found
            if not p["metadata"].get("deletionTimestamp")}


def all_pods(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    return list(kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"])


def service(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.get(f"/api/v1/namespaces/{namespace}/services/{ej.rendezvous_name(name)}")
    except ApiError as error:
        if error.not_found:
            return None
        raise


def events(kube: Kube, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events about the job, oldest first."""
    found = kube.get(f"/api/v1/namespaces/{namespace}/events",
                     fieldSelector=f"involvedObject.kind={ej.KIND},involvedObject.name={name}")["items"]
    found.sort(key=lambda e: (e.get("eventTime") or "", e["metadata"].get("creationTimestamp") or ""))
    return [(e["type"], e["reason"], e["message"]) for e in found]


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in (job.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return dict(get_job(kube, namespace, name).get("status") or {})


def phase_is(kube: Kube, namespace: str, name: str, phase: str, ready: int | None = None) -> dict[str, Any] | None:
    """The job's status once its phase (and ready count) is this, else None."""
    found = status(kube, namespace, name)
    if found.get("phase") != phase or (ready is not None and found.get("readyReplicas") != ready):
        return None
    return found


def counted(counter: Any, **labels: str) -> float:
    """A Prometheus counter's value (of the series with these labels), as a scrape of it would show."""
    return float(sum(sample.value for metric in counter.collect() for sample in metric.samples
                     if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items())))
