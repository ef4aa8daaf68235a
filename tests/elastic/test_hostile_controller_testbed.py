"""The ElasticJob controller against a tenant, on the real testbed (the CRD's schema and the API server's answers
matter here): a job named after someone else's Service, and a status filled by another writer. The same attacks
without an API server are in ``test_hostile_controller.py``."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from kubecell.kube import elasticjobs as ej
from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.elastic.support import (
    DEPLOY,
    STEP,
    RunningController,
    all_pods,
    create_job,
    events,
    phase_is,
    scale,
    template,
    workers,
)
from tests.scheduler.deploy_support import ensure_namespace, kubectl, service_account_kubeconfig
from tests.support import wait_for


def fail(kube: Kube, namespace: str, name: str) -> None:
    """What a kubelet writes when torchrun exits non-zero in a ``restartPolicy: Never`` pod."""
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
               {"status": {"phase": "Failed", "reason": "Error", "conditions": [{"type": "Ready", "status": "False"}]}},
               kind="strategic")


def test_a_job_named_after_another_service_never_deletes_it(kube: Kube, namespace: str,
                                                            controller: RunningController) -> None:
    """``web-rdzv`` is someone else's Service; a tenant who may create ElasticJobs (not delete Services) names a
    job ``web`` and lets it fail. The controller used to delete ``web-rdzv`` by name when the job ended."""
    theirs = kube.create(f"/api/v1/namespaces/{namespace}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-rdzv", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    create_job(kube, namespace, "web", minReplicas=1, maxReplicas=1, replicas=1, maxRestarts=0)
    told = wait_for("the Warning naming the Service", lambda: [m for _, r, m in events(kube, namespace, "web")
                                                               if r == "FailedCreate" and "web-rdzv" in m], STEP)
    assert "does not control" in told[0]
    wait_for("worker 0 running", lambda: workers(kube, namespace, "web").get(0, {}).get("status", {}).get("phase")
             == "Running", STEP)
    wait_for("its own host made", lambda: [p for p in all_pods(kube, namespace) if p["metadata"]["name"] == "web-rdzv"],
             STEP)
    fail(kube, namespace, "web-worker-0")
    wait_for("the job Failed", partial(phase_is, kube, namespace, "web", "Failed"), STEP)
    wait_for("its own host removed", lambda: not [p for p in all_pods(kube, namespace)
                                                  if p["metadata"]["name"] == "web-rdzv"], STEP)
    kept = kube.get(f"/api/v1/namespaces/{namespace}/services/web-rdzv")
    assert kept["metadata"]["uid"] == theirs["metadata"]["uid"]


def test_a_status_full_of_another_writers_conditions_does_not_stop_the_job(kube: Kube, namespace: str,
                                                                           controller: RunningController) -> None:
    """16 conditions of another writer (the CRD's maxItems) in the status: the controller wrote them back with
    its own two, which the API server refused (422) at every pass, so a /scale was never followed."""
    create_job(kube, namespace, "full", minReplicas=1, maxReplicas=2, replicas=1)
    wait_for("the job Running", partial(phase_is, kube, namespace, "full", "Running", 1), STEP)
    theirs = [{"type": f"example.com/Checked{i}", "status": "True", "reason": "Checked", "message": "",
               "lastTransitionTime": "2027-01-15T08:00:00Z"} for i in range(16)]
    kube.patch(f"{ej.job_path(namespace, 'full')}/status", {"status": {"conditions": theirs}})
    scale(kube, namespace, "full", 2)
    wait_for("worker 1 made", lambda: 1 in workers(kube, namespace, "full"), STEP)
    wait_for("the job Running with 2", partial(phase_is, kube, namespace, "full", "Running", 2), STEP)


def test_a_foreground_deletion_is_not_raced_by_the_controller(kube: Kube, namespace: str,
                                                              controller: RunningController) -> None:
    """``kubectl delete --cascade=foreground``: the garbage collector deletes the workers while the job waits
    with a deletionTimestamp; the controller took them for lost and made them again."""
    create_job(kube, namespace, "gone", minReplicas=1, maxReplicas=2, replicas=2)
    wait_for("the job Running", partial(phase_is, kube, namespace, "gone", "Running", 2), STEP)
    first = {p["metadata"]["uid"] for p in all_pods(kube, namespace)}
    kube.delete(ej.job_path(namespace, "gone"), {"apiVersion": "v1", "kind": "DeleteOptions",
                                                 "propagationPolicy": "Foreground"})
    wait_for("the job gone", lambda: not kube.get(ej.collection_path(namespace))["items"], STEP)
    made_after = [p["metadata"]["name"] for p in all_pods(kube, namespace) if p["metadata"]["uid"] not in first]
    assert not made_after
    assert "WorkerLost" not in [r for _, r, _ in events(kube, namespace, "gone")]


def test_under_the_shipped_rbac_a_worker_name_held_by_another_pod_is_told(
        testbed: ControlPlaneState, kube: Kube, namespace: str, elastic_crd: None, tmp_path: Path) -> None:
    """A Pod ``held-worker-0`` the job does not control: the controller, with only the shipped RBAC, reads who
    holds the name (a GET of the Pod) and says so, once."""
    ensure_namespace(kube)
    kubectl(testbed, "apply", "-f", str(DEPLOY / "rbac.yaml"))
    try:
        config = service_account_kubeconfig(testbed, kube, tmp_path / "sa.kubeconfig", "kubecell-elastic-controller")
        kube.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held-worker-0", "namespace": namespace},
            "spec": template()["spec"]})
        running = RunningController(config, namespace)
        try:
            create_job(kube, namespace, "held", minReplicas=1, maxReplicas=1, replicas=1)
            told = wait_for("the Warning naming the Pod", lambda: [m for _, r, m in events(kube, namespace, "held")
                                                                   if r == "FailedCreate" and "held-worker-0" in m],
                            STEP)
            assert "does not control" in told[0]
            assert not running.controller.stop.is_set()
        finally:
            running.close()
    finally:
        kubectl(testbed, "delete", "-f", str(DEPLOY / "rbac.yaml"), "--ignore-not-found")
