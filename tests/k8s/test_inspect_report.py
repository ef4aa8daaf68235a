"""The ``kubecell inspect`` report, from hand-made Node and Pod objects: what each GPU holds, bad records
listed not trusted, ended pods freeing their share, pending reasons, VC usage by class, other schedulers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kubecell.core.engine.job import JobClass
from kubecell.core.model import Allocation, Request, make_node
from kubecell.k8s.inspect import OTHER, build_report
from kubecell.k8s.inventory import inventory_of, node_view
from kubecell.k8s.names import ANNOTATION_ALLOCATION
from kubecell.k8s.records import record_for
from kubecell.testbed.nodes import node_manifest

WHEN = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
N1 = make_node("n1", cpu_milli=64_000, memory_mib=512_000, gpu_count=4, gpu_model="A100")
N2 = make_node("n2", cpu_milli=64_000, memory_mib=512_000, gpu_count=2, gpu_model="V100M32")
NODES = [node_manifest(N1), node_manifest(N2)]
A100_MIB = N1.gpus[0].memory_mib


def pod(name: str, *, node: str = "", limits: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        scheduler: str = "kubecell", phase: str = "Running", conditions: list[dict[str, str]] | None = None,
        namespace: str = "team-a", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": annotations or {},
                         **meta},
            "spec": {"schedulerName": scheduler, "nodeName": node or None,
                     "containers": [{"name": "main", "resources": {"limits": limits or {}}}]},
            "status": {"phase": phase if node else "Pending", "conditions": conditions or []}}


def recorded(name: str, node: Any, gpus: tuple[int, ...], milli: int, memory: int = 0, *, vc: str = "default",
             job_class: JobClass = JobClass.GUARANTEED, isolation: str = "accounting", **kwargs: Any) -> dict[str, Any]:
    """A pod bound by kubecell on ``node`` with its allocation record."""
    view = node_view(node_manifest(node))
    request = Request(f"team-a/{name}", gpu_count=len(gpus), gpu_milli=milli, gpu_memory_mib=memory)
    record = record_for(Allocation(request, node.name, gpus, milli, memory), view, pod=f"team-a/{name}",
                        pod_uid=f"uid-{name}", attempt=0, job=f"team-a/{name}", vc=vc, job_class=job_class, member=0,
                        scheduler="kubecell/test", created_at=WHEN, isolation=isolation)  # type: ignore[arg-type]
    return pod(name, node=node.name, annotations={ANNOTATION_ALLOCATION: record.to_annotation()}, **kwargs)


def gpu(report: Any, node: str, index: int) -> Any:
    return next(g for n in report.nodes if n.name == node for g in n.gpus if g.index == index)


def test_two_halves_fill_one_gpu_and_whole_gpus_hold_their_memory() -> None:
    pods = [recorded("a", N1, (1,), 500, 8192), recorded("b", N1, (1,), 500, 4096),
            recorded("w", N1, (2, 3), 1000, isolation="mps")]
    report = build_report(NODES, pods)
    assert (gpu(report, "n1", 1).milli_allocated, gpu(report, "n1", 1).memory_allocated_mib) == (1000, 12288)
    assert gpu(report, "n1", 1).pods == ["team-a/a", "team-a/b"]
    assert (gpu(report, "n1", 3).milli_allocated, gpu(report, "n1", 3).memory_allocated_mib) == (1000, A100_MIB)
    assert gpu(report, "n1", 0).milli_allocated == 0
    n1 = report.nodes[0]
    assert (n1.name, n1.models, n1.milli_allocated, n1.milli_total) == ("n1", ["A100"], 3000, 4000)
    assert n1.memory_total_mib == 4 * A100_MIB
    assert n1.memory_allocated_mib == 12288 + 2 * A100_MIB
    assert gpu(report, "n1", 0).uuid == inventory_of(N1).gpus[0].uuid
    rows = {p.pod: p for p in report.pods}
    assert (rows["team-a/w"].gpus, rows["team-a/w"].milli, rows["team-a/w"].isolation) == ((2, 3), 1000, "mps")
    assert (rows["team-a/a"].gpus, rows["team-a/a"].memory_mib) == ((1,), 8192)
    data = json.loads(json.dumps(report.to_data()))
    assert data["cluster"] == {"milliTotal": 6000, "milliAllocated": 3000,
                               "memoryTotalMiB": 4 * A100_MIB + 2 * N2.gpus[0].memory_mib,
                               "memoryAllocatedMiB": 12288 + 2 * A100_MIB}
    assert data["nodes"][0]["gpus"][1]["milliAllocated"] == 1000


@pytest.mark.parametrize(("annotation", "message"), [
    ("{not json", "is not JSON"),
    ('{"schema": "kubecell.io/allocation/v2"}', "not a version this kubecell reads"),
])
def test_a_bad_record_is_listed_with_its_error_and_counts_for_nothing(annotation: str, message: str) -> None:
    bad = pod("bad", node="n1", annotations={ANNOTATION_ALLOCATION: annotation})
    report = build_report(NODES, [bad, recorded("ok", N1, (0,), 250)])
    (row,) = [p for p in report.pods if p.pod == "team-a/bad"]
    assert message in row.error
    assert "team-a/bad" in row.error
    assert report.nodes[0].milli_allocated == 250


def test_a_record_copied_from_another_pod_is_not_trusted() -> None:
    copied = recorded("orig", N1, (0,), 500)
    copied["metadata"]["uid"] = "uid-copy"
    report = build_report(NODES, [copied])
    assert "written for pod UID" in report.pods[0].error
    assert report.nodes[0].milli_allocated == 0


@pytest.mark.parametrize("ended", [{"phase": "Succeeded"}, {"phase": "Failed"},
                                   {"deletionTimestamp": "2026-11-23T12:00:00Z"}])
def test_ended_pods_hold_nothing(ended: dict[str, Any]) -> None:
    done = recorded("done", N1, (0,), 500, phase=ended.get("phase", "Running"),
                    **({"deletionTimestamp": ended["deletionTimestamp"]} if "deletionTimestamp" in ended else {}))
    report = build_report(NODES, [done])
    assert report.pods == []
    assert report.nodes[0].milli_allocated == 0
    assert all(sum(vc.in_use_milli.values()) == 0 for vc in report.vcs)


def test_pending_pods_are_listed_with_their_reason_for_the_scheduler_asked() -> None:
    reason = "0/2 nodes fit one member: 2 insufficient GPUs"
    waiting = pod("big", limits={"kubecell.io/gpu": "64"},
                  conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                               "message": reason}])
    fresh = pod("fresh", limits={"kubecell.io/gpu-milli": "250"})
    theirs = pod("theirs", scheduler="default-scheduler", limits={"nvidia.com/gpu": "1"})
    report = build_report(NODES, [waiting, fresh, theirs])
    assert [(p.pod, p.ask, p.reason) for p in report.pending] == [
        ("team-a/big", "64 GPUs", reason), ("team-a/fresh", "250 milli", "not yet considered by the scheduler")]
    everyone = build_report(NODES, [waiting, fresh, theirs], scheduler=None)
    assert [p.pod for p in everyone.pending] == ["team-a/big", "team-a/fresh", "team-a/theirs"]


def test_vc_usage_by_class_against_the_tenant_configuration() -> None:
    tenants = {"data": {"tenants.yaml": "virtualClusters:\n  vision: {pinnedCells: [n1]}\n"
                                        "  speech: {pinnedCells: [n2]}\n"}}
    pods = [recorded("g", N1, (0, 1), 1000, vc="vision"),
            recorded("b", N2, (0,), 1000, vc="vision", job_class=JobClass.BORROWED),
            recorded("o", N2, (1,), 500, vc="speech", job_class=JobClass.OPPORTUNISTIC)]
    report = build_report(NODES, pods, tenants)
    vcs = {vc.name: vc for vc in report.vcs}
    assert (vcs["vision"].guaranteed_gpus, vcs["speech"].guaranteed_gpus) == (4, 2)
    assert vcs["vision"].in_use_milli == {"guaranteed": 2000, "borrowed": 1000, "opportunistic": 0}
    assert vcs["vision"].in_use_gpus == 3
    assert vcs["vision"].borrowed_share == pytest.approx(1 / 3)
    assert vcs["speech"].in_use_milli["opportunistic"] == 500
    assert vcs["speech"].pods == 1
    data = {v["name"]: v for v in report.to_data()["virtualClusters"]}
    assert data["vision"]["inUseGpusByClass"] == {"guaranteed": 2.0, "borrowed": 1.0, "opportunistic": 0.0}


def test_without_tenants_one_default_vc_owns_the_cluster_and_a_bad_configuration_is_a_warning() -> None:
    report = build_report(NODES, [recorded("g", N1, (0,), 1000)])
    assert [(vc.name, vc.guaranteed_gpus, vc.in_use_gpus) for vc in report.vcs] == [("default", 6, 1.0)]
    broken = build_report(NODES, [], {"data": {"tenants.yaml": "virtualClusters: {x: {pinnedCells: [nope]}}"}})
    assert [vc.name for vc in broken.vcs] == ["default"]
    assert len(broken.warnings) == 1
    assert "nope" in broken.warnings[0]


def test_gpus_of_pods_bound_by_other_schedulers_are_whole_gpus_held_by_other() -> None:
    theirs = pod("theirs", node="n2", scheduler="default-scheduler", limits={"nvidia.com/gpu": "2"})
    cpu_only = pod("web", node="n2", scheduler="default-scheduler", limits={"cpu": "1"})
    report = build_report(NODES, [theirs, cpu_only])
    n2 = report.nodes[1]
    assert (n2.other_gpus, n2.milli_allocated) == (2, 2000)
    assert [(p.pod, p.vc, p.scheduler) for p in report.pods] == [("team-a/theirs", OTHER, "default-scheduler")]
    (vc,) = [v for v in report.vcs if v.name == OTHER]
    assert vc.in_use_gpus == 2


def test_cordoned_nodes_keep_their_gpus_and_say_why_nothing_new_lands() -> None:
    cordoned = node_manifest(N2)
    cordoned["spec"]["unschedulable"] = True
    report = build_report([NODES[0], cordoned], [recorded("held", N2, (0,), 500)])
    n2 = report.nodes[1]
    assert n2.excluded == "cordoned (spec.unschedulable)"
    assert (len(n2.gpus), n2.milli_allocated, n2.models) == (2, 500, ["V100M32"])


def test_an_unhealthy_gpu_is_reported_unhealthy() -> None:
    sick = make_node("n3", cpu_milli=8000, memory_mib=64_000, gpu_count=2, gpu_model="A100")
    obj = node_manifest(sick)
    inventory = json.loads(obj["metadata"]["annotations"]["kubecell.io/gpu-inventory"])
    inventory["gpus"][1]["healthy"] = False
    obj["metadata"]["annotations"]["kubecell.io/gpu-inventory"] = json.dumps(inventory)
    report = build_report([obj], [])
    assert [g.healthy for g in report.nodes[0].gpus] == [True, False]
