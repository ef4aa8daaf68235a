"""kube-controller-manager on the testbed: workload controllers create pods that kubecell schedules, the
garbage collector and the namespace controller clean up, PodDisruptionBudgets get a status.

Without a controller manager a Deployment or a Job never gets a pod and nothing is ever collected, so
kubecell could only be tested with hand-made pods; these tests make sure the testbed's controllers run
as in a real cluster (each as its own ServiceAccount) and that kubecell binds what they create. Every
wait is bounded (:data:`STEP_TIMEOUT`)."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kubecell.kube.names import ANNOTATION_DURATION, SCHEDULER_NAME
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed import pki as pki_files
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.support import wait_for

STEP_TIMEOUT = 60.0
"""Seconds for one step (a scale, a Job, a collection) on a 2-core machine that also runs the suite."""

NAMESPACE_TIMEOUT = 120.0
"""The namespace controller walks every API resource of the namespace before it lets it go."""


@pytest.fixture(scope="module")
def kubecell_scheduler(testbed: ControlPlaneState) -> Iterator[RunningScheduler]:
    """kubecell's scheduler in-process for this module: the controllers' pods ask for it by name."""
    running = RunningScheduler(testbed)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards (the namespace controller empties it)."""
    name = f"kcm-{uuid.uuid4().hex[:8]}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(f"/api/v1/namespaces/{name}")


def pod_template(app: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A one-GPU pod for kubecell's scheduler."""
    return {"metadata": {"labels": {"app": app}, "annotations": annotations or {}},
            "spec": {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def deployments(namespace: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments"


def create_deployment(kube: Kube, namespace: str, name: str, replicas: int) -> None:
    kube.create(deployments(namespace), {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": pod_template(name)}})


def pods(kube: Kube, namespace: str, app: str) -> list[dict[str, Any]]:
    return list(kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"app={app}")["items"])


def replicas_bound(kube: Kube, namespace: str, name: str, count: int) -> list[dict[str, Any]] | None:
    """The Deployment's pods once exactly ``count`` exist (scaled-down ones gone), each bound and Running,
    and the Deployment counts them ready; else None."""
    found = pods(kube, namespace, name)
    if len(found) != count:
        return None
    for pod in found:
        if not pod["spec"].get("nodeName") or pod["status"].get("phase") != "Running":
            return None
        if pod["metadata"].get("deletionTimestamp"):
            return None
    status = kube.get(f"{deployments(namespace)}/{name}").get("status") or {}
    if status.get("readyReplicas") != count or status.get("replicas") != count:
        return None
    return found


def owners(item: dict[str, Any]) -> list[tuple[str, str]]:
    return [(ref["kind"], ref["name"]) for ref in item["metadata"].get("ownerReferences") or []]


def gone(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except ApiError as error:
        return error.not_found
    return False


def test_the_controller_manager_runs_with_the_testbed(testbed: ControlPlaneState) -> None:
    assert "kube-controller-manager" in {server.name for server in testbed.running()}


def test_the_running_controller_manager_leaves_the_nodes_to_the_testbed(testbed: ControlPlaneState) -> None:
    """Read from the process itself (its /configz, through its delegated authentication and authorization):
    no node lifecycle controller taints or drains the hand-registered nodes, no node IPAM, and terminated
    pods are kept for the tests that count them."""
    server = next(s for s in testbed.servers if s.name == "kube-controller-manager")
    token = pki_files.read_token(Path(testbed.admin_kubeconfig))
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed, in memory
    request = urllib.request.Request(f"{server.url}/configz", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        config = json.load(response)["kubecontrollermanager.config.k8s.io"]
    controllers = config["Generic"]["Controllers"]
    assert "*" in controllers
    assert "-node-lifecycle-controller" in controllers
    assert "-ttl-after-finished-controller" not in controllers
    assert config["KubeCloudShared"]["AllocateNodeCIDRs"] is False
    assert config["KubeCloudShared"]["UseServiceAccountCredentials"] is True
    assert config["Generic"]["LeaderElection"]["leaderElect"] is False
    assert config["PodGCController"]["TerminatedPodGCThreshold"] >= 100_000


def test_a_deployment_scaled_2_6_1_has_every_replica_bound_by_kubecell(
        kube: Kube, namespace: str, kubecell_scheduler: RunningScheduler) -> None:
    create_deployment(kube, namespace, "web", 2)
    for count in (2, 6, 1):
        if count != 2:
            kube.patch(f"{deployments(namespace)}/web/scale", {"spec": {"replicas": count}})
        placed = wait_for(f"{count} replicas bound and ready", partial(replicas_bound, kube, namespace, "web", count),
                          STEP_TIMEOUT)
        for pod in placed:
            assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
            assert [kind for kind, _ in owners(pod)] == ["ReplicaSet"]


def test_a_job_runs_to_completion(kube: Kube, namespace: str, kubecell_scheduler: RunningScheduler) -> None:
    template = pod_template("batch", {ANNOTATION_DURATION: "1"})  # the fake kubelet ends each pod after 1 s
    template["spec"]["restartPolicy"] = "Never"
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    kube.create(jobs, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
                       "spec": {"completions": 3, "parallelism": 3, "backoffLimit": 0, "template": template}})

    def complete() -> dict[str, Any] | None:
        job = kube.get(f"{jobs}/train")
        conditions = {c["type"]: c["status"] for c in (job.get("status") or {}).get("conditions") or []}
        assert conditions.get("Failed") != "True", job["status"]
        return job if conditions.get("Complete") == "True" else None

    job = wait_for("the Job to complete", complete, STEP_TIMEOUT)
    assert job["status"]["succeeded"] == 3
    finished = pods(kube, namespace, "batch")
    assert len(finished) == 3
    assert all(pod["status"]["phase"] == "Succeeded" and pod["spec"].get("nodeName") for pod in finished)
    assert all(owners(pod) == [("Job", "train")] for pod in finished)


def test_a_finished_job_asking_for_it_is_deleted_with_its_pods(
        kube: Kube, namespace: str, kubecell_scheduler: RunningScheduler) -> None:
    """``ttlSecondsAfterFinished``: the ttl-after-finished controller deletes the Job, the garbage collector
    its pods."""
    template = pod_template("brief", {ANNOTATION_DURATION: "1"})
    template["spec"]["restartPolicy"] = "Never"
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    kube.create(jobs, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "brief"},
                       "spec": {"ttlSecondsAfterFinished": 0, "template": template}})
    wait_for("the finished Job deleted", lambda: gone(kube, f"{jobs}/brief"), STEP_TIMEOUT)
    wait_for("its pod collected", lambda: not pods(kube, namespace, "brief"), STEP_TIMEOUT)


def test_a_statefulset_gets_its_ordered_replicas_bound_by_kubecell(
        kube: Kube, namespace: str, kubecell_scheduler: RunningScheduler) -> None:
    sets = f"/apis/apps/v1/namespaces/{namespace}/statefulsets"
    kube.create(sets, {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
                       "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                                "template": pod_template("db")}})

    def ready() -> list[dict[str, Any]] | None:
        status = kube.get(f"{sets}/db").get("status") or {}
        found = pods(kube, namespace, "db")
        if status.get("readyReplicas") != 3 or len(found) != 3:
            return None
        return found if all(pod["spec"].get("nodeName") for pod in found) else None

    placed = wait_for("3 ordered replicas bound and ready", ready, STEP_TIMEOUT)
    assert sorted(pod["metadata"]["name"] for pod in placed) == ["db-0", "db-1", "db-2"]
    assert all(owners(pod) == [("StatefulSet", "db")] for pod in placed)


def test_deleting_a_deployment_collects_its_replicaset_and_pods(
        kube: Kube, namespace: str, kubecell_scheduler: RunningScheduler) -> None:
    create_deployment(kube, namespace, "doomed", 2)
    wait_for("2 replicas bound and ready", lambda: replicas_bound(kube, namespace, "doomed", 2), STEP_TIMEOUT)
    sets = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
    (replica_set,) = kube.get(sets)["items"]
    assert owners(replica_set) == [("Deployment", "doomed")]
    kube.delete(f"{deployments(namespace)}/doomed", {"propagationPolicy": "Background"})  # as kubectl deletes
    wait_for("the ReplicaSet collected", lambda: gone(kube, f"{sets}/{replica_set['metadata']['name']}"),
             STEP_TIMEOUT)
    wait_for("its pods collected", lambda: not pods(kube, namespace, "doomed"), STEP_TIMEOUT)


def test_a_disruption_budget_gets_a_status(kube: Kube, namespace: str, kubecell_scheduler: RunningScheduler) -> None:
    create_deployment(kube, namespace, "guarded", 2)
    wait_for("2 replicas bound and ready", lambda: replicas_bound(kube, namespace, "guarded", 2), STEP_TIMEOUT)
    budgets = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    kube.create(budgets, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
                          "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})

    def observed() -> dict[str, Any] | None:
        budget = kube.get(f"{budgets}/guard")
        status = budget.get("status") or {}
        if status.get("observedGeneration") != budget["metadata"]["generation"] or "currentHealthy" not in status:
            return None
        return dict(status)

    status = wait_for("the budget's status", observed, STEP_TIMEOUT)
    assert (status["currentHealthy"], status["desiredHealthy"], status["expectedPods"]) == (2, 1, 2)
    assert status["disruptionsAllowed"] == 1


def test_a_deleted_namespace_is_emptied_and_removed(kube: Kube) -> None:
    name = f"kcm-{uuid.uuid4().hex[:8]}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        accounts = f"/api/v1/namespaces/{name}/serviceaccounts/default"
        wait_for("the service-account controller's default account", lambda: not gone(kube, accounts), STEP_TIMEOUT)
        kube.create(f"/api/v1/namespaces/{name}/configmaps",
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "left-behind"}})
    finally:
        kube.delete(f"/api/v1/namespaces/{name}")
    wait_for("the namespace removed", lambda: gone(kube, f"/api/v1/namespaces/{name}"), NAMESPACE_TIMEOUT)
