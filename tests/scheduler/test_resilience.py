"""The API server restarts under load: watches drop, requests fail, and nothing is lost or doubled."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState, restart_server
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.test_crash import records_everywhere
from tests.scheduler.test_scheduler import make_pod
from tests.support import wait_for

PODS = 24


def keep_creating(kube: Kube, namespace: str, stop: threading.Event, made: list[str]) -> Callable[[], None]:
    """Create share pods one after another, retrying each through the outage (bounded: PODS pods, 60 s)."""

    def run() -> None:
        for i in range(PODS):
            for _ in range(300):
                if stop.is_set():
                    return
                try:
                    make_pod(kube, namespace, f"load-{i}", {"kubecell.io/gpu-milli": "300"})
                    made.append(f"load-{i}")
                    break
                except ApiError as error:
                    if error.conflict:  # created before the connection dropped
                        made.append(f"load-{i}")
                        break
                    stop.wait(0.2)
            stop.wait(0.05)

    return run


def test_an_api_server_restart_under_load_loses_nothing(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    running = start_scheduler(testbed)
    stop, made = threading.Event(), list[str]()
    creator = threading.Thread(target=keep_creating(kube, namespace, stop, made), daemon=True)
    creator.start()
    wait_for("some pods to exist", lambda: len(made) >= 6)
    restart_server(testbed, "kube-apiserver", down_seconds=2.0)
    creator.join(timeout=90)
    stop.set()
    assert len(made) == PODS

    def all_bound() -> list[dict[str, Any]] | None:
        pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        return pods if len(pods) == PODS and all(p["spec"].get("nodeName") for p in pods) else None

    wait_for("every pod to be bound after the restart", all_bound, timeout=90)
    assert all(milli <= 1000 for milli in records_everywhere(kube).values())
    assert running.thread.is_alive(), "the scheduler must ride out the restart"
    engine = running.scheduler.engine
    assert engine is not None
    engine.check_invariants()
