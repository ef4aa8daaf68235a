"""Elastic gangs on the real testbed: a threshold gang that grew to its headcount is shrunk, not evicted, when a
guarantee needs its GPUs. Exactly the pods of the members it grew last are evicted (with the engine's reason),
the others keep running with their records, and a restarted scheduler rebuilds the gang as it now runs."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from kubecell.core.model import make_node
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from tests.cluster_fixtures import RunningScheduler
from tests.kube.test_virtualclusters import accepted, put
from tests.scheduler.trust_support import create_pod, pod
from tests.support import registered_node, wait_for

NODE = "a100-elastic"


def gone_or_leaving(kube: Kube, namespace: str, name: str) -> bool:
    try:
        return bool(pod(kube, namespace, name)["metadata"].get("deletionTimestamp"))
    except ApiError as error:
        if error.not_found:
            return True
        raise


def running_on(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    found = pod(kube, namespace, name)
    live = found["spec"].get("nodeName") == NODE and not found["metadata"].get("deletionTimestamp")
    return found if live and found["status"].get("phase") == "Running" else None


def record(found: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(found["metadata"]["annotations"][ANNOTATION_ALLOCATION]))


def test_a_grown_gang_gives_its_newest_pods_to_a_guarantee_and_runs_on(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None,
        start_scheduler: type[RunningScheduler]) -> None:
    manifest = node_manifest(make_node(NODE, cpu_milli=64_000, memory_mib=524_288, gpu_count=8, gpu_model="A100",
                                       nvlink_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]))
    with registered_node(kube, manifest):
        put(kube, "vision", cells={"A100x8/node": 1})  # its one node is the A100 node: it lends it while idle
        put(kube, "speech", cells={"P40x8/node": 1})
        running = start_scheduler(testbed)
        for name in ("vision", "speech"):
            wait_for(f"{name} accepted", partial(accepted, kube, name))
        here = {"nodeSelector": {"kubernetes.io/hostname": NODE}}
        scavenging = {"kubecell.io/vc": "speech", "kubecell.io/opportunistic": "true"}
        create_pod(kube, namespace, "blocker", {"nvidia.com/gpu": "4"}, annotations=scavenging, spec=here)
        wait_for("the blocker to run (the node is served)", lambda: running_on(kube, namespace, "blocker"), 90)
        gang = {**scavenging, "kubecell.io/group": "elastic", "kubecell.io/group-size": "4",
                "kubecell.io/group-min": "2"}
        names = [f"el-{i}" for i in range(4)]
        for name in names:
            create_pod(kube, namespace, name, {"nvidia.com/gpu": "2"}, annotations=gang, spec=here)
        first = wait_for("the gang to start with its minimum", lambda: (
            [n for n in names if pod(kube, namespace, n)["spec"].get("nodeName")] or None))
        assert len(first) == 2, first
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/blocker", gracePeriodSeconds=0)
        wait_for("the gang to grow to its headcount", lambda: all(running_on(kube, namespace, n) for n in names))
        grown = [n for n in names if n not in first]
        before = {n: record(pod(kube, namespace, n)) for n in first}

        create_pod(kube, namespace, "guaranteed", {"nvidia.com/gpu": "4"},
                   annotations={"kubecell.io/vc": "vision"}, spec=here)
        wait_for("the guaranteed pod to run", lambda: running_on(kube, namespace, "guaranteed"))
        for name in grown:
            assert gone_or_leaving(kube, namespace, name), f"{name} (grown last) should have been evicted"
        for name in first:
            kept = running_on(kube, namespace, name)
            assert kept is not None, f"{name} should keep running"
            assert record(kept) == before[name], "a member that keeps running keeps its record"
        engine = running.scheduler.engine
        assert engine is not None
        (job,) = [j for j in engine.running.values() if j.name.startswith(f"{namespace}/elastic")]
        assert job.size == 2
        assert "shrunk 4 -> 2 members" in engine.queries.explain(job.name)
        assert f"reclaimed for guaranteed job {namespace}/guaranteed" in engine.queries.explain(job.name)
        assert job.preemptions == 0
        engine.check_invariants()
        tracked = running.scheduler.state.tracked[job.name] if running.scheduler.state else None
        assert tracked is not None
        assert sorted(pod(kube, namespace, n)["metadata"]["uid"] for n in first) == sorted(tracked.members.values())

        running.close()  # a restart rebuilds the shrunk gang from the records of the pods it runs on
        restarted = start_scheduler(testbed)
        rebuilt = restarted.scheduler.engine
        assert rebuilt is not None
        (again,) = [j for j in rebuilt.running.values() if j.name.startswith(f"{namespace}/elastic")]
        assert again.size == 2
        assert {rebuilt.book.allocations[m].node for m in again.running_members} == {NODE}
        assert any(j.name.startswith(f"{namespace}/guaranteed") for j in rebuilt.running.values())
        rebuilt.check_invariants()
        for name in [*first, "guaranteed"]:
            assert running_on(kube, namespace, name) is not None, f"{name} must survive the restart"
