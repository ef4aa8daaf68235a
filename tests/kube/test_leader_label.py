"""The leader's label on the testbed: of two replicas (``service.run`` in threads, with the shipped RBAC's
identity), exactly the leader's Pod carries ``kubecell.io/leader=true``; a graceful stop hands the label
over; a crashed leader's label is taken off by the next leader; labels edited by hand are repaired; and the
Service ``kubecell-extender`` of the extender overlay selects the leader's Pod alone.

The Pods stand for the Deployment's replicas: they exist (the labels are what is tested) but are never
scheduled. The testbed runs no kube-controller-manager, so no EndpointSlices are computed: the Service is
created from the overlay and its selector is checked by listing the Pods it selects, which is what the
EndpointSlice controller does (ready Pods only, and both replicas are ready in a cluster).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client

from kubecell.cli.scheduler import own_pod
from kubecell.cli.service import run
from kubecell.kube.apply import apply
from kubecell.kube.leader import LeaseConfig
from kubecell.kube.leader_label import LABEL, SELECTOR, VALUE, LeaderLabel, PodRef
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from tests.scheduler.deploy_support import DEPLOY, NAMESPACE, rendered
from tests.support import wait_for

APP = {"app.kubernetes.io/name": "kubecell-scheduler"}
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"


class Severable(Kube):
    """A client the test can cut off from the API server: to the API server, its replica then looks like a
    crashed process (no renewal, no cleanup), while its thread winds down."""

    severed: bool = False

    def _send(self, *args: Any, **kwargs: Any) -> Any:
        if self.severed:
            raise ApiError(0, "Unavailable", "cut off by the test")
        return super()._send(*args, **kwargs)


@pytest.fixture(scope="module")
def rbac(testbed: ControlPlaneState, kube: Kube) -> None:
    """The RBAC of deploy/base, applied: the replicas run as the shipped ServiceAccount."""
    apply(kube, rendered(testbed), kinds={"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                               "Role", "RoleBinding"})


@pytest.fixture
def lease(kube: Kube, namespace: str) -> Iterator[LeaseConfig]:
    """A Lease of the test's own, with short durations."""
    config = LeaseConfig(name=f"label-{namespace}", lease_duration=4.0, renew_deadline=3.0, retry_period=0.5)
    yield config
    with contextlib.suppress(ApiError):
        kube.delete(f"{LEASES}/{config.name}")


class Replica:
    """``service.run`` for the Pod ``pod`` (identity: the pod name) in a thread, as the ServiceAccount."""

    def __init__(self, testbed: ControlPlaneState, pod: PodRef, lease: LeaseConfig) -> None:
        self.kube = Severable(Kube.from_kubeconfig(testbed.kubeconfig("kubecell-scheduler")).api)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(pod, lease), daemon=True)
        self.thread.start()

    def _run(self, pod: PodRef, lease: LeaseConfig) -> None:
        try:
            run(self.kube, SchedulerOptions(), listen=None, leader_elect=True, identity=pod.name, lease=lease,
                stop=self.stop, pod=pod)
        except BaseException as error:  # surfaced by the test
            self.error = error

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=20)
        assert not self.thread.is_alive(), "the replica did not stop within 20 s"
        self.kube.close()


@pytest.fixture
def replicas(testbed: ControlPlaneState, rbac: None) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        if replica.thread.is_alive():
            replica.close()


def make_replica_pod(kube: Kube, namespace: str, name: str, labels: dict[str, str] | None = None) -> PodRef:
    """A Pod standing for a replica of the Deployment; its schedulerName is nobody's, so it stays Pending."""
    kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {**APP, **(labels or {})}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "scheduler", "image": "kubecell"}]}})
    return PodRef(namespace, name)


def labelled(kube: Kube, namespace: str, selector: str = SELECTOR) -> set[str]:
    return {pod["metadata"]["name"]
            for pod in kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)["items"]}


def extender_service(testbed: ControlPlaneState) -> dict[str, Any]:
    """The Service kubecell-extender as the extender overlay renders it, checked against the URL of the
    sample kube-scheduler configuration the overlay ships."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered(testbed, DEPLOY / "extender")}
    service = objects["Service", "kubecell-extender"]
    config = yaml.safe_load(objects["ConfigMap", "kube-scheduler-extender-config"]["data"]
                            ["kube-scheduler-config.yaml"])
    url = urlsplit(config["extenders"][0]["urlPrefix"])
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port in {port["port"] for port in service["spec"]["ports"]}
    assert service["spec"]["selector"] == {**APP, LABEL: VALUE}
    env = objects["Deployment", "kubecell-scheduler"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {e["name"]: e.get("valueFrom") for e in env}["POD_NAMESPACE"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    return service


def test_only_the_leader_pod_is_labelled_and_a_graceful_stop_hands_the_label_over(
        testbed: ControlPlaneState, kube: Kube, namespace: str, lease: LeaseConfig,
        replicas: list[Replica]) -> None:
    service = extender_service(testbed)
    service["metadata"]["namespace"] = namespace
    kube.create(f"/api/v1/namespaces/{namespace}/services", service)
    selector = ",".join(f"{key}={value}" for key, value in service["spec"]["selector"].items())
    first, second = (make_replica_pod(kube, namespace, name) for name in ("replica-a", "replica-b"))
    replicas.append(Replica(testbed, first, lease))
    wait_for("the leader's label", lambda: labelled(kube, namespace) == {"replica-a"})
    replicas.append(Replica(testbed, second, lease))
    time.sleep(4 * lease.retry_period)
    assert labelled(kube, namespace) == {"replica-a"}, "a standby must not carry the label"
    assert labelled(kube, namespace, selector) == {"replica-a"}, "the extender Service selects the leader alone"
    replicas[0].close()  # graceful: takes its label off, releases the Lease
    assert replicas[0].error is None
    wait_for("the new leader's label", lambda: labelled(kube, namespace) == {"replica-b"}, timeout=20)
    assert labelled(kube, namespace, selector) == {"replica-b"}
    assert kube.get(f"{LEASES}/{lease.name}")["spec"]["holderIdentity"] == "replica-b"


def test_the_next_leader_takes_the_label_off_a_crashed_leader(
        testbed: ControlPlaneState, kube: Kube, namespace: str, lease: LeaseConfig,
        replicas: list[Replica]) -> None:
    first, second = (make_replica_pod(kube, namespace, name) for name in ("replica-a", "replica-b"))
    crashing = Replica(testbed, first, lease)
    replicas.append(crashing)
    wait_for("the leader's label", lambda: labelled(kube, namespace) == {"replica-a"})
    crashing.kube.severed = True  # no renewal, and no cleanup reaches the API server
    crashing.thread.join(timeout=20)
    assert not crashing.thread.is_alive(), "a replica that cannot renew its Lease must stop"
    assert isinstance(crashing.error, SystemExit)  # "lost the leader lease": the process exits, nothing else
    assert labelled(kube, namespace) == {"replica-a"}, "the crashed leader's label stays behind"
    replicas.append(Replica(testbed, second, lease))
    wait_for("the next leader to take the stale label off and label its own Pod",
             lambda: labelled(kube, namespace) == {"replica-b"}, timeout=20)


def test_the_leader_repairs_labels_edited_by_hand(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                  lease: LeaseConfig, replicas: list[Replica]) -> None:
    leader = make_replica_pod(kube, namespace, "replica-a")
    make_replica_pod(kube, namespace, "replica-b", {LABEL: VALUE})  # e.g. restarted in a Pod that once led
    replicas.append(Replica(testbed, leader, lease))
    wait_for("the leader's label alone", lambda: labelled(kube, namespace) == {"replica-a"})
    pods = f"/api/v1/namespaces/{namespace}/pods"
    kube.patch(f"{pods}/replica-a", {"metadata": {"labels": {LABEL: None}}})
    kube.patch(f"{pods}/replica-b", {"metadata": {"labels": {LABEL: VALUE}}})
    wait_for("the labels repaired within a resync (the lease duration)",
             lambda: labelled(kube, namespace) == {"replica-a"}, timeout=3 * lease.lease_duration)


def test_an_unreachable_api_server_is_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    kube = Severable(client.ApiClient())
    kube.severed = True
    label = LeaderLabel(kube, PodRef("kubecell-system", "replica-a"))
    assert label.mark() is False
    assert label.unmark() is False
    assert "cut off by the test" in caplog.text


def test_the_pod_is_known_from_the_downward_api_only(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    assert own_pod("", "kubecell-system", fallback=missing) is None  # outside a pod: nothing is labelled
    assert own_pod("replica-a", "kubecell-system", fallback=missing) == PodRef("kubecell-system", "replica-a")
    assert own_pod("replica-a", "", fallback=missing) is None
    service_account = tmp_path / "namespace"
    service_account.write_text("team-a\n")
    assert own_pod("replica-a", "", fallback=service_account) == PodRef("team-a", "replica-a")
