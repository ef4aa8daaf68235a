"""deploy/node-agent/admission.yaml in force on the testbed's real API server: the node agent, whose RBAC lets it
patch every Node and write every ResourceSlice, runs as before with the token the kubelet would mount (bound to
its pod on its node), and writes nothing of another node's: not its inventory annotation, not its slices, not
its pods' acknowledgements. A token bound to no pod writes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")

from kubecell.kube.actions import event_body
from kubecell.kube.names import ANNOTATION_ACK, ANNOTATION_INVENTORY
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.node.test_agent import agent_node, does_its_work
from tests.scheduler.deploy_support import DEPLOY, kubectl, service_account_kubeconfig
from tests.support import refused, wait_for

AGENT = DEPLOY / "node-agent"
POLICY = "kubecell-node-agent-own-node"
ACCOUNT, AGENT_NAMESPACE = "kubecell-node-agent", "kubecell-node"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def agent_pod(kube: Kube, node: str) -> dict[str, Any]:
    """A pod of the agent's DaemonSet as it would be on ``node`` (never run: nothing here runs its image;
    deleted by the ``policy`` fixture)."""
    return kube.create(f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"kubecell-node-agent-{uuid.uuid4().hex[:6]}", "namespace": AGENT_NAMESPACE},
        "spec": {"nodeName": node, "serviceAccountName": ACCOUNT, "schedulerName": "nobody",
                 "containers": [{"name": "agent", "image": "ghcr.io/kubecell/kubecell:0.1.0"}]}})


def slice_of(node: str, driver: str = "gpu.kubecell.io") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-probe"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1}, "devices": []}}


@pytest.fixture
def policy(testbed: ControlPlaneState, kube: Kube) -> Iterator[None]:
    kubectl(testbed, "apply", "-f", str(AGENT / "namespace.yaml"))
    kubectl(testbed, "apply", "-f", str(AGENT / "rbac.yaml"))
    kubectl(testbed, "apply", "-f", str(AGENT / "admission.yaml"))
    try:
        yield
    finally:
        for item in kube.get(f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods")["items"]:
            if item["metadata"]["name"].startswith("kubecell-node-agent-"):
                kube.delete(f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods/{item['metadata']['name']}",
                            gracePeriodSeconds="0")
        kubectl(testbed, "delete", "-f", str(AGENT / "admission.yaml"), "--ignore-not-found")
        kubectl(testbed, "delete", "-f", str(AGENT / "rbac.yaml"), "--ignore-not-found")


def test_the_agent_writes_its_own_node_and_nothing_of_anothers(
        policy: None, testbed: ControlPlaneState, kube: Kube, namespace: str,
        start_scheduler: type[RunningScheduler], tmp_path: Path) -> None:
    clients: list[Kube] = []

    def bound_to(node: str) -> Kube:
        """The agent's client with a token bound to its pod on ``node``, as the kubelet mounts it."""
        client = Kube.from_kubeconfig(service_account_kubeconfig(
            testbed, kube, tmp_path / f"{node}.kubeconfig", ACCOUNT, namespace=AGENT_NAMESPACE,
            bound_pod=agent_pod(kube, node)))
        clients.append(client)
        return client

    other = next(n["metadata"]["name"] for n in kube.get("/api/v1/nodes")["items"]
                 if ANNOTATION_INVENTORY in (n["metadata"].get("annotations") or {}))
    try:
        with agent_node(kube, "a100-nvlink", "own", agent_for=bound_to) as r:
            as_agent = clients[0]
            wait_for(f"{POLICY} in force", lambda: _refuses(as_agent, other), 60)
            # the agent's own work goes through: inventory, GPU memory, a pod served and acknowledged
            does_its_work(r, kube, namespace, lambda: start_scheduler(testbed))
            # its own node's slices: created, replaced, deleted
            made = as_agent.create(SLICES, slice_of(r.name))
            as_agent.replace(f"{SLICES}/{made['metadata']['name']}", made)
            as_agent.delete(f"{SLICES}/{made['metadata']['name']}")
            # Events: about a pod, as the agent, from its own node; never as another node's agent or another
            # component (the scheduler, the kubelet), never about another kind of object
            pod = {"apiVersion": "v1", "kind": "Pod", "name": "probe", "namespace": namespace, "uid": "probe-uid"}
            events = f"/api/v1/namespaces/{namespace}/events"

            def told(component: str = "kubecell-node-agent", host: str | None = r.name,
                     involved: dict[str, Any] = pod) -> dict[str, Any]:
                return event_body(involved, namespace, event_type="Warning", reason="GPUOveruse", message="probe",
                                  component=component, action="Scheduling", host=host)

            as_agent.create(events, told())
            assert f"on {r.name} writes only its own node's objects" in refused(as_agent.create, events,
                                                                                told(host=other))
            assert "writes only its own node's objects" in refused(as_agent.create, events, told(host=None))
            assert "as kubecell-node-agent" in refused(as_agent.create, events, told("kubecell-scheduler"))
            assert "as kubecell-node-agent" in refused(as_agent.create, events, told(involved={
                "apiVersion": "v1", "kind": "ConfigMap", "name": "tenants", "namespace": namespace, "uid": "x"}))
            # another node's objects: none
            before = kube.get(f"/api/v1/nodes/{other}")
            says = refused(as_agent.patch, f"/api/v1/nodes/{other}",
                           {"metadata": {"annotations": {ANNOTATION_INVENTORY: "{}"}}})
            assert f"on {r.name} writes only its own node's objects, not nodes {other}" in says, says
            refused(as_agent.patch, f"/api/v1/nodes/{other}/status",
                    {"status": {"capacity": {"kubecell.io/gpu-memory": "1"}}})
            after = kube.get(f"/api/v1/nodes/{other}")
            assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
            assert "writes only its own node's objects" in refused(as_agent.create, SLICES, slice_of(other))
            assert "of its own driver" in refused(as_agent.create, SLICES, slice_of(r.name, "gpu.example.com"))
            elsewhere = agent_pod(kube, other)  # a pod bound to the other node
            refused(as_agent.patch, f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods/{elsewhere['metadata']['name']}",
                    {"metadata": {"annotations": {ANNOTATION_ACK: "forged"}}})
        # a token bound to no pod names no node: it writes nothing, not even the node it claims
        unbound = Kube.from_kubeconfig(service_account_kubeconfig(
            testbed, kube, tmp_path / "unbound.kubeconfig", ACCOUNT, namespace=AGENT_NAMESPACE))
        clients.append(unbound)
        assert "this token names no node" in refused(unbound.patch, f"/api/v1/nodes/{other}",
                                                     {"metadata": {"annotations": {"probe": "x"}}})
    finally:
        for client in clients:
            client.close()


def _refuses(client: Kube, node: str) -> bool:
    """Whether the policy is in force: a server dry run (nothing is written either way) of a slice for
    ``node``."""
    try:
        client.create(SLICES, slice_of(node), dryRun="All")
    except ApiError as error:
        return error.status == 403
    return False
