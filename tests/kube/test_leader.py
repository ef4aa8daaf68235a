"""Leader election when the leader's own calls go wrong: it must stop leading within ``renew_deadline`` of its
last renewal, before the standby may take the Lease, whether its API server stops answering (a request that
hangs) or an attempt fails with something other than an API error. Two electors race for a Lease on the
testbed; the test samples both every 50 ms and fails the moment both lead."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import pytest
from kubernetes.config.config_exception import ConfigException

from kubecell.kube.clock import rfc3339_micro
from kubecell.kube.leader import LeaderElector, LeaseConfig
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.support import wait_for

LEASE = LeaseConfig(lease_duration=4.0, renew_deadline=3.0, retry_period=0.5)


class Faulty(Kube):
    """A client the test can break: each request then hangs (an API server that took the connection and stopped
    answering; it fails as a timeout once the test lets go), or raises what an unreadable service-account
    token raises (the official client's ``ConfigException``, not an ``ApiError``)."""

    fault: str = ""
    let_go: threading.Event

    def _send(self, *args: Any, **kwargs: Any) -> Any:
        if self.fault == "hang":
            self.let_go.wait(60)
            raise ApiError(0, "Unavailable", "read timed out (the test let go)")
        if self.fault == "token":
            raise ConfigException("Service token file does not exist.")
        return super()._send(*args, **kwargs)


@pytest.mark.parametrize("fault", ["hang", "token"])
def test_a_leader_whose_calls_fail_stops_leading_before_the_standby_takes_over(
        testbed: ControlPlaneState, namespace: str, fault: str) -> None:
    config = LeaseConfig(namespace=namespace, name=f"leader-{fault}", lease_duration=LEASE.lease_duration,
                         renew_deadline=LEASE.renew_deadline, retry_period=LEASE.retry_period)
    faulty = Faulty(Kube.from_kubeconfig(testbed.admin_kubeconfig).api)
    faulty.let_go = threading.Event()
    healthy = Kube.from_kubeconfig(testbed.admin_kubeconfig)
    first, second = LeaderElector(faulty, "replica-a", config), LeaderElector(healthy, "replica-b", config)
    stop = threading.Event()
    threads = [threading.Thread(target=e.run, args=(stop,), daemon=True) for e in (first, second)]
    try:
        threads[0].start()
        wait_for("the first replica to lead", first.leading.is_set, timeout=10)
        threads[1].start()
        time.sleep(2 * config.retry_period)
        assert not second.leading.is_set(), "a standby must not lead while the leader renews"
        faulty.fault = fault
        broken = time.monotonic()
        deadline = broken + 4 * config.lease_duration
        while time.monotonic() < deadline:
            took_over = second.leading.is_set()  # read first: the leader, once it stops, never leads again
            assert not (took_over and first.leading.is_set()), \
                f"both replicas lead {time.monotonic() - broken:.1f} s after the leader's calls began to fail"
            if took_over:
                break
            time.sleep(0.05)
        assert second.leading.is_set(), "the standby never took over"
        assert first.lost.is_set()
        assert not first.leading.is_set()
    finally:
        stop.set()
        faulty.let_go.set()
        for thread in threads:
            thread.join(timeout=10)
        healthy.close()
        faulty.close()


def test_a_leader_whose_clock_lags_an_hour_keeps_the_lease_and_a_crash_still_hands_it_over(
        testbed: ControlPlaneState, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every renewTime the leader writes is an hour old, as from a node whose clock lags: a standby that read it
    against its own wall clock took the Lease at once, and two replicas led. Counting the lease duration on the
    standby's own clock from when the record last changed, it waits while the leader renews, and takes over
    within a lease duration (and a retry) once the leader stops renewing without giving the Lease up."""
    monkeypatch.setattr("kubecell.kube.leader.rfc3339_micro",
                        lambda: rfc3339_micro(datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)))
    config = LeaseConfig(namespace=namespace, name="leader-skew", lease_duration=LEASE.lease_duration,
                         renew_deadline=LEASE.renew_deadline, retry_period=LEASE.retry_period)
    clients = [Kube.from_kubeconfig(testbed.admin_kubeconfig) for _ in range(2)]
    first, second = (LeaderElector(client, name, config)
                     for client, name in zip(clients, ("replica-a", "replica-b"), strict=True))
    stops = [threading.Event(), threading.Event()]
    threads = [threading.Thread(target=e.run, args=(s,), daemon=True)
               for e, s in zip((first, second), stops, strict=True)]
    try:
        threads[0].start()
        wait_for("the first replica to lead", first.leading.is_set, timeout=10)
        threads[1].start()
        watched_until = time.monotonic() + 2 * config.lease_duration
        while time.monotonic() < watched_until:
            assert not second.leading.is_set(), "the standby took the Lease while the leader renewed it"
            time.sleep(0.05)
        stops[0].set()  # the leader stops renewing and never releases: a crash, as the standby sees it
        threads[0].join(timeout=10)
        crashed = time.monotonic()
        wait_for("the standby to take over", second.leading.is_set,
                 timeout=config.lease_duration + 4 * config.retry_period)
        assert time.monotonic() - crashed >= config.lease_duration - config.renew_deadline
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            thread.join(timeout=10)
        for client in clients:
            client.close()
