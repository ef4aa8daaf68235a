"""The scheduler as deployed: the shipped RBAC is enough (and RBAC is on), health and metrics answer,
and of two replicas exactly one schedules, the other taking over when it stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from kubecell.cli.service import answering, run
from kubecell.kube.apply import apply
from kubecell.kube.leader import LeaderElector, LeaseConfig
from kubecell.kube.rest import Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.processes import free_port
from tests.scheduler.deploy_support import rendered
from tests.scheduler.test_scheduler import bound, make_pod
from tests.support import http_get, wait_for

FAST_LEASE = LeaseConfig(lease_duration=4.0, renew_deadline=3.0, retry_period=0.5)


@pytest.fixture(scope="module")
def rbac(testbed: ControlPlaneState, kube: Kube) -> None:
    """The RBAC objects of the kustomize base deploy/base, as an operator would apply them (not the Deployment)."""
    apply(kube, rendered(testbed), kinds={"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                               "Role", "RoleBinding"})


class Replica:
    def __init__(self, testbed: ControlPlaneState, identity: str, *, listen: bool = False) -> None:
        self.kube = Kube.from_kubeconfig(testbed.kubeconfig("kubecell-scheduler"))
        self.stop = threading.Event()
        self.port = free_port() if listen else None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(identity,), daemon=True)
        self.thread.start()

    def _run(self, identity: str) -> None:
        try:
            run(self.kube, SchedulerOptions(), listen=("127.0.0.1", self.port) if self.port else None,
                leader_elect=True, identity=identity, lease=FAST_LEASE, stop=self.stop)
        except BaseException as error:  # surfaced by the test
            self.error = error

    def get(self, path: str) -> tuple[int, str]:
        assert self.port is not None
        return http_get(self.port, path)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=15)
        self.kube.close()


@pytest.fixture
def replicas(testbed: ControlPlaneState, rbac: None) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.close()


def test_the_shipped_rbac_is_all_the_scheduler_needs(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                      replicas: list[Replica]) -> None:
    replicas.append(Replica(testbed, "only", listen=True))
    replica = replicas[0]
    wait_for("/readyz", lambda: replica.get("/readyz")[0] == 200)
    gang = {"kubecell.io/group": "pair", "kubecell.io/group-size": "2"}
    for i in range(2):
        make_pod(kube, namespace, f"pair-{i}", {"nvidia.com/gpu": "2"}, gang)
    make_pod(kube, namespace, "bad", {"kubecell.io/gpu-milli": "0"})
    wait_for("the gang to be bound by the least-privileged scheduler", lambda: bound(kube, namespace,
                                                                                      "pair-0", "pair-1"))
    events = wait_for("the bad pod's Warning Event", lambda: [
        e for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        if e["involvedObject"]["name"] == "bad"])
    assert events[0]["type"] == "Warning"
    assert replica.get("/healthz") == (200, "ok")
    status, text = replica.get("/metrics")
    assert status == 200
    assert "kubecell_leader 1.0" in text
    assert "kubecell_scheduling_cycles" in text
    assert replica.error is None


def test_two_replicas_one_leader_and_a_takeover(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                replicas: list[Replica]) -> None:
    first = Replica(testbed, "replica-a", listen=True)
    replicas.append(first)
    wait_for("the first replica to lead", lambda: first.get("/readyz")[0] == 200)
    second = Replica(testbed, "replica-b", listen=True)
    replicas.append(second)
    time.sleep(2 * FAST_LEASE.retry_period)
    assert second.get("/readyz")[0] == 503, "a standby must not be ready while another replica leads"
    lease = kube.get("/apis/coordination.k8s.io/v1/namespaces/kubecell-system/leases/kubecell-scheduler")
    assert lease["spec"]["holderIdentity"] == "replica-a"
    first.close()  # graceful: releases the lease
    wait_for("the standby to take over", lambda: second.get("/readyz")[0] == 200, timeout=20)
    make_pod(kube, namespace, "after-takeover", {"kubecell.io/gpu-milli": "300"})
    wait_for("the new leader to schedule", lambda: bound(kube, namespace, "after-takeover"))


def test_racing_for_an_expired_lease_only_one_wins(testbed: ControlPlaneState, rbac: None) -> None:
    clients = [Kube.from_kubeconfig(testbed.kubeconfig("kubecell-scheduler")) for _ in range(4)]
    config = LeaseConfig(name="race-test", lease_duration=2.0)
    electors = [LeaderElector(client, f"racer-{i}", config) for i, client in enumerate(clients)]
    wins: list[bool] = []
    barrier = threading.Barrier(len(electors))

    def attempt(elector: LeaderElector) -> None:
        barrier.wait()
        wins.append(elector.try_acquire_or_renew())

    threads = [threading.Thread(target=attempt, args=(e,)) for e in electors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wins.count(True) == 1
    for client in clients:
        client.close()


def test_the_extender_answers_only_while_this_replica_leads() -> None:
    """kube-scheduler calls whichever replica its Service reaches: one that lost the Lease (its loop's ``ready``
    still set) must answer 503, not filter or bind on a book the new leader no longer shares."""
    ready, leading = threading.Event(), threading.Event()
    answers = answering(ready, leading)
    assert not answers(), "no cycle yet"
    ready.set()
    assert not answers(), "a standby"
    leading.set()
    assert answers()
    leading.clear()
    assert not answers(), "the Lease lost"
    assert answering(ready, None)(), "without election, ready is enough"
