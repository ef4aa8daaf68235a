"""The ``kubecell inspect`` report, from hand-made Node and Pod objects: what each GPU holds, bad records
listed not trusted, ended pods freeing their share, pending reasons, VC usage by class, other schedulers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kubecell.core.engine.job import JobClass
from kubecell.core.model import Allocation, Request, make_node
from kubecell.kube.accepted import AcceptedVc
from kubecell.kube.inventory import inventory_of, node_view
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import record_for
from kubecell.scheduler.observe.inspect import OTHER, build_report
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
    """A pod bound by kubecell on ``node`` with its allocation record; the pod asks for what the record holds (a
    record that does not describe its own pod is not believed: ``kubecell.kube.trust``)."""
    view = node_view(node_manifest(node))
    request = Request(f"team-a/{name}", gpu_count=len(gpus), gpu_milli=milli, gpu_memory_mib=memory)
    record = record_for(Allocation(request, node.name, gpus, milli, memory), view, pod=f"team-a/{name}",
                        pod_uid=f"uid-{name}", attempt=0, job=f"team-a/{name}@uid-{name}"[:len(f"team-a/{name}") + 9],
                        vc=vc, job_class=job_class, member=0, scheduler="kubecell/test", created_at=WHEN,
                        isolation=isolation)  # type: ignore[arg-type]
    if milli == 1000:
        limits = {"kubecell.io/gpu": str(len(gpus))}
    else:
        limits = {"kubecell.io/gpu-milli": str(milli), **({"kubecell.io/gpu-memory": str(memory)} if memory else {})}
    annotations = {ANNOTATION_ALLOCATION: record.to_annotation(), **({"kubecell.io/vc": vc} if vc != "default" else {}),
                   **({"kubecell.io/isolation": isolation} if isolation != "accounting" else {})}
    return pod(name, node=node.name, annotations=annotations, limits=limits, **kwargs)


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
    """Not believed, and its pod held as the scheduler holds it: as another scheduler's pod, its share of a GPU
    as a whole GPU (the most it could use), never shown free."""
    copied = recorded("orig", N1, (0,), 500)
    copied["metadata"]["uid"] = "uid-copy"
    report = build_report(NODES, [copied])
    assert "written for pod UID" in report.pods[0].error
    assert report.pods[0].vc == OTHER
    assert gpu(report, "n1", 0).milli_allocated == 0, "the GPU the record names is not the one counted"
    assert (report.nodes[0].other_gpus, report.nodes[0].milli_allocated) == (1, 1000)


def test_a_record_naming_another_node_is_counted_where_the_pod_runs() -> None:
    moved = recorded("moved", N1, (0, 1), 1000)
    moved["spec"]["nodeName"] = "n2"
    report = build_report(NODES, [moved])
    assert "runs on n2" in report.pods[0].error
    n1, n2 = report.nodes
    assert n1.milli_allocated == 0
    assert (n2.other_gpus, n2.milli_allocated) == (2, 2000)


def test_a_record_of_a_deleted_vc_counts_as_opportunistic() -> None:
    orphan = recorded("orphan", N1, (0,), 1000, vc="gone")
    tenants = {"data": {"tenants.yaml": "virtualClusters:\n  a: {gpus: 4, chain: A100x4}\n"}}
    report = build_report(NODES, [orphan], tenants)
    assert report.pods[0].job_class == "opportunistic"
    (gone,) = [vc for vc in report.vcs if vc.name == "gone"]
    assert gone.in_use_milli["opportunistic"] == 1000


def test_a_terminating_pod_holds_its_gpus_until_it_is_gone() -> None:
    leaving = recorded("leaving", N1, (0,), 500, deletionTimestamp="2026-11-23T12:00:00Z")
    report = build_report(NODES, [leaving])
    assert gpu(report, "n1", 0).milli_allocated == 500


@pytest.mark.parametrize("ended", [{"phase": "Succeeded"}, {"phase": "Failed"},
                                   {"phase": "Failed", "deletionTimestamp": "2026-11-23T12:00:00Z"}])
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


def sick_node() -> tuple[dict[str, Any], dict[str, Any]]:
    """Node n3 whose inventory has GPU 1 unhealthy, and that inventory."""
    sick = make_node("n3", cpu_milli=8000, memory_mib=64_000, gpu_count=2, gpu_model="A100")
    obj = node_manifest(sick)
    inventory = json.loads(obj["metadata"]["annotations"]["kubecell.io/gpu-inventory"])
    inventory["gpus"][1]["healthy"] = False
    obj["metadata"]["annotations"]["kubecell.io/gpu-inventory"] = json.dumps(inventory)
    return obj, inventory


def test_an_unhealthy_gpu_is_reported_unhealthy() -> None:
    obj, _ = sick_node()
    report = build_report([obj], [])
    assert [g.healthy for g in report.nodes[0].gpus] == [True, False]
    assert [g.fault for g in report.nodes[0].gpus] == ["", ""]


def test_a_faulted_gpu_is_shown_with_the_xid_the_node_agent_recorded() -> None:
    obj, inventory = sick_node()
    uuid = inventory["gpus"][1]["uuid"]
    obj["metadata"]["annotations"]["kubecell.io/gpu-faults"] = json.dumps(
        {uuid: {"xid": 79, "at": "2026-12-03T13:00:00Z"}, "GPU-gone": {"xid": 48, "at": "2026-12-01T00:00:00Z"}})
    report = build_report([obj], [])
    fault = "XID 79 (GPU has fallen off the bus) at 2026-12-03T13:00:00Z"
    assert [g.fault for g in report.nodes[0].gpus] == ["", fault]
    assert report.to_data()["nodes"][0]["gpus"][1]["fault"] == fault
    assert f"unhealthy: {fault}" in rendered(report, per_gpu=True)

    obj["metadata"]["annotations"]["kubecell.io/gpu-faults"] = "[" * 10_000   # a record nobody can read
    report = build_report([obj], [])
    assert [g.fault for g in report.nodes[0].gpus] == ["", ""]
    assert any("n3: annotation kubecell.io/gpu-faults" in warning for warning in report.warnings)


# ------------------------------------------------------------------ the tenant source, in the scheduler's order
def virtualcluster(name: str, generation: int = 1, accepted: str | None = None, observed: int | None = None,
                   **spec: Any) -> dict[str, Any]:
    """A VirtualCluster object; ``accepted``: the status of the scheduler's Accepted condition, written for
    generation ``observed`` (default: the object's)."""
    obj: dict[str, Any] = {"apiVersion": "kubecell.io/v1alpha1", "kind": "VirtualCluster",
                           "metadata": {"name": name, "generation": generation, "uid": f"uid-{name}"}, "spec": spec}
    if accepted is not None:
        obj["status"] = {"conditions": [{"type": "Accepted", "status": accepted,
                                             "observedGeneration": observed or generation}]}
    return obj


CONFIGMAP = {"data": {"tenants.yaml": "virtualClusters:\n  from-configmap: {pinnedCells: [n2]}\n"}}


@pytest.mark.parametrize(("objects", "configmap", "kind", "summary", "vcs", "warned"), [
    # accepted VirtualClusters win over the ConfigMap
    ([virtualcluster("vision", gpus=4, chain="A100x4"), virtualcluster("speech", gpus=2, chain="V100M32x2")],
     CONFIGMAP,
     "virtualclusters", "2 VirtualClusters (accepted)", {"speech": 2, "vision": 4}, ""),
    # judged as the scheduler judges them, whatever their conditions say yet (the scheduler may lag)
    ([virtualcluster("vision", 2, accepted="False", gpus=4, chain="A100x4")], None,
     "virtualclusters", "1 VirtualCluster (accepted)", {"vision": 4}, ""),
    # a refused set: its still-accepted part is the scheduler's last accepted set minus what changed
    ([virtualcluster("vision", accepted="True", gpus=4, chain="A100x4"),
      virtualcluster("speech", 2, accepted="False", gpus=99, chain="A100x4")],
     CONFIGMAP, "virtualclusters", "1 of 2 VirtualClusters (set refused; the accepted ones stay in force)",
     {"vision": 4}, "speech not in force as written"),
    # a refused set none of whose objects is accepted: the ConfigMap, as a scheduler started now
    ([virtualcluster("vision", accepted="False", gpus=99, chain="A100x4")], CONFIGMAP,
     "configmap", "ConfigMap kubecell-system/kubecell-tenants", {"from-configmap": 2}, "None was accepted"),
    # an accepted condition of an earlier generation is not in force as written
    ([virtualcluster("vision", 3, accepted="True", observed=2, gpus=99, chain="A100x4")], None,
     "default", "whole-cluster default (VC default owns every GPU)", {"default": 6}, "VirtualClusters refused"),
    ([], CONFIGMAP, "configmap", "ConfigMap kubecell-system/kubecell-tenants", {"from-configmap": 2}, ""),
    (None, None, "default", "whole-cluster default (VC default owns every GPU)", {"default": 6}, ""),
    (None, {"data": {"tenants.yaml": "virtualClusters: [\n"}}, "default",
     "whole-cluster default (ConfigMap kubecell-system/kubecell-tenants refused)", {"default": 6},
     "a scheduler that accepted it before it restarted would keep those tenants"),
])
def test_the_tenants_come_from_the_source_the_scheduler_uses(
        objects: list[dict[str, Any]] | None, configmap: dict[str, Any] | None, kind: str, summary: str,
        vcs: dict[str, int], warned: str) -> None:
    report = build_report(NODES, [], configmap, virtualcluster_objs=objects)
    assert (report.tenants.kind, report.tenants.summary) == (kind, summary)
    assert {vc.name: vc.guaranteed_gpus for vc in report.vcs} == vcs
    assert report.to_data()["tenantSource"] == {"kind": kind, "summary": summary}
    if warned:
        assert len(report.warnings) == 1
        assert warned in report.warnings[0]
    else:
        assert report.warnings == []


def test_accepted_virtualclusters_that_lost_a_node_are_shown_with_its_cells_doomed() -> None:
    """As the scheduler keeps them (``kubecell.kube.accepted``): judged on the cluster as accepted, with a warning,
    never dropped for the whole-cluster default."""
    spare = make_node("n3", cpu_milli=64_000, memory_mib=512_000, gpu_count=4, gpu_model="A100")
    objects = [virtualcluster("vision", accepted="True", cells={"A100x4/node": 2})]
    accepted = [node_view(node_manifest(node)).node for node in (N1, N2, spare)]  # as the scheduler read them
    report = build_report(NODES, [], virtualcluster_objs=objects, accepted_nodes=[n for n in accepted if n])
    assert (report.tenants.kind, report.tenants.summary) == ("virtualclusters",
                                                             "1 VirtualCluster (accepted; lost nodes doomed)")
    assert {vc.name: vc.guaranteed_gpus for vc in report.vcs} == {"vision": 8}
    (warning,) = report.warnings
    assert "lost 1 node(s)" in warning
    assert "n3" in warning
    fallback = build_report(NODES, [], virtualcluster_objs=objects)  # no snapshot: as a scheduler started now
    assert fallback.tenants.kind == "default"


def test_a_refused_virtualcluster_is_named_with_the_reason_the_scheduler_gives() -> None:
    objects = [virtualcluster("vision", accepted="True", gpus=4, chain="A100x4"),
               virtualcluster("speech", 2, accepted="False", cells={"H100x8/node": 1})]
    (warning,) = build_report(NODES, [], virtualcluster_objs=objects).warnings
    assert "speech: VirtualCluster speech: spec.cells.H100x8/node" in warning


def test_a_refused_edit_is_shown_with_the_older_guarantee_the_scheduler_keeps() -> None:
    """The scheduler keeps the older spec of a VC whose edit was refused, recorded in ``kubecell-accepted-cluster``
    (``virtualclusters.json``); inspect reads it as a restarted scheduler does. Before, it showed only the VCs
    accepted as they are: speech lost its guarantee in the report while the scheduler kept it in force."""
    vision = virtualcluster("vision", accepted="True", gpus=4, chain="A100x4")
    speech = virtualcluster("speech", accepted="True", gpus=2, chain="V100M32x2")
    edited = virtualcluster("speech", 2, accepted="False", gpus=99, chain="V100M32x2")
    kept = [AcceptedVc.of(vision), AcceptedVc.of(speech)]
    blind = build_report(NODES, [], virtualcluster_objs=[vision, edited])
    assert {vc.name: vc.guaranteed_gpus for vc in blind.vcs} == {"vision": 4}
    report = build_report(NODES, [], virtualcluster_objs=[vision, edited], accepted_virtualclusters=kept)
    assert {vc.name: vc.guaranteed_gpus for vc in report.vcs} == {"speech": 2, "vision": 4}
    (warning,) = report.warnings
    assert "speech (as accepted at generation 1)" in warning


def test_a_refused_edit_of_the_tenants_configmap_is_shown_with_the_text_the_scheduler_keeps() -> None:
    """The scheduler keeps the tenants ConfigMap text last accepted (``tenants.json`` of the same ConfigMap) while an
    edit of it is refused; inspect shows those tenants, not the whole-cluster default."""
    broken = {"data": {"tenants.yaml": "virtualClusters: [\n"}}
    text = CONFIGMAP["data"]["tenants.yaml"]
    blind = build_report(NODES, [], broken)
    assert blind.tenants.kind == "default"
    report = build_report(NODES, [], broken, accepted_tenants_text=text)
    assert report.tenants.kind == "configmap"
    assert {vc.name: vc.guaranteed_gpus for vc in report.vcs} == {"from-configmap": 2}


# ------------------------------------------------------------------ the compact view: a row per node
@pytest.mark.parametrize(("milli", "healthy", "glyph"), [
    (0, True, "·"), (1, True, "▁"), (125, True, "▁"), (250, True, "▂"), (500, True, "▄"), (750, True, "▆"),
    (990, True, "▇"), (1000, True, "█"), (0, False, "✗"), (1000, False, "✗"),
])
def test_a_gpu_is_one_mark_any_share_visible_only_a_full_gpu_full(milli: int, healthy: bool, glyph: str) -> None:
    from kubecell.cli.inspect import gpu_glyph
    from kubecell.scheduler.observe.inspect import GpuReport

    assert gpu_glyph(GpuReport(0, "", "A100", healthy, 40_960, milli_allocated=milli)).plain == glyph


def rendered(report: Any, **options: bool) -> str:
    from io import StringIO

    from rich.console import Console

    from kubecell.cli.inspect import print_table

    out = StringIO()
    print_table(Console(file=out, width=160, color_system=None), report, details=options.get("details", False),
                per_gpu=options.get("per_gpu", False))
    return out.getvalue()


def test_the_default_view_is_a_row_per_node_with_a_mark_per_gpu() -> None:
    n3 = make_node("n3", cpu_milli=64_000, memory_mib=512_000, gpu_count=8, gpu_model="P40")
    cordoned = node_manifest(N2)
    cordoned["spec"]["unschedulable"] = True
    pods = [recorded("a", N1, (1,), 500, 8192), recorded("b", N1, (1,), 250, 4096), recorded("w", N1, (2, 3), 1000),
            recorded("q", n3, (0, 1, 2, 3, 4), 1000), recorded("t", n3, (6,), 100),
            pod("theirs", node="n3", scheduler="default-scheduler", limits={"nvidia.com/gpu": "1"})]
    report = build_report([NODES[0], cordoned, node_manifest(n3)], pods)
    text = rendered(report)
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in text.splitlines() if line.startswith("│")}
    assert rows["n1"] == ["A100", "ok", "·▆██", "2.75/4", f"{(12288 + 2 * A100_MIB) / 1024:.1f}/"
                          f"{4 * A100_MIB / 1024:.1f}", "3"]
    assert rows["n2"][1:4] == ["cordoned (spec.unschedulable)", "··", "0/2"]
    assert rows["n3"][2:4] == ["████ █·▁· +1 other", "6.1/8"]              # groups of 4; other's GPU counted
    assert rows["n3"][5] == "3"
    assert "Allocated/total in cluster: 8.85/14 GPUs (63%)" in text
    assert "Tenants in force: whole-cluster default (VC default owns every GPU)" in text
    assert "Virtual clusters (GPUs)" in text
    assert "team-a/a" not in text                                             # pods only with -d or -g
    per_gpu = rendered(report, per_gpu=True)
    assert "750/1000" in per_gpu
    assert "team-a/a, team-a/b" in per_gpu
    assert "team-a/w" in rendered(report, details=True)
    assert json.loads(json.dumps(report.to_data()))["nodes"][2]["gpus"][6]["milliAllocated"] == 100   # JSON: every GPU


def test_unhealthy_gpus_and_exclusion_share_the_health_column() -> None:
    obj, _ = sick_node()
    obj["spec"]["unschedulable"] = True
    text = rendered(build_report([obj], []))
    assert "cordoned (spec.unschedulable); 1 unhealthy" in text
    assert "·✗" in text


def test_a_pod_whose_owner_edited_its_vc_shows_as_opportunistic_and_never_doubles_a_gpu() -> None:
    """As a restarted scheduler counts them (``kube.trust.forfeited``): a running pod whose ``kubecell.io/vc`` was
    edited is opportunistic work alone, in its record's VC, on its record's GPUs; one whose record names GPUs that
    another pod's believed record holds (a copied placement, no admission policy) is another scheduler's pod, never
    a second holder of those GPUs."""
    edited = recorded("edited", N1, (0,), 1000, vc="team-a", job_class=JobClass.BORROWED)
    edited["metadata"]["annotations"]["kubecell.io/vc"] = "team-b"
    kept = recorded("kept", N1, (1,), 1000)
    copied = recorded("a-copy", N1, (1,), 1000)  # sorted before "kept": the believed record counts first all the same
    copied["metadata"]["annotations"]["kubecell.io/vc"] = "team-c"
    report = build_report(NODES, [edited, kept, copied])
    rows = {p.pod: p for p in report.pods}
    assert (rows["team-a/edited"].job_class, rows["team-a/edited"].vc, rows["team-a/edited"].gpus) == (
        "opportunistic", "team-a", (0,))
    assert (rows["team-a/kept"].job_class, rows["team-a/kept"].gpus) == ("guaranteed", (1,))
    assert rows["team-a/a-copy"].vc == OTHER
    assert "another pod's record holds" in rows["team-a/a-copy"].error
    assert gpu(report, "n1", 1).pods == ["team-a/kept"]
    assert gpu(report, "n1", 1).milli_allocated == 1000
