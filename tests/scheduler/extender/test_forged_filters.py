"""A filter request from whoever reaches the extender's port, naming a real pod by its uid, narrows where that pod
may go only to nodes kubecell places on, never to none, and kube-scheduler's next filter lifts what it set.

Before (found by a hostile review), one filter naming a pod's uid with ``NodeNames: ["no-such-node"]`` limited the
pod's next decision to that node, and the limit lived until the pod was deleted: the pod waited for good while
every real filter asked with every node. Without a cluster: a scheduler over ``OfflineKube`` with synthetic nodes,
the real HTTP routes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from kubecell.kube.offline import OfflineKube
from kubecell.kube.rest import Kube
from kubecell.kube.watch import Event
from kubecell.scheduler.extender.holds import Holds
from kubecell.scheduler.extender.http import routes
from kubecell.scheduler.extender.verbs import Extender
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed.nodes import node_manifest, synthetic_cluster
from tests.support import wait_for


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "annotations": {},
                         "creationTimestamp": "2026-01-01T00:00:00Z", "resourceVersion": "1"},
            "spec": {"schedulerName": "kubecell",
                     "containers": [{"name": "c", "resources": {"limits": {"kubecell.io/gpu": str(gpus)}}}]},
            "status": {"phase": "Pending"}}


@pytest.fixture
def extender() -> Iterator[tuple[Scheduler, TestClient, list[str]]]:
    scheduler = Scheduler(cast(Kube, OfflineKube()), SchedulerOptions(extender=True))
    manifests = [node_manifest(node) for node in synthetic_cluster(2)]
    scheduler.events.put(Event("nodes", "SYNC", objects=tuple(manifests)))
    thread = threading.Thread(target=scheduler.loop, daemon=True)
    thread.start()
    try:
        assert scheduler.ready.wait(30)
        yield scheduler, TestClient(Starlette(routes=routes(Extender(scheduler)))), [m["metadata"]["name"]
                                                                                    for m in manifests]
    finally:
        scheduler.shutdown()
        thread.join(5)


def limit_of(scheduler: Scheduler, uid: str) -> frozenset[str] | None:
    """The nodes the extender's holds limit pod ``uid``'s next decision to."""
    holds = scheduler.binder.sink
    assert isinstance(holds, Holds)
    return holds.nodes_for(uid)


def ask(http: TestClient, pod: dict[str, Any], nodes: list[str]) -> list[str]:
    return list(http.post("/extender/filter", json={"Pod": pod, "NodeNames": nodes}).json()["NodeNames"] or [])


def test_a_filter_naming_no_node_kubecell_knows_limits_nothing(extender: tuple[Scheduler, TestClient, list[str]]
                                                              ) -> None:
    scheduler, http, nodes = extender
    victim = gpu_pod("victim", 1)
    scheduler.events.put(Event("pods", "ADDED", victim))
    first = wait_for("the pod placed", lambda: ask(http, victim, nodes))
    forged = {**victim, "metadata": {**victim["metadata"], "name": "x", "namespace": "attacker"}}
    assert ask(http, forged, ["no-such-node"]) == []
    assert limit_of(scheduler, "uid-victim") is None
    assert ask(http, victim, nodes) == first


def test_kube_schedulers_next_filter_lifts_a_limit_someone_else_set(
        extender: tuple[Scheduler, TestClient, list[str]]) -> None:
    """A forged filter names only the node that is full: the pod waits there; kube-scheduler's next filter, with
    every node, places it on the other."""
    scheduler, http, nodes = extender
    filler = gpu_pod("filler", 8)
    scheduler.events.put(Event("pods", "ADDED", filler))
    (full,) = wait_for("the filler placed", lambda: ask(http, filler, nodes))
    free = next(node for node in nodes if node != full)
    victim = gpu_pod("victim", 4)
    scheduler.events.put(Event("pods", "ADDED", victim))
    assert wait_for("the victim placed", lambda: ask(http, victim, nodes)) == [free]
    assert ask(http, victim, [full]) == []  # someone narrows it to the full node: its decision is given back
    time.sleep(0.3)
    assert wait_for("the victim placed again", lambda: ask(http, victim, nodes)) == [free]
    assert limit_of(scheduler, "uid-victim") == frozenset(nodes)
