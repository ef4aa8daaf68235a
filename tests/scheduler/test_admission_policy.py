"""Who may write kubecell's pod annotations, on the real API server: the ValidatingAdmissionPolicy of
deploy/admission, which deploy/base (and so deploy/extender) installs, lets only the scheduler's
ServiceAccount set, change or remove the allocation record ``kubecell.io/allocation`` (a new pod, PATCH of
every kind, PUT, pods/status, a Binding through pods/binding or the bindings collection), and only the node
agent's ServiceAccount its acknowledgement ``kubecell.io/allocated``; whatever else a tenant does to their
own pods (other metadata, kubectl apply, deletion, eviction) and the kubelet's status updates still pass.

Every identity is real: TokenRequest tokens of the shipped ServiceAccounts under the shipped RBAC, and of a
tenant ServiceAccount holding, in its own namespace, what the built-in ``edit`` ClusterRole grants (plus
pods/binding, bindings and pods/status, so that those requests reach admission at all). The policy exempts
nobody, the testbed's admin (``system:masters``) included, and other modules write records as the admin on
purpose (to test the scheduler's own defences), so this module installs it and takes it off at its end,
waiting (bounded) until the API server enforces, then stops enforcing, it. How the manifests render the policy
is ``test_admission_manifests``.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubecell.kube.actions import Actions
from kubecell.kube.names import ANNOTATION_ACK, ANNOTATION_ALLOCATION, ANNOTATION_VC
from kubecell.kube.records import AllocationRecord, parse_record
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.scheduler.deploy_support import (
    BASE,
    DEPLOY,
    NAMESPACE,
    POLICY,
    SERVICE_ACCOUNT,
    kubectl,
    policy_in_effect,
    remove_admission_policy,
    service_account_kubeconfig,
)
from tests.support import wait_for

AGENT = DEPLOY / "node-agent"
AGENT_NAMESPACE = "kubecell-node"
AGENT_ACCOUNT = "kubecell-node-agent"
SCHEDULER_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
AGENT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_ACCOUNT}"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
WRITER = {ANNOTATION_ALLOCATION: "scheduler", ANNOTATION_ACK: "node agent"}
MESSAGE = {
    ANNOTATION_ALLOCATION: f"only kubecell's scheduler ({SCHEDULER_USER}) may set, change or remove the pod "
                           f"annotation {ANNOTATION_ALLOCATION} (the allocation record); ",
    ANNOTATION_ACK: f"only kubecell's node agent ({AGENT_USER}) may set, change or remove the pod annotation "
                    f"{ANNOTATION_ACK} (its acknowledgement of the allocation record); ",
}
KEYS = [ANNOTATION_ALLOCATION, ANNOTATION_ACK]
TEAM = "example.com/team"   # an annotation of the tenant's own on every pod of theirs


# ---------------------------------------------------------------- the install, the identities

@pytest.fixture(scope="module")
def policy(testbed: ControlPlaneState, kube: Kube) -> Iterator[None]:
    """kubecell installed the documented way (``kubectl apply -k deploy/base``: the scheduler's
    ServiceAccount and RBAC, and the policy with them), the node agent's ServiceAccount and RBAC; the policy
    in force, and taken off at the end of the module (the node agent's RBAC too; the base stays, as
    test_deploy.py leaves it, and the namespace kubecell-node, which test_deploy.py applies itself)."""
    try:
        kubectl(testbed, "apply", "-k", str(BASE))
        kubectl(testbed, "apply", "-f", str(AGENT / "namespace.yaml"), "-f", str(AGENT / "rbac.yaml"))
        wait_for("the API server to enforce the admission policy", lambda: policy_in_effect(kube), 60)
        yield
    finally:
        remove_admission_policy(testbed, kube)
        kubectl(testbed, "delete", "-f", str(AGENT / "rbac.yaml"), "--ignore-not-found")


def roles_of(kube: Kube, name: str, seen: set[str] | None = None) -> list[str]:
    """The ClusterRoles whose rules ``name`` grants: itself where it holds rules; an aggregated role whose
    rules are empty (the testbed runs no kube-controller-manager, whose aggregation controller fills them)
    stands for the roles its selectors pick, as in a cluster."""
    seen = set() if seen is None else seen
    if name in seen:
        return []
    seen.add(name)
    role = kube.get(f"{CLUSTERROLES}/{name}")
    if role.get("rules"):
        return [name]
    names: list[str] = []
    for selector in role["aggregationRule"]["clusterRoleSelectors"]:
        labels = ",".join(f"{key}={value}" for key, value in selector["matchLabels"].items())
        for picked in kube.get(CLUSTERROLES, labelSelector=labels)["items"]:
            names += roles_of(kube, picked["metadata"]["name"], seen)
    return names


def may(client: Kube, namespace: str, verb: str, resource: str, subresource: str = "") -> bool:
    review = client.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource,
                                        "subresource": subresource}}})
    return bool(review["status"]["allowed"])


@dataclass
class Tenant:
    """A user of the cluster: a ServiceAccount with ``edit`` in its own namespace."""

    namespace: str
    user: str
    kube: Kube
    kubeconfig: Path


@pytest.fixture(scope="module")
def tenant(testbed: ControlPlaneState, kube: Kube, policy: None,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    namespace = f"adm-{uuid.uuid4().hex[:8]}"
    base = f"/api/v1/namespaces/{namespace}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    clients: list[Kube] = []
    try:
        kube.create(f"{base}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                                "metadata": {"name": "tenant"}})
        subject = [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}]
        kube.create(f"{rbac}/roles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "binder"},
            "rules": [{"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
                      {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch", "update"]}]})
        grants = [("ClusterRole", role) for role in roles_of(kube, "edit")] + [("Role", "binder")]
        for kind, role in grants:
            kube.create(f"{rbac}/rolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": f"tenant-{role.replace(':', '-')}"}, "subjects": subject,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}})
        path = service_account_kubeconfig(testbed, kube, tmp_path_factory.mktemp("tenant") / "kubeconfig",
                                          "tenant", namespace=namespace)
        client = Kube.from_kubeconfig(path)
        clients.append(client)
        checks = [("create", "pods", ""), ("patch", "pods", ""), ("update", "pods", ""), ("delete", "pods", ""),
                  ("create", "pods", "eviction"), ("create", "pods", "binding"), ("create", "bindings", ""),
                  ("patch", "pods", "status")]
        wait_for("the tenant's RBAC to be in force", lambda: all(may(client, namespace, *check) for check in checks))
        yield Tenant(namespace, f"system:serviceaccount:{namespace}:tenant", client, path)
    finally:
        for client in clients:
            client.close()
        for pod in kube.get(f"{base}/pods")["items"]:
            with contextlib.suppress(ApiError):
                kube.delete(f"{base}/pods/{pod['metadata']['name']}", gracePeriodSeconds=0)
        wait_for("the tenant's pods to be gone", lambda: not kube.get(f"{base}/pods")["items"])
        kube.delete(f"/api/v1/namespaces/{namespace}")


@pytest.fixture(scope="module")
def scheduler(testbed: ControlPlaneState, kube: Kube, policy: None,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """The scheduler's ServiceAccount of deploy/base (the extender overlay runs the same one)."""
    client = Kube.from_kubeconfig(service_account_kubeconfig(
        testbed, kube, tmp_path_factory.mktemp("scheduler") / "kubeconfig"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def agent(testbed: ControlPlaneState, kube: Kube, policy: None,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """The node agent's ServiceAccount of deploy/node-agent."""
    client = Kube.from_kubeconfig(service_account_kubeconfig(
        testbed, kube, tmp_path_factory.mktemp("agent") / "kubeconfig", AGENT_ACCOUNT, namespace=AGENT_NAMESPACE))
    yield client
    client.close()


@pytest.fixture(scope="module")
def node(kube: Kube) -> str:
    """A node of the testbed's (its fake kubelet runs the pods bound there)."""
    return str(kube.get("/api/v1/nodes", limit=1)["items"][0]["metadata"]["name"])


# ---------------------------------------------------------------- pods, records, refusals

def pod_manifest(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod of the tenant's (it stays pending: no kubecell scheduler runs here)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}", "annotations": {TEAM: "vision", **(annotations or {})}},
            "spec": {"schedulerName": "kubecell", "containers": [{"name": "main", "image": "busybox"}]}}


def new_pod(client: Kube, namespace: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return client.create(f"/api/v1/namespaces/{namespace}/pods", pod_manifest(annotations))


def path_of(pod: dict[str, Any]) -> str:
    return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"


def gone(kube: Kube, pod: dict[str, Any]) -> bool:
    try:
        kube.get(path_of(pod))
    except ApiError as error:
        if error.not_found:
            return True
        raise
    return False


def annotations_of(kube: Kube, pod: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = kube.get(path_of(pod))["metadata"].get("annotations") or {}
    return found


def record_for(pod: dict[str, Any], node: str = "philly-000", attempt: int = 0) -> AllocationRecord:
    """A complete, valid record for the pod (what a forger writes, and what the scheduler writes)."""
    meta = pod["metadata"]
    uid = meta["uid"]
    text = json.dumps({
        "schema": "kubecell.io/allocation/v1", "allocationId": f"{uid}-{attempt}", "podUID": uid,
        "attempt": attempt, "node": node, "gpus": [{"index": 0, "uuid": "GPU-0000", "milli": 1000, "memoryMiB": 0}],
        "cpuMilli": 100, "memoryMiB": 64, "isolation": "accounting", "job": f"{meta['namespace']}/{meta['name']}",
        "vc": "default", "class": "guaranteed", "member": 0, "batch": 1, "scheduler": "kubecell/test",
        "createdAt": "2026-11-23T12:00:00Z"})
    return parse_record(text, pod=f"{meta['namespace']}/{meta['name']}", uid=uid)


def value_for(key: str, pod: dict[str, Any], attempt: int = 0) -> str:
    """What the annotation would say: the record, or the acknowledgement (the record's allocation id)."""
    record = record_for(pod, attempt=attempt)
    return record.to_annotation() if key == ANNOTATION_ALLOCATION else record.allocation_id


def assert_refused(call: Callable[[], object], key: str, user: str) -> None:
    """Refused by the policy (not by RBAC), with the message naming the annotation, who may write it, and
    who tried."""
    with pytest.raises(ApiError) as refused:
        call()
    error = refused.value
    assert error.status == 403, error
    assert f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request" in error.api_message, error
    assert MESSAGE[key] + f"{user} may not" in error.api_message, error


def bind(client: Kube, pod: dict[str, Any], node: str, annotations: dict[str, str] | None = None,
         collection: bool = False) -> None:
    """A Binding, through pods/<name>/binding or (``collection``) the namespaced bindings collection."""
    meta = pod["metadata"]
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": meta["name"], "uid": meta["uid"], **({"annotations": annotations} if annotations
                                                                      else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    where = f"/api/v1/namespaces/{meta['namespace']}/bindings" if collection else f"{path_of(pod)}/binding"
    client.create(where, body)


# ---------------------------------------------------------------- a tenant is refused

@pytest.mark.parametrize("key", KEYS)
def test_a_tenant_cannot_create_a_pod_carrying_the_annotation(kube: Kube, tenant: Tenant, key: str) -> None:
    body = pod_manifest()
    meta = {"uid": "0d5e8c2a-forged", "namespace": tenant.namespace, "name": body["metadata"]["name"]}
    body["metadata"]["annotations"][key] = value_for(key, {"metadata": meta})   # a complete record
    assert_refused(lambda: tenant.kube.create(f"/api/v1/namespaces/{tenant.namespace}/pods", body), key, tenant.user)
    assert gone(kube, {"metadata": meta})


def _merge(client: Kube, pod: dict[str, Any], key: str, value: str | None) -> None:
    client.patch(path_of(pod), {"metadata": {"annotations": {key: value}}})


def _strategic(client: Kube, pod: dict[str, Any], key: str, value: str | None) -> None:
    client.patch(path_of(pod), {"metadata": {"annotations": {key: value}}}, kind="strategic")


def _json(client: Kube, pod: dict[str, Any], key: str, value: str | None) -> None:
    pointer = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
    client.patch(path_of(pod), [{"op": "remove", "path": pointer} if value is None else
                                {"op": "add", "path": pointer, "value": value}], kind="json")


def _put(client: Kube, pod: dict[str, Any], key: str, value: str | None) -> None:
    current = client.get(path_of(pod))
    current["metadata"].setdefault("annotations", {})[key] = value
    if value is None:
        del current["metadata"]["annotations"][key]
    client.replace(path_of(pod), current)


def _status(client: Kube, pod: dict[str, Any], key: str, value: str | None) -> None:
    client.patch(f"{path_of(pod)}/status", {"metadata": {"annotations": {key: value}}})


WAYS: dict[str, Callable[[Kube, dict[str, Any], str, str | None], None]] = {
    "merge-patch": _merge, "strategic-merge-patch": _strategic, "json-patch": _json, "put": _put,
    "pods/status": _status}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("key", KEYS)
def test_a_tenant_cannot_add_the_annotation_to_a_pending_pod(kube: Kube, tenant: Tenant, key: str, way: str) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    assert_refused(lambda: WAYS[way](tenant.kube, pod, key, value_for(key, pod)), key, tenant.user)
    assert annotations_of(kube, pod) == {TEAM: "vision"}


def test_kubectl_annotate_is_refused_with_the_message(testbed: ControlPlaneState, kube: Kube, tenant: Tenant) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    result = kubectl(testbed, "-n", tenant.namespace, "annotate", "pod", pod["metadata"]["name"],
                     f"{ANNOTATION_ALLOCATION}={value_for(ANNOTATION_ALLOCATION, pod)}",
                     check=False, kubeconfig=tenant.kubeconfig)
    assert result.returncode != 0
    assert "Forbidden" in result.stderr
    assert MESSAGE[ANNOTATION_ALLOCATION] + f"{tenant.user} may not" in result.stderr
    assert annotations_of(kube, pod) == {TEAM: "vision"}


def owners(scheduler: Kube, agent: Kube) -> dict[str, Kube]:
    return {ANNOTATION_ALLOCATION: scheduler, ANNOTATION_ACK: agent}


@pytest.mark.parametrize(("edit", "way"), [("change", "merge-patch"), ("change", "put"), ("remove", "merge-patch"),
                                           ("remove", "json-patch"), ("remove", "put"), ("remove", "pods/status")])
@pytest.mark.parametrize("key", KEYS)
def test_a_tenant_cannot_change_or_remove_the_annotation(kube: Kube, tenant: Tenant, scheduler: Kube, agent: Kube,
                                                         key: str, edit: str, way: str) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    written = value_for(key, pod)
    _merge(owners(scheduler, agent)[key], pod, key, written)           # its owner wrote it: allowed
    assert annotations_of(kube, pod)[key] == written
    new = value_for(key, pod, attempt=1) if edit == "change" else None
    assert_refused(lambda: WAYS[way](tenant.kube, pod, key, new), key, tenant.user)
    assert annotations_of(kube, pod) == {TEAM: "vision", key: written}


@pytest.mark.parametrize("collection", [False, True], ids=["pods/binding", "bindings"])
def test_a_tenant_cannot_slip_a_record_in_with_a_binding(kube: Kube, tenant: Tenant, node: str,
                                                         collection: bool) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    forged = {ANNOTATION_ALLOCATION: value_for(ANNOTATION_ALLOCATION, pod)}
    assert_refused(lambda: bind(tenant.kube, pod, node, forged, collection), ANNOTATION_ALLOCATION, tenant.user)
    current = kube.get(path_of(pod))
    assert not current["spec"].get("nodeName")
    assert ANNOTATION_ALLOCATION not in current["metadata"]["annotations"]


# ---------------------------------------------------------------- what the API server lets through where

@pytest.mark.parametrize("collection", [False, True], ids=["pods/binding", "bindings"])
def test_a_binding_copies_its_annotations_onto_the_pod(kube: Kube, tenant: Tenant, node: str,
                                                       collection: bool) -> None:
    """Why both binding paths are matched: either copies a Binding's annotations onto the pod (a Binding
    without kubecell's annotations is the tenant's to send, where RBAC allows it)."""
    pod = new_pod(tenant.kube, tenant.namespace)
    bind(tenant.kube, pod, node, {"example.com/bound-by": "tenant"}, collection)
    current = kube.get(path_of(pod))
    assert current["spec"]["nodeName"] == node
    assert current["metadata"]["annotations"]["example.com/bound-by"] == "tenant"


def test_pods_status_writes_annotations(kube: Kube, tenant: Tenant) -> None:
    """Why pods/status is matched: the API server keeps only the spec (and owner references) of the old
    pod on a status write, so metadata goes through there."""
    pod = new_pod(tenant.kube, tenant.namespace)
    tenant.kube.patch(f"{path_of(pod)}/status", {"metadata": {"annotations": {"example.com/note": "via status"},
                                                              "labels": {"via": "status"}}})
    current = kube.get(path_of(pod))
    assert current["metadata"]["annotations"]["example.com/note"] == "via status"
    assert current["metadata"]["labels"] == {"via": "status"}


@pytest.mark.parametrize("subresource", ["ephemeralcontainers", "resize"])
def test_ephemeralcontainers_and_resize_keep_the_old_metadata(kube: Kube, tenant: Tenant, subresource: str) -> None:
    """These subresources drop metadata changes before admission, so the policy sees nothing to refuse and
    nothing is written (they are matched anyway, should a later API server let metadata through)."""
    pod = new_pod(tenant.kube, tenant.namespace)
    answer = kube.patch(f"{path_of(pod)}/{subresource}",
                        {"metadata": {"annotations": {ANNOTATION_ALLOCATION: value_for(ANNOTATION_ALLOCATION, pod)}}})
    assert ANNOTATION_ALLOCATION not in answer["metadata"]["annotations"]
    assert annotations_of(kube, pod) == {TEAM: "vision"}


# ---------------------------------------------------------------- a tenant still does everything else

def test_a_tenant_still_creates_pods(kube: Kube, tenant: Tenant) -> None:
    plain = new_pod(tenant.kube, tenant.namespace)
    dialect = new_pod(tenant.kube, tenant.namespace, {ANNOTATION_VC: "vision", "kubecell.io/group": "g",
                                                      "kubecell.io/group-size": "1"})
    assert annotations_of(kube, plain) == {TEAM: "vision"}
    assert annotations_of(kube, dialect)[ANNOTATION_VC] == "vision"


def _other_merge(client: Kube, pod: dict[str, Any]) -> None:
    client.patch(path_of(pod), {"metadata": {"annotations": {TEAM: "speech", "example.com/new": "1"},
                                             "labels": {"tier": "gold"}}})


def _other_strategic(client: Kube, pod: dict[str, Any]) -> None:
    client.patch(path_of(pod), {"metadata": {"annotations": {TEAM: "speech", "example.com/new": "1"},
                                             "labels": {"tier": "gold"}}}, kind="strategic")


def _other_json(client: Kube, pod: dict[str, Any]) -> None:
    client.patch(path_of(pod), [{"op": "replace", "path": "/metadata/annotations/example.com~1team", "value": "speech"},
                                {"op": "add", "path": "/metadata/annotations/example.com~1new", "value": "1"},
                                {"op": "add", "path": "/metadata/labels", "value": {"tier": "gold"}}], kind="json")


def _other_put(client: Kube, pod: dict[str, Any]) -> None:
    current = client.get(path_of(pod))
    current["metadata"]["annotations"].update({TEAM: "speech", "example.com/new": "1"})
    current["metadata"]["labels"] = {"tier": "gold"}
    client.replace(path_of(pod), current)


def _other_status(client: Kube, pod: dict[str, Any]) -> None:
    client.patch(f"{path_of(pod)}/status", {"metadata": {"annotations": {TEAM: "speech", "example.com/new": "1"},
                                                         "labels": {"tier": "gold"}}})


OTHER_EDITS: dict[str, Callable[[Kube, dict[str, Any]], None]] = {
    "merge-patch": _other_merge, "strategic-merge-patch": _other_strategic, "json-patch": _other_json,
    "put": _other_put, "pods/status": _other_status}


@pytest.mark.parametrize("way", OTHER_EDITS)
def test_a_tenant_still_edits_other_metadata_of_a_pod_with_a_record(kube: Kube, tenant: Tenant, scheduler: Kube,
                                                                    agent: Kube, way: str) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    record, ack = value_for(ANNOTATION_ALLOCATION, pod), value_for(ANNOTATION_ACK, pod)
    _merge(scheduler, pod, ANNOTATION_ALLOCATION, record)
    _merge(agent, pod, ANNOTATION_ACK, ack)
    OTHER_EDITS[way](tenant.kube, pod)
    current = kube.get(path_of(pod))["metadata"]
    assert current["annotations"] == {TEAM: "speech", "example.com/new": "1", ANNOTATION_ALLOCATION: record,
                                      ANNOTATION_ACK: ack}
    assert current["labels"] == {"tier": "gold"}


@pytest.mark.parametrize("server_side", [False, True], ids=["client-side", "server-side"])
def test_kubectl_apply_of_other_fields_leaves_the_record_alone(testbed: ControlPlaneState, kube: Kube, tenant: Tenant,
                                                               scheduler: Kube, tmp_path: Path,
                                                               server_side: bool) -> None:
    name = f"applied-{uuid.uuid4().hex[:6]}"
    manifest = pod_manifest()
    manifest["metadata"].update(name=name, namespace=tenant.namespace, labels={"tier": "silver"})
    file = tmp_path / "pod.yaml"
    mode = ["--server-side"] if server_side else []
    file.write_text(yaml.safe_dump(manifest))
    kubectl(testbed, "apply", *mode, "-f", str(file), kubeconfig=tenant.kubeconfig)
    pod = kube.get(f"/api/v1/namespaces/{tenant.namespace}/pods/{name}")
    record = value_for(ANNOTATION_ALLOCATION, pod)
    _merge(scheduler, pod, ANNOTATION_ALLOCATION, record)
    manifest["metadata"]["labels"] = {"tier": "gold"}
    manifest["metadata"]["annotations"] = {TEAM: "speech"}
    file.write_text(yaml.safe_dump(manifest))
    kubectl(testbed, "apply", *mode, "-f", str(file), kubeconfig=tenant.kubeconfig)
    current = kube.get(path_of(pod))["metadata"]
    assert current["labels"] == {"tier": "gold"}
    assert current["annotations"][TEAM] == "speech"
    assert current["annotations"][ANNOTATION_ALLOCATION] == record


@pytest.mark.parametrize("how", ["delete", "delete-now", "evict"])
def test_a_tenant_still_deletes_pods_with_records(kube: Kube, tenant: Tenant, scheduler: Kube, agent: Kube, node: str,
                                                  how: str) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    record = record_for(pod, node)
    Actions(scheduler, "kubecell").bind(pod, node, record)            # bound, with its record
    _merge(agent, pod, ANNOTATION_ACK, record.allocation_id)           # and acknowledged
    wait_for("the kubelet to run the pod", lambda: kube.get(path_of(pod))["status"].get("phase") == "Running")
    if how == "evict":
        tenant.kube.create(f"{path_of(pod)}/eviction", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                        "metadata": {"name": pod["metadata"]["name"]}})
    else:
        tenant.kube.delete(path_of(pod), gracePeriodSeconds=0 if how == "delete-now" else None)
    # a graceful deletion ends with the kubelet's own deletion once the pod stopped (the fake kubelet's)
    wait_for("the pod to be gone", lambda: gone(kube, pod))


# ---------------------------------------------------------------- kubecell's own identities

def test_the_scheduler_writes_changes_and_clears_records(kube: Kube, tenant: Tenant, scheduler: Kube) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    actions = Actions(scheduler, "kubecell")
    first, second = record_for(pod, attempt=0), record_for(pod, attempt=1)
    actions.write_record(pod, first)
    assert annotations_of(kube, pod)[ANNOTATION_ALLOCATION] == first.to_annotation()
    actions.write_record(pod, second)
    assert annotations_of(kube, pod)[ANNOTATION_ALLOCATION] == second.to_annotation()
    actions.unschedulable(pod, "waiting for the test")                  # pods/status of a pod with a record
    conditions = kube.get(path_of(pod))["status"]["conditions"]
    assert [(c["type"], c["status"], c["message"]) for c in conditions] == [
        ("PodScheduled", "False", "waiting for the test")]
    actions.clear_record(pod)
    assert annotations_of(kube, pod) == {TEAM: "vision"}


def test_the_scheduler_binds_with_the_record_and_the_kubelet_still_reports(kube: Kube, tenant: Tenant,
                                                                           scheduler: Kube, node: str) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    record = record_for(pod, node)
    Actions(scheduler, "kubecell").bind(pod, node, record)
    current = kube.get(path_of(pod))
    assert current["spec"]["nodeName"] == node
    assert current["metadata"]["annotations"][ANNOTATION_ALLOCATION] == record.to_annotation()
    # the (fake) kubelet's status writes of a pod with a record pass: it runs the pod
    wait_for("the kubelet to run the pod", lambda: kube.get(path_of(pod))["status"].get("phase") == "Running")


def test_the_scheduler_may_not_acknowledge(kube: Kube, tenant: Tenant, scheduler: Kube) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    Actions(scheduler, "kubecell").write_record(pod, record_for(pod))
    assert_refused(lambda: _merge(scheduler, pod, ANNOTATION_ACK, value_for(ANNOTATION_ACK, pod)), ANNOTATION_ACK,
                   SCHEDULER_USER)
    assert ANNOTATION_ACK not in annotations_of(kube, pod)


def test_the_node_agent_acknowledges_but_may_not_write_records(kube: Kube, tenant: Tenant, scheduler: Kube,
                                                               agent: Kube) -> None:
    pod = new_pod(tenant.kube, tenant.namespace)
    record = record_for(pod)
    Actions(scheduler, "kubecell").write_record(pod, record)
    # the allocator's own acknowledgement: a merge patch carrying the pod's uid
    agent.patch(path_of(pod), {"metadata": {"uid": pod["metadata"]["uid"],
                                            "annotations": {ANNOTATION_ACK: record.allocation_id}}})
    assert annotations_of(kube, pod)[ANNOTATION_ACK] == record.allocation_id
    forged = value_for(ANNOTATION_ALLOCATION, pod, attempt=1)
    assert_refused(lambda: _merge(agent, pod, ANNOTATION_ALLOCATION, forged), ANNOTATION_ALLOCATION, AGENT_USER)
    assert_refused(lambda: _merge(agent, pod, ANNOTATION_ALLOCATION, None), ANNOTATION_ALLOCATION, AGENT_USER)
    assert annotations_of(kube, pod)[ANNOTATION_ALLOCATION] == record.to_annotation()


def test_the_admin_is_refused_too_and_repairs_as_the_scheduler(testbed: ControlPlaneState, kube: Kube,
                                                               tenant: Tenant) -> None:
    """Nobody is exempt: a cluster-admin's hand-written (or copied) record is what the scheduler must not
    find. A deliberate repair impersonates the scheduler, which the audit log records as such."""
    pod = new_pod(tenant.kube, tenant.namespace)
    record = value_for(ANNOTATION_ALLOCATION, pod)
    assert_refused(lambda: _merge(kube, pod, ANNOTATION_ALLOCATION, record), ANNOTATION_ALLOCATION, "kubecell-admin")
    kubectl(testbed, f"--as={SCHEDULER_USER}", "-n", tenant.namespace, "annotate", "pod", pod["metadata"]["name"],
            f"{ANNOTATION_ALLOCATION}={record}")
    assert annotations_of(kube, pod)[ANNOTATION_ALLOCATION] == record


def test_a_tenant_cannot_act_as_the_scheduler(testbed: ControlPlaneState, kube: Kube, tenant: Tenant) -> None:
    """The policy trusts the user name; ``edit`` lets its holder impersonate, and mint tokens of, the
    ServiceAccounts of its own namespace only, never kubecell-system's."""
    pod = new_pod(tenant.kube, tenant.namespace)
    result = kubectl(testbed, f"--as={SCHEDULER_USER}", "-n", tenant.namespace, "annotate", "pod",
                     pod["metadata"]["name"], f"{ANNOTATION_ALLOCATION}={value_for(ANNOTATION_ALLOCATION, pod)}",
                     check=False, kubeconfig=tenant.kubeconfig)
    assert result.returncode != 0
    assert f'User "{tenant.user}" cannot impersonate' in result.stderr, result.stderr   # RBAC, before admission
    with pytest.raises(ApiError) as refused:
        tenant.kube.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{SERVICE_ACCOUNT}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})
    assert refused.value.status == 403
    assert annotations_of(kube, pod) == {TEAM: "vision"}
