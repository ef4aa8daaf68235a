"""Kubernetes semantics kube-scheduler has and kubecell must keep, tried on the real testbed: scheduling
gates (PreEnqueue), terminating pods that hold their GPUs until they are gone, a cluster cordoned out that
still tells every pod why it waits, and node changes that update the engine in place."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import pytest

from kubecell.core.model import make_node
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import TESTBED_LABEL, node_manifest
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.trust_support import create_pod, free_whole_gpus, pod, scheduled_condition, warnings_of
from tests.support import registered_node, wait_for


def bound_node(kube: Kube, namespace: str, name: str) -> str:
    return str(pod(kube, namespace, name)["spec"].get("nodeName") or "")


def test_gated_pods_hold_nothing_and_are_placed_once_ungated(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 4: gated pods used to be decided, their Binding's 409 read as "already bound", their GPUs held
    for a pod that was not bound, and they were never bound once ungated."""
    running = start_scheduler(testbed)
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "philly-050"}}
    for i in range(3):
        create_pod(kube, namespace, f"gated-{i}", {"nvidia.com/gpu": "8"},
                   spec={**pinned, "schedulingGates": [{"name": "example.com/admission"}]})
    create_pod(kube, namespace, "free", {"nvidia.com/gpu": "8"}, spec=pinned)
    wait_for("the ungated pod to take the node", lambda: bound_node(kube, namespace, "free") == "philly-050")
    assert all(not bound_node(kube, namespace, f"gated-{i}") for i in range(3))
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/free", gracePeriodSeconds=0)
    wait_for("the node to be free again", lambda: free_whole_gpus(running.scheduler, "philly-050") == 8)
    condition = scheduled_condition(kube, namespace, "gated-0")
    assert condition is not None
    assert condition["reason"] == "SchedulingGated", condition
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/gated-1", {"spec": {"schedulingGates": None}})
    wait_for("the ungated pod to be bound", lambda: bound_node(kube, namespace, "gated-1") == "philly-050")
    assert not bound_node(kube, namespace, "gated-0")
    assert not bound_node(kube, namespace, "gated-2")


def test_a_gang_waits_for_its_gated_member(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    gang = {"kubecell.io/group": "g", "kubecell.io/group-size": "2"}
    create_pod(kube, namespace, "g-0", {"nvidia.com/gpu": "1"}, annotations=gang)
    create_pod(kube, namespace, "g-1", {"nvidia.com/gpu": "1"}, annotations=gang,
               spec={"schedulingGates": [{"name": "example.com/quota"}]})
    wait_for("the member to be told it waits", lambda: warnings_of(kube, namespace, "g-0")
             or (scheduled_condition(kube, namespace, "g-0") or {}).get("reason") == "GangIncomplete")
    assert not bound_node(kube, namespace, "g-0")
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/g-1", {"spec": {"schedulingGates": None}})
    wait_for("the whole gang to be bound", lambda: bound_node(kube, namespace, "g-0") and bound_node(kube, namespace,
                                                                                                    "g-1"))


@contextlib.contextmanager
def unattended_node(kube: Kube, name: str, gpus: int) -> Iterator[str]:
    """A GPU node no kubelet serves (the testbed's fake kubelet only serves nodes labelled as its own): a pod
    deleted gracefully there stays terminating until the test force-deletes it, as on a node whose kubelet
    runs a long SIGTERM checkpoint."""
    manifest = node_manifest(make_node(name, cpu_milli=32_000, memory_mib=131_072, gpu_count=gpus, gpu_model="V100M32"))
    del manifest["metadata"]["labels"][TESTBED_LABEL]
    with registered_node(kube, manifest) as registered:
        yield registered


def test_a_terminating_pod_keeps_its_gpus_until_it_is_gone(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 9: a terminating pod's GPUs used to go to a new pod at once, so work checkpointing on SIGTERM
    collided with its successor."""
    with unattended_node(kube, "term-node", 2) as node:
        running = start_scheduler(testbed)
        pinned = {"nodeSelector": {"kubernetes.io/hostname": node}}
        create_pod(kube, namespace, "old", {"nvidia.com/gpu": "2"}, spec=pinned)
        wait_for("the first pod to be bound", lambda: bound_node(kube, namespace, "old") == node)
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/old")  # graceful: it terminates, nobody finishes it
        wait_for("the pod to be terminating", lambda: pod(kube, namespace, "old")["metadata"].get("deletionTimestamp"))
        create_pod(kube, namespace, "new", {"nvidia.com/gpu": "2"}, spec=pinned)
        wait_for("the successor to be told it waits", lambda: warnings_of(kube, namespace, "new"))
        assert not bound_node(kube, namespace, "new")
        assert free_whole_gpus(running.scheduler, node) == 0
        running.close()
        restarted = start_scheduler(testbed)  # a restart counts the terminating pod too
        assert free_whole_gpus(restarted.scheduler, node) == 0
        assert not bound_node(kube, namespace, "new")
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/old", gracePeriodSeconds=0)
        wait_for("the successor to be bound once the old pod is gone", lambda: bound_node(kube, namespace, "new"))
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/new", gracePeriodSeconds=0)


def test_release_terminating_frees_the_gpus_at_deletion(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    from kubecell.scheduler.options import SchedulerOptions

    with unattended_node(kube, "term-node-2", 1) as node:
        start_scheduler(testbed, SchedulerOptions(release_terminating=True))
        pinned = {"nodeSelector": {"kubernetes.io/hostname": node}}
        create_pod(kube, namespace, "old", {"nvidia.com/gpu": "1"}, spec=pinned)
        wait_for("the first pod to be bound", lambda: bound_node(kube, namespace, "old") == node)
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/old")
        create_pod(kube, namespace, "new", {"nvidia.com/gpu": "1"}, spec=pinned)
        wait_for("the successor to be bound at once", lambda: bound_node(kube, namespace, "new") == node)
        for name in ("old", "new"):
            kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds=0)


@pytest.fixture
def cordon_all(kube: Kube) -> Iterator[list[str]]:
    """Every node cordoned for the test, and uncordoned after it whatever happens."""
    names = [n["metadata"]["name"] for n in kube.get("/api/v1/nodes")["items"]]
    try:
        for name in names:
            kube.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}})
        yield names
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                kube.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": None}})


def test_a_cordoned_out_cluster_still_tells_every_pod_why(
        testbed: ControlPlaneState, kube: Kube, namespace: str, cordon_all: list[str],
        start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 7: with every node cordoned no cycle ran, so no pod got a condition or an Event."""
    start_scheduler(testbed)
    create_pod(kube, namespace, "waits", {"nvidia.com/gpu": "1"})
    create_pod(kube, namespace, "cpu-only", {"cpu": "1"})
    for name in ("waits", "cpu-only"):
        condition = wait_for(f"{name} to be told", partial(scheduled_condition, kube, namespace, name))
        assert condition["status"] == "False"
        assert f"{len(cordon_all)} node(s) were unschedulable" in condition["message"], condition["message"]


def test_cordoning_updates_the_engine_in_place(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Cordon, label and taint changes close or open nodes and re-judge waiting pods without a new engine: a
    rebuild per cordon re-reads every pod and record of the cluster."""
    running = start_scheduler(testbed)
    state = running.scheduler.state
    assert state is not None
    engine = state.engine
    index = engine.book.index["philly-049"]
    create_pod(kube, namespace, "there", {"nvidia.com/gpu": "8"},
               spec={"nodeSelector": {"kubernetes.io/hostname": "philly-049"}})
    wait_for("the pod to be bound", lambda: bound_node(kube, namespace, "there") == "philly-049")
    try:
        kube.patch("/api/v1/nodes/philly-049", {"spec": {"unschedulable": True}})
        wait_for("the node to be closed", lambda: not engine.book.node_open[index])
        assert running.scheduler.state is state, "a cordon must not rebuild the engine"
        assert any(job.name.startswith(f"{namespace}/there@") for job in engine.running.values()), \
            "the pod on the cordoned node keeps running and counted"
        create_pod(kube, namespace, "blocked", {"nvidia.com/gpu": "1"},
                   spec={"nodeSelector": {"kubernetes.io/hostname": "philly-049"}})
        condition = wait_for("the pod to be told", lambda: scheduled_condition(kube, namespace, "blocked"))
        assert "were unschedulable" in condition["message"]
        kube.patch("/api/v1/nodes/philly-049", {"metadata": {"labels": {"example.com/pool": "a"}},
                                                "spec": {"unschedulable": None}})
        wait_for("the node to be open", lambda: engine.book.node_open[index])
        assert running.scheduler.state is state
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/there", gracePeriodSeconds=0)
        wait_for("the waiting pod to be bound", lambda: bound_node(kube, namespace, "blocked") == "philly-049")
    finally:
        kube.patch("/api/v1/nodes/philly-049", {"metadata": {"labels": {"example.com/pool": None}},
                                                "spec": {"unschedulable": None}})


def test_a_node_tainted_while_a_pod_waits_is_judged_again(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """The other direction of an in-place change: a waiting pod that could only go to one node must not be
    placed there once the node is tainted against it."""
    running = start_scheduler(testbed)
    state = running.scheduler.state
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "philly-048"}}
    create_pod(kube, namespace, "hog", {"nvidia.com/gpu": "8"}, spec=pinned)
    wait_for("the node to be taken", lambda: bound_node(kube, namespace, "hog") == "philly-048")
    create_pod(kube, namespace, "next", {"nvidia.com/gpu": "8"}, spec=pinned)
    wait_for("the next pod to wait", lambda: warnings_of(kube, namespace, "next"))
    taint = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    try:
        kube.patch("/api/v1/nodes/philly-048", {"spec": {"taints": [taint]}})
        wait_for("the waiting pod to be told of the taint", lambda: "example.com/maintenance" in (
            scheduled_condition(kube, namespace, "next") or {}).get("message", ""))
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/hog", gracePeriodSeconds=0)
        wait_for("the engine to see the node free", lambda: free_whole_gpus(running.scheduler, "philly-048") == 8)
        assert not bound_node(kube, namespace, "next"), "placed on a node whose taint it does not tolerate"
        assert running.scheduler.state is state
    finally:
        kube.patch("/api/v1/nodes/philly-048", {"spec": {"taints": None}})
    wait_for("the pod to be bound once the taint is gone", lambda: bound_node(kube, namespace, "next"))
