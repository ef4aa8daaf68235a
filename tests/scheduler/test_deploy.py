"""The shipped manifests on the testbed, applied with the testbed's kubectl: every kustomization under
deploy/ and every example pass the API server's dry run; the VirtualCluster schema refuses malformed
objects with its own message; the scheduler run with a ServiceAccount token bound only to the shipped
RBAC schedules a workload and reads VirtualClusters (sufficient), and is refused anything else (least
privilege). The base's admission policy is in force meanwhile (test_admission_policy.py tests it)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubecell.kube import virtualclusters as vcs
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed.control_plane import ControlPlaneState
from tests.scheduler.deploy_support import (
    BASE,
    DEPLOY,
    NAMESPACE,
    clear_virtualclusters,
    install_crd,
    kubectl,
    remove_admission_policy,
    rendered,
    service_account_kubeconfig,
)
from tests.scheduler.test_scheduler import bound, make_pod
from tests.support import wait_for

KUSTOMIZATIONS = sorted(path.parent for path in DEPLOY.rglob("kustomization.yaml"))
EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml")) + sorted(DEPLOY.glob("*.yaml"))


@pytest.fixture(scope="module")
def installed(testbed: ControlPlaneState, kube: Kube) -> Iterator[None]:
    """The base applied for real (no controller-manager runs on the testbed, so the Deployment starts
    nothing): the namespaces, RBAC and CRD exist for the dry runs of overlays and examples. The base's
    admission policy (deploy/admission) is in force for this module's tests, and taken off at its end: it
    refuses the records other modules write as the admin on purpose."""
    try:
        kubectl(testbed, "apply", "-k", str(BASE))
        kubectl(testbed, "apply", "-f", str(DEPLOY / "node-agent" / "namespace.yaml"))  # the agent's own namespace
        install_crd(testbed)
        yield
    finally:
        remove_admission_policy(testbed, kube)


def test_the_base_is_what_the_docs_say(testbed: ControlPlaneState) -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered(testbed)}
    deployment = objects["Deployment", "kubecell-scheduler"]["spec"]
    assert deployment["replicas"] == 2
    container = deployment["template"]["spec"]["containers"][0]
    assert "--leader-elect" in container["args"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert deployment["template"]["spec"]["securityContext"]["runAsUser"] == 65532
    assert objects["PodDisruptionBudget", "kubecell-scheduler"]["spec"]["minAvailable"] == 1
    crd = objects["CustomResourceDefinition", "virtualclusters.kubecell.io"]["spec"]
    assert crd["scope"] == "Cluster"
    assert crd["versions"][0]["subresources"] == {"status": {}}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "Service", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= {kind for kind, _ in objects}


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_kustomization_passes_a_server_dry_run(testbed: ControlPlaneState, installed: None,
                                                    directory: Path) -> None:
    result = kubectl(testbed, "apply", "-k", str(directory), "--dry-run=server")
    assert "(server dry run)" in result.stdout


@pytest.mark.parametrize("manifest", EXAMPLES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_example_passes_a_server_dry_run(testbed: ControlPlaneState, installed: None, manifest: Path) -> None:
    result = kubectl(testbed, "apply", "-f", str(manifest), "--dry-run=server")
    assert "(server dry run)" in result.stdout


@pytest.fixture
def clean(kube: Kube, installed: None) -> Iterator[None]:
    clear_virtualclusters(kube)
    yield
    clear_virtualclusters(kube)


def virtual_cluster(name: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubecell.io/v1alpha1", "kind": "VirtualCluster", "metadata": {"name": name},
            **({"spec": spec} if spec is not None else {})}


def test_a_valid_virtualcluster_is_stored_with_defaults(kube: Kube, clean: None) -> None:
    stored = kube.create(vcs.PATH, virtual_cluster("vision", {"gpus": 32}))
    assert stored["spec"] == {"gpus": 32, "weight": 1, "minRuntimeMinutes": 0}


@pytest.mark.parametrize(("spec", "says"), [
    ({"gpus": -1}, "spec.gpus in body should be greater than or equal to 1"),
    ({"gpus": "two"}, 'spec.gpus in body must be of type integer: "string"'),
    (None, "spec: Required value"),
    ({}, "a VirtualCluster must guarantee something"),
    ({"cells": {"P40x8/blade": 1}}, "a cell type is <chain>/<kind> with kind gpu, <N>gpu, node or rack"),
    ({"cells": {"P40x8/node": -2}}, "should be greater than or equal to 0"),
    ({"gpus": 8, "weight": 0}, "spec.weight in body should be greater than 0"),
    ({"chain": "P40x8", "cells": {"P40x8/node": 1}}, "chain says which chain gpus are taken from"),
    ({"gpus": 8, "pinnedCells": ["n0", "n0"]}, "Duplicate value"),
])
def test_a_malformed_virtualcluster_is_refused_by_the_api_server(kube: Kube, clean: None, spec: Any,
                                                                 says: str) -> None:
    with pytest.raises(ApiError) as refused:
        kube.create(vcs.PATH, virtual_cluster("bad", spec))
    assert refused.value.status == 422
    assert says in refused.value.api_message


def test_a_condition_with_a_status_outside_the_enum_is_refused(kube: Kube, clean: None) -> None:
    kube.create(vcs.PATH, virtual_cluster("vision", {"gpus": 8}))
    condition = {"type": "Accepted", "status": "Maybe", "reason": "Guess", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
    with pytest.raises(ApiError) as refused:
        kube.patch(f"{vcs.PATH}/vision/status", {"status": {"conditions": [condition]}})
    assert refused.value.status == 422
    assert 'Unsupported value: "Maybe"' in refused.value.api_message


@pytest.fixture
def as_service_account(testbed: ControlPlaneState, kube: Kube, installed: None, tmp_path: Path) -> Iterator[Kube]:
    """A client with a TokenRequest token of the shipped ServiceAccount, bound only by the shipped RBAC."""
    client = Kube.from_kubeconfig(service_account_kubeconfig(testbed, kube, tmp_path / "sa.kubeconfig"))
    yield client
    client.close()


def test_the_shipped_rbac_is_enough_to_schedule_and_read_virtualclusters(
        kube: Kube, namespace: str, clean: None, as_service_account: Kube) -> None:
    review = as_service_account.create("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                       {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:kubecell-scheduler"
    assert "system:serviceaccounts" in user["groups"]
    kube.create(vcs.PATH, virtual_cluster("team", {"gpus": 16}))
    scheduler = Scheduler(as_service_account, SchedulerOptions())
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        assert scheduler.ready.wait(60), "the scheduler did not complete a cycle as the ServiceAccount"
        gang = {"kubecell.io/group": "pair", "kubecell.io/group-size": "2", "kubecell.io/vc": "team"}
        for i in range(2):
            make_pod(kube, namespace, f"pair-{i}", {"nvidia.com/gpu": "2"}, gang)
        make_pod(kube, namespace, "share", {"kubecell.io/gpu-milli": "250"}, {"kubecell.io/vc": "team"})
        wait_for("the workload bound by the least-privileged scheduler",
                 lambda: bound(kube, namespace, "pair-0", "pair-1", "share"))
        records = [json.loads(p["metadata"]["annotations"]["kubecell.io/allocation"])
                   for p in bound(kube, namespace, "pair-0", "pair-1", "share") or []]
        assert {r["vc"] for r in records} == {"team"}      # read from the VirtualCluster
        accepted = wait_for("the Accepted condition written through virtualclusters/status",
                            lambda: vcs.current_condition(kube.get(f"{vcs.PATH}/team")))
        assert accepted["status"] == "True"
    finally:
        scheduler.shutdown()
        thread.join(timeout=15)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("get", "/api/v1/secrets", None),
    ("get", f"/api/v1/namespaces/{NAMESPACE}/secrets", None),
    ("get", f"/api/v1/namespaces/{NAMESPACE}/configmaps/some-other-configmap", None),
    ("delete", "/api/v1/nodes/philly-000", None),
    ("patch", "/api/v1/nodes/philly-000", {"metadata": {"labels": {"owned": "yes"}}}),
    ("create", "/api/v1/namespaces/default/pods",
     {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "intruder"},
      "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    ("delete", "/api/v1/namespaces/default/pods/anything", None),
    ("create", vcs.PATH, virtual_cluster("mine", {"gpus": 1})),
    ("get", "/apis/apps/v1/deployments", None),
    ("create", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
     {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "escalate"},
      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
      "subjects": [{"kind": "ServiceAccount", "name": "kubecell-scheduler", "namespace": NAMESPACE}]}),
])
def test_anything_outside_the_shipped_rbac_is_refused(as_service_account: Kube, method: str, path: str,
                                                      body: dict[str, Any] | None) -> None:
    calls = {"get": lambda: as_service_account.get(path), "delete": lambda: as_service_account.delete(path),
             "patch": lambda: as_service_account.patch(path, body),
             "create": lambda: as_service_account.create(path, body or {})}
    with pytest.raises(ApiError) as refused:
        calls[method]()
    assert refused.value.status == 403, refused.value
