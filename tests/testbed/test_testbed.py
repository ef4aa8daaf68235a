"""The testbed is a real control plane: real validation, RBAC, scheduling, and node/pod lifecycles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubecell.core.model import TopologyLevel
from kubecell.kube.inventory import node_view
from kubecell.kube.names import ANNOTATION_DURATION, k8s_name
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed import testbed as testbed_driver
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import load_cluster_nodes
from tests.conftest import TESTBED_CLUSTER
from tests.support import wait_for

PODS = "/api/v1/namespaces/default/pods"


def gpu_pod(name: str, gpus: int = 1, *, duration: float | None = None) -> dict[str, Any]:
    annotations = {ANNOTATION_DURATION: str(duration)} if duration is not None else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def phase(kube: Kube, name: str) -> str:
    return str(kube.get(f"{PODS}/{name}")["status"].get("phase", ""))


def test_the_api_server_is_the_pinned_release(kube: Kube) -> None:
    assert kube.get("/version")["gitVersion"] == "v1.37.2"


def test_nodes_are_the_simulator_cluster(kube: Kube) -> None:
    expected = {k8s_name(node.name): node for node in load_cluster_nodes(TESTBED_CLUSTER)}
    items = kube.get("/api/v1/nodes")["items"]
    assert {item["metadata"]["name"] for item in items} == set(expected)
    for item in items:
        view = node_view(item)
        assert view.node is not None, view.excluded
        assert view.source == "inventory"
        want, got = expected[view.name], view.node
        assert (got.cpu_milli, got.memory_mib, got.rack) == (want.cpu_milli, want.memory_mib, want.rack)
        assert [(g.model, g.memory_mib, g.healthy) for g in got.gpus] == [
            (g.model, g.memory_mib, g.healthy) for g in want.gpus]
        for level in (TopologyLevel.NVLINK, TopologyLevel.NUMA):
            assert got.groups_at(level) == want.groups_at(level)
        assert not item["spec"].get("taints"), "nodes must be schedulable"


def test_stock_scheduler_binds_and_the_fake_kubelet_runs_the_pod_to_completion(kube: Kube) -> None:
    kube.create(PODS, gpu_pod("runs-briefly", 2, duration=1.0))
    wait_for("the pod to be bound", lambda: kube.get(f"{PODS}/runs-briefly")["spec"].get("nodeName"))
    wait_for("the pod to succeed", lambda: phase(kube, "runs-briefly") == "Succeeded", timeout=20)
    kube.delete(f"{PODS}/runs-briefly")


def test_graceful_deletion_completes(kube: Kube) -> None:
    kube.create(PODS, gpu_pod("long-runner"))
    wait_for("the pod to run", lambda: phase(kube, "long-runner") == "Running")
    kube.delete(f"{PODS}/long-runner")  # default grace period: a kubelet must confirm the deletion

    def gone() -> bool:
        try:
            kube.get(f"{PODS}/long-runner")
        except ApiError as error:
            return error.not_found
        return False

    wait_for("the pod to be removed", gone, timeout=15)


def test_impossible_pod_stays_pending_with_the_schedulers_reason(kube: Kube) -> None:
    kube.create(PODS, gpu_pod("too-big", 9))  # Philly nodes have 8 GPUs
    pod = wait_for("a scheduling verdict", lambda: next(
        (c for c in kube.get(f"{PODS}/too-big")["status"].get("conditions") or [] if c["type"] == "PodScheduled"),
        None))
    assert pod["status"] == "False"
    assert "Insufficient nvidia.com/gpu" in pod["message"]
    kube.delete(f"{PODS}/too-big", gracePeriodSeconds=0)


def test_rbac_is_enforced(testbed: ControlPlaneState) -> None:
    # No role ever lets kubecell's scheduler read Secrets (deploy/base/rbac.yaml grants no such thing).
    unprivileged = Kube.from_kubeconfig(testbed.kubeconfig("kubecell-scheduler"))
    try:
        with pytest.raises(ApiError) as refused:
            unprivileged.get("/api/v1/secrets")
        assert refused.value.status == 403
    finally:
        unprivileged.close()


def test_the_api_server_validates_what_it_is_given(kube: Kube) -> None:
    bad = gpu_pod("Not_A_Valid_Name")
    with pytest.raises(ApiError) as rejected:
        kube.create(PODS, bad)
    assert rejected.value.status == 422


def test_node_leases_are_renewed(kube: Kube) -> None:
    lease = wait_for("a node lease", lambda: _lease(kube, "philly-000"))
    assert lease["spec"]["holderIdentity"] == "philly-000"


def _lease(kube: Kube, node: str) -> dict[str, Any] | None:
    try:
        return kube.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
    except ApiError:
        return None


def test_status_lists_the_running_servers(testbed: ControlPlaneState) -> None:
    state = testbed_driver.status(Path(testbed.directory))
    assert state is not None
    assert {server.name for server in state.running()} == {"etcd", "kube-apiserver", "kube-scheduler",
                                                           "kube-controller-manager", "fake-kubelet"}
