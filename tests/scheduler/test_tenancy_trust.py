"""Tenants' guarantees against what nodes report and operators do, on the real testbed: a node's inventory
never claims more GPUs than the node advertises, nodes lost under accepted VirtualClusters make their cells
doomed instead of taking every tenant's guarantee away, and a deleted VirtualCluster's running work keeps
running as opportunistic work."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from functools import partial

import pytest

from kubecell.core.engine.job import JobClass
from kubecell.core.model import make_node
from kubecell.kube import virtualclusters as vcs
from kubecell.kube.accepted import CONFIGMAP
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.kubelet import register_nodes
from kubecell.testbed.nodes import node_manifest
from tests.cluster_fixtures import RunningScheduler
from tests.kube.test_virtualclusters import accepted, put
from tests.scheduler.trust_support import create_pod, pod
from tests.support import wait_for


def bound_node(kube: Kube, namespace: str, name: str) -> str:
    return str(pod(kube, namespace, name)["spec"].get("nodeName") or "")


def test_deleting_a_vc_demotes_its_running_work_and_evicts_nothing(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None,
        start_scheduler: type[RunningScheduler]) -> None:
    put(kube, "a", gpus=16)
    put(kube, "b", gpus=16)
    running = start_scheduler(testbed)
    wait_for("a accepted", partial(accepted, kube, "a"))
    for i in range(2):
        create_pod(kube, namespace, f"a-{i}", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "a"})
    wait_for("a's pods to run", lambda: all(bound_node(kube, namespace, f"a-{i}") for i in range(2)))
    kube.delete(f"{vcs.PATH}/a")

    def demoted() -> bool:
        engine = running.scheduler.engine
        return engine is not None and "a" not in engine.tenants.names and all(
            job.job_class == JobClass.OPPORTUNISTIC for job in engine.running.values() if job.vc == "a")

    wait_for("a's jobs to run as opportunistic work", demoted)
    time.sleep(8)  # long enough for several cycles and the starvation backstop's first look
    for i in range(2):
        current = pod(kube, namespace, f"a-{i}")
        assert current["spec"].get("nodeName")
        assert not current["metadata"].get("deletionTimestamp"), f"a-{i} was evicted although nobody needs its GPUs"
        record = json.loads(current["metadata"]["annotations"]["kubecell.io/allocation"])
        assert record["vc"] == "a"
    engine = running.scheduler.engine
    assert engine is not None
    engine.check_invariants()
    create_pod(kube, namespace, "b-0", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "b"})
    wait_for("b's pod to run", lambda: bound_node(kube, namespace, "b-0"))
    kube.delete(f"{vcs.PATH}/b")  # the last one: the whole-cluster default takes over
    wait_for("the whole-cluster default", lambda: (running.scheduler.engine is not None
                                                   and running.scheduler.engine.tenants.names == ["default"]))
    time.sleep(8)
    for name in ("a-0", "a-1", "b-0"):
        current = pod(kube, namespace, name)
        assert current["spec"].get("nodeName"), name
        assert not current["metadata"].get("deletionTimestamp"), f"{name} evicted by the fallback to the default"


@pytest.fixture
def system_namespace(kube: Kube) -> Iterator[str]:
    """kubecell's own namespace, as an installed cluster has it (the accepted cluster is kept there); the
    snapshot the test leaves behind is removed."""
    with contextlib.suppress(ApiError):
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": "kubecell-system"}})
    yield "kubecell-system"
    with contextlib.suppress(ApiError):
        kube.delete(f"/api/v1/namespaces/kubecell-system/configmaps/{CONFIGMAP}")


def a100_node(name: str) -> dict[str, object]:
    """An 8 x A100 node of the test's own (its chain, A100x8, exists nowhere else on the testbed)."""
    return node_manifest(make_node(name, cpu_milli=64_000, memory_mib=524_288, gpu_count=8, gpu_model="A100",
                                   nvlink_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]))


def test_losing_a_node_dooms_its_cells_and_keeps_every_guarantee(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, system_namespace: str,
        start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 8: a change of the cluster's shape made the VirtualClusters infeasible, and the scheduler fell
    back to the whole-cluster default: every tenant lost its guarantee. Now the set stays in force, and what the
    lost node held is doomed (HiveD's bad-hardware rule), also across a restart."""
    first, second = a100_node("a100-keep"), a100_node("a100-lost")
    register_nodes(kube, [first, second])
    try:
        put(kube, "vision", cells={"A100x8/node": 2})
        put(kube, "speech", cells={"P40x8/node": 2})
        running = start_scheduler(testbed)
        for name in ("vision", "speech"):
            wait_for(f"{name} accepted", partial(accepted, kube, name))
        kube.delete("/api/v1/nodes/a100-lost")

        def doomed(scheduler: RunningScheduler) -> float | None:
            engine = scheduler.scheduler.engine
            if engine is None or sorted(engine.tenants.names) != ["speech", "vision"]:
                return None
            return engine.queries.status()["vision"]["doomed_gpus"]

        wait_for("vision's lost node doomed", lambda: doomed(running) == 8)
        engine = running.scheduler.engine
        assert engine is not None
        assert engine.queries.status()["speech"]["doomed_gpus"] == 0, "a tenant that lost nothing keeps its guarantee"
        condition = vcs.current_condition(kube.get(f"{vcs.PATH}/vision")) or {}
        assert condition.get("status") == "True", condition
        assert "a100-lost" in condition.get("message", ""), condition
        create_pod(kube, namespace, "speech-0", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "speech"})
        create_pod(kube, namespace, "vision-0", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "vision"})
        wait_for("both tenants' pods placed", lambda: bound_node(kube, namespace, "speech-0")
                 and bound_node(kube, namespace, "vision-0"))
        assert bound_node(kube, namespace, "vision-0") == "a100-keep"
        running.close()
        snapshot = kube.get(f"/api/v1/namespaces/{system_namespace}/configmaps/{CONFIGMAP}")
        assert "a100-lost" in snapshot["data"]["nodes.json"]
        restarted = start_scheduler(testbed)  # nothing in memory: the API holds the cluster as accepted
        assert doomed(restarted) == 8
        register_nodes(kube, [second])  # the hardware is back: nothing doomed any more
        wait_for("the node back in the guarantee", lambda: doomed(restarted) == 0)
    finally:
        for name in ("a100-keep", "a100-lost"):
            with contextlib.suppress(ApiError):
                kube.delete(f"/api/v1/nodes/{name}")


def test_a_changed_set_must_fit_the_real_cluster(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None,
        start_scheduler: type[RunningScheduler]) -> None:
    """Ghosts keep what was accepted; they never let an operator's new guarantee count on hardware that is gone."""
    register_nodes(kube, [a100_node("a100-one"), a100_node("a100-two")])
    try:
        put(kube, "vision", cells={"A100x8/node": 1})
        running = start_scheduler(testbed)
        wait_for("vision accepted", partial(accepted, kube, "vision"))
        kube.delete("/api/v1/nodes/a100-two")
        wait_for("the node gone from the engine", lambda: running.scheduler.engine is not None and
                 "a100-two" not in running.scheduler.engine.book.index)
        put(kube, "vision", cells={"A100x8/node": 2})  # fits only with the lost node
        refused = wait_for("the new spec refused", lambda: accepted(kube, "vision", "False"))
        assert (vcs.current_condition(refused) or {}).get("reason") in ("Infeasible", "InvalidGuarantee")
    finally:
        for name in ("a100-one", "a100-two"):
            with contextlib.suppress(ApiError):
                kube.delete(f"/api/v1/nodes/{name}")


def test_an_inventory_never_claims_more_gpus_than_the_node_advertises(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, system_namespace: str,
        start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 8: one node reporting 16 GPUs where its capacity says 8 changed the cluster's shape (an A100x16
    chain), the VirtualClusters became infeasible and every tenant lost its guarantee to the default."""
    manifest = a100_node("a100-boast")
    register_nodes(kube, [manifest])
    try:
        put(kube, "vision", cells={"A100x8/node": 1})
        running = start_scheduler(testbed)
        wait_for("vision accepted", partial(accepted, kube, "vision"))
        inventory = json.loads(manifest["metadata"]["annotations"]["kubecell.io/gpu-inventory"])  # type: ignore[index]
        extra = [dict(gpu, index=gpu["index"] + 8, uuid=gpu["uuid"] + "-x") for gpu in inventory["gpus"]]
        inventory["gpus"] += extra
        kube.patch("/api/v1/nodes/a100-boast",
                   {"metadata": {"annotations": {"kubecell.io/gpu-inventory": json.dumps(inventory)}}})

        def told() -> list[str]:
            events = kube.get("/api/v1/namespaces/default/events")["items"]
            return [e["message"] for e in events if e["involvedObject"].get("kind") == "Node"
                    and e["involvedObject"]["name"] == "a100-boast" and e["reason"] == "InventoryBeyondCapacity"]

        (message,) = wait_for("a Warning Event on the node", told)
        assert "16" in message
        assert "8" in message
        engine = running.scheduler.engine
        assert engine is not None
        assert engine.book.nodes[engine.book.index["a100-boast"]].gpu_count == 8
        assert sorted(engine.tenants.names) == ["vision"], "the tenants in force must not fall back to the default"
        assert accepted(kube, "vision") is not None
        create_pod(kube, namespace, "vision-0", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "vision"})
        wait_for("vision's pod on its node", lambda: bound_node(kube, namespace, "vision-0") == "a100-boast")
    finally:
        with contextlib.suppress(ApiError):
            kube.delete("/api/v1/nodes/a100-boast")
