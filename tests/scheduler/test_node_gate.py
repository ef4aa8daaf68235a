"""Nodes served by kubecell's device plugin: one GPU pod bound at a time until the agent acknowledges it,
and isolation modes a node cannot give are never given silently."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kubecell.core.model import GPU_MODELS, Gpu, Node
from kubecell.kube import pods
from kubecell.kube.inventory import inventory_of
from kubecell.kube.names import ANNOTATION_ACK, ANNOTATION_INVENTORY
from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from tests.cluster_fixtures import RunningScheduler
from tests.support import registered_node, wait_for


@pytest.fixture
def agent_node(kube: Kube) -> Iterator[str]:
    with served_node(kube) as name:
        yield name


@contextlib.contextmanager
def served_node(kube: Kube) -> Iterator[str]:
    """A 4-GPU node whose (pretend) node agent serves the device plugin and can isolate by MPS."""
    name = f"agent-{uuid.uuid4().hex[:6]}"
    model = GPU_MODELS["A100"]
    node = Node(name, 64_000, 256_000, tuple(Gpu(i, "A100", model.memory_mib) for i in range(4)),
                labels={"kubecell.io/test-node": name})
    manifest = node_manifest(node)
    inventory = inventory_of(node, agent="kubecell-node-agent/test").model_copy(
        update={"device_plugin": True, "isolation": ["accounting", "mps"]})
    manifest["metadata"]["annotations"][ANNOTATION_INVENTORY] = inventory.to_annotation()
    with registered_node(kube, manifest):
        yield name


def pod_on(kube: Kube, namespace: str, name: str, node: str, limits: dict[str, str],
           annotations: dict[str, str] | None = None) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubecell.io/test-node": node},
                     "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}}
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


def get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def acknowledge(kube: Kube, namespace: str, name: str) -> None:
    """What the node agent does once its Allocate served the pod."""
    record = pods.record_of(get(kube, namespace, name))
    assert record is not None
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}",
               {"metadata": {"annotations": {ANNOTATION_ACK: record.allocation_id}}})


def test_gpu_pods_are_bound_one_at_a_time_until_the_agent_acknowledges(
        testbed: ControlPlaneState, kube: Kube, namespace: str, agent_node: str,
        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    pod_on(kube, namespace, "a", agent_node, {"kubecell.io/gpu": "1"})
    wait_for("a bound", lambda: get(kube, namespace, "a")["spec"].get("nodeName"))
    pod_on(kube, namespace, "b", agent_node, {"kubecell.io/gpu-milli": "500"})
    pod_on(kube, namespace, "cpu", agent_node, {"cpu": "1"})  # no device-plugin resource: never held
    wait_for("the CPU pod bound", lambda: get(kube, namespace, "cpu")["spec"].get("nodeName"))
    time.sleep(1.5)
    assert not get(kube, namespace, "b")["spec"].get("nodeName"), "b must wait for the agent to serve a"
    acknowledge(kube, namespace, "a")
    wait_for("b bound after a was acknowledged", lambda: get(kube, namespace, "b")["spec"].get("nodeName"))
    pod_on(kube, namespace, "c", agent_node, {"kubecell.io/gpu": "1"})
    time.sleep(1.5)
    assert not get(kube, namespace, "c")["spec"].get("nodeName")
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/b", gracePeriodSeconds=0)  # b ended unserved
    wait_for("c bound once b is gone", lambda: get(kube, namespace, "c")["spec"].get("nodeName"))
    records = [pods.record_of(get(kube, namespace, name)) for name in ("a", "c")]
    assert all(r is not None and r.node == agent_node for r in records)
    assert len({g.uuid for r in records if r is not None for g in r.gpus}) == 2


def test_an_isolation_mode_is_given_only_where_a_node_can_give_it(
        testbed: ControlPlaneState, kube: Kube, namespace: str, agent_node: str,
        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    pod_on(kube, namespace, "mps", agent_node, {"kubecell.io/gpu-milli": "250"}, {"kubecell.io/isolation": "mps"})
    mps = wait_for("the MPS share bound", lambda: pods.record_of(get(kube, namespace, "mps")))
    assert mps.isolation == "mps"
    assert mps.node == agent_node
    for name, limits in (("mig", {"kubecell.io/gpu": "1"}), ("mig-share", {"kubecell.io/gpu-milli": "250"})):
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "annotations": {"kubecell.io/isolation": "mig"}},
                "spec": {"schedulerName": "kubecell", "containers": [
                    {"name": "main", "image": "x", "resources": {"limits": limits}}]}}
        kube.create(f"/api/v1/namespaces/{namespace}/pods", body)

    def told(name: str, words: str) -> str | None:
        for condition in get(kube, namespace, name)["status"].get("conditions") or []:
            if condition["type"] == "PodScheduled" and words in condition.get("message", ""):
                return str(condition["message"])
        return None

    # no node here is in MIG mode: a MIG instance waits, saying why; a share of one is refused outright
    assert wait_for("the MIG pod told why it waits", lambda: told("mig", "cannot isolate by mig"))
    assert wait_for("the MIG share refused", lambda: told("mig-share", "places one whole MIG instance"))
    assert not get(kube, namespace, "mig")["spec"].get("nodeName")
    assert not get(kube, namespace, "mig-share")["spec"].get("nodeName")
