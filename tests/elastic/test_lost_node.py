"""A worker whose node is lost, on the real testbed: a Node object no kubelet serves (none of the testbed's kubelets
takes a node without the testbed label, and the node lifecycle controller does not run), so a worker bound there
and deleted with a grace period stays Terminating, as on a cluster whose node stopped answering. The controller
deletes it at once ``stuck_seconds`` past its grace period, says so in an Event, and recreates the worker; without
that, the pod would hold its name, and the job's place in it, for ever."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from kubecell.kube import elasticjobs as ej
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.elastic.support import STEP, RunningController, events, template, workers
from tests.support import wait_for

STUCK_SECONDS = 3.0


@pytest.fixture
def lost_node(kube: Kube, namespace: str) -> Iterator[str]:
    """A Node that exists (so pod GC keeps its pods: they are not orphans) and that no kubelet serves. Its pods,
    which nothing else would ever end, go with the namespace fixture's force delete."""
    name = f"lost-{namespace}"
    kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(f"/api/v1/nodes/{name}")


def test_a_worker_stuck_terminating_on_a_lost_node_is_deleted_and_replaced(
        testbed: ControlPlaneState, kube: Kube, namespace: str, elastic_crd: None, lost_node: str) -> None:
    controller = RunningController(testbed.admin_kubeconfig, namespace, stuck_seconds=STUCK_SECONDS)
    try:
        body = template()
        body["spec"]["nodeName"] = lost_node  # bound there at creation, as if scheduled before the node was lost
        kube.create(ej.collection_path(namespace), {
            "apiVersion": ej.API_VERSION, "kind": ej.KIND, "metadata": {"name": "stranded", "namespace": namespace},
            "spec": {"template": body, "minReplicas": 1, "maxReplicas": 1, "replicas": 1}})
        first = wait_for("worker 0 bound to the lost node", lambda: workers(kube, namespace, "stranded").get(0), STEP)
        assert first["spec"]["nodeName"] == lost_node
        uid = first["metadata"]["uid"]
        # a drain (or a shrink) deletes it gracefully; no kubelet confirms, so the API server keeps it Terminating
        deleting = time.monotonic()
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/stranded-worker-0", gracePeriodSeconds=1)
        terminating = kube.get(f"/api/v1/namespaces/{namespace}/pods/stranded-worker-0")
        assert terminating["metadata"]["uid"] == uid
        assert terminating["metadata"].get("deletionTimestamp")

        replacement = wait_for("worker 0 replaced", lambda: (w := workers(kube, namespace, "stranded").get(0))
                               and w["metadata"]["uid"] != uid and w, STEP)
        # not before the controller's margin past the grace period's end had passed
        assert time.monotonic() - deleting > STUCK_SECONDS
        assert not replacement["metadata"].get("deletionTimestamp")
        forced = wait_for("the PodForceDeleted Event", lambda: [m for _, r, m in events(kube, namespace, "stranded")
                                                                if r == "PodForceDeleted"], STEP)
        assert "stranded-worker-0" in forced[0]
        assert "past its grace period" in forced[0]
    finally:
        controller.close()
