"""The ElasticJob controller as deployed: two replicas under the shipped RBAC elect one leader through the Lease
``kubecell-elastic-controller``; only the leader acts, its port says so (/readyz, /metrics), and the standby
takes over when the leader stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubecell.cli.elastic_controller import LEASE, run_controller
from kubecell.elastic.controller import ControllerOptions, ElasticController
from kubecell.kube.clock import rfc3339_micro
from kubecell.kube.leader import LeaseConfig
from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.processes import free_port
from tests.elastic.support import DEPLOY, STEP, create_job, phase_is, scale, workers
from tests.scheduler.deploy_support import NAMESPACE, ensure_namespace, kubectl, service_account_kubeconfig
from tests.support import http_get, wait_for

FAST_LEASE = LeaseConfig(namespace=NAMESPACE, name=LEASE, lease_duration=4.0, renew_deadline=3.0, retry_period=0.5)


class Replica:
    """``kubecell elastic-controller`` in a thread, as the Deployment's Pod runs it (its own port, the Lease)."""

    def __init__(self, kubeconfig: Path, namespace: str, identity: str) -> None:
        self.kube = Kube.from_kubeconfig(kubeconfig)
        self.stop = threading.Event()
        self.port = free_port()
        self.controller: ElasticController | None = None
        self.error: BaseException | None = None
        serving = threading.Event()

        def told(controller: ElasticController, url: str | None) -> None:
            self.controller = controller
            serving.set()

        def run() -> None:
            try:
                run_controller(self.kube, ControllerOptions(namespace=namespace, resync_seconds=1.0),
                               listen=("127.0.0.1", self.port), leader_elect=True, identity=identity,
                               lease=FAST_LEASE, stop=self.stop, serving=told)
            except BaseException as error:  # surfaced by the test
                self.error = error
                serving.set()

        self.thread = threading.Thread(target=run, name=f"elastic-{identity}", daemon=True)
        self.thread.start()
        assert serving.wait(STEP), "the controller's port did not open"
        assert self.error is None, self.error

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.port, path)

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the replica's /metrics (0 when absent)."""
        status, text = self.get("/metrics")
        assert status == 200, text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=15)
        self.kube.close()


@pytest.fixture
def service_account(testbed: ControlPlaneState, kube: Kube, elastic_crd: None, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of the controller's ServiceAccount, under deploy/elastic's RBAC as shipped."""
    ensure_namespace(kube)
    kubectl(testbed, "apply", "-f", str(DEPLOY / "rbac.yaml"))
    try:
        yield service_account_kubeconfig(testbed, kube, tmp_path / "sa.kubeconfig", "kubecell-elastic-controller")
    finally:
        kubectl(testbed, "delete", "-f", str(DEPLOY / "rbac.yaml"), "--ignore-not-found")


def test_two_replicas_one_acts_and_the_standby_takes_over(kube: Kube, namespace: str, service_account: Path) -> None:
    first = Replica(service_account, namespace, "elastic-a")
    second: Replica | None = None
    try:
        wait_for("the first replica to lead", lambda: first.get("/readyz")[0] == 200, STEP)
        second = Replica(service_account, namespace, "elastic-b")
        time.sleep(2 * FAST_LEASE.retry_period)
        assert second.get("/readyz")[0] == 503, "a standby is alive but not ready"
        assert second.get("/healthz") == (200, "ok")
        assert (first.metric("kubecell_elastic_leader"), second.metric("kubecell_elastic_leader")) == (1.0, 0.0)
        lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}")
        assert lease["spec"]["holderIdentity"] == "elastic-a"

        create_job(kube, namespace, "led", minReplicas=1, maxReplicas=3, replicas=2)
        wait_for("two Ready workers", partial(phase_is, kube, namespace, "led", "Running", 2), STEP)
        wait_for("the scrape to show the job", lambda: first.metric(
            "kubecell_elastic_job_ready_replicas", namespace=namespace, elasticjob="led") == 2, STEP)
        assert first.metric("kubecell_elastic_jobs", phase="Running") == 1
        assert first.metric("kubecell_elastic_pod_writes_total", verb="create", outcome="ok") >= 3, \
            "two workers and the rendezvous host"
        assert first.metric("kubecell_elastic_reconciles_total", outcome="ok") >= 1
        assert second.metric("kubecell_elastic_pod_writes_total", verb="create", outcome="ok") == 0
        assert second.metric("kubecell_elastic_reconciles_total", outcome="ok") == 0, "the standby never acts"

        first.close()  # graceful: the Lease is released at once
        wait_for("the standby to take over", lambda: second is not None and second.get("/readyz")[0] == 200, 20)
        scale(kube, namespace, "led", 3)
        wait_for("the new leader to grow the job", partial(phase_is, kube, namespace, "led", "Running", 3), STEP)
        assert sorted(workers(kube, namespace, "led")) == [0, 1, 2]
        assert second.metric("kubecell_elastic_pod_writes_total", verb="create", outcome="ok") >= 1
        assert first.error is None
        assert second.error is None
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_replica_that_loses_the_lease_stops_acting_and_exits(kube: Kube, namespace: str,
                                                               service_account: Path) -> None:
    replica = Replica(service_account, namespace, "elastic-c")
    try:
        wait_for("the replica to lead", lambda: replica.get("/readyz")[0] == 200, STEP)
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
        lease = kube.get(path)
        lease["spec"].update(holderIdentity="intruder", renewTime=rfc3339_micro(), leaseDurationSeconds=600)
        kube.replace(path, lease)  # another replica's renewal, as the replica sees it: it cannot renew
        wait_for("the replica to stop", lambda: not replica.thread.is_alive(), 4 * FAST_LEASE.renew_deadline)
        assert isinstance(replica.error, SystemExit), "a lost Lease ends the process, whose Pod restarts"
        assert replica.controller is not None
        assert replica.controller.stop.is_set()
        create_job(kube, namespace, "unled", minReplicas=1, maxReplicas=2, replicas=1)
        time.sleep(2.0)
        assert workers(kube, namespace, "unled") == {}, "no replica leads: nobody acts"
    finally:
        replica.close()
        kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}")
