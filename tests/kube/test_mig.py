"""MIG instances as the unit the scheduler places: how a node's MIG layout is read, which layouts are
placed and why the others are not, which nodes a pod in each isolation mode may use, and what a pod must
ask to get an instance."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from kubecell.kube.dialects import DemandError, pod_demand
from kubecell.kube.inventory import NodeView, node_view
from kubecell.kube.mig import is_mig_model, mig_model
from kubecell.kube.names import ANNOTATION_INVENTORY
from kubecell.kube.records import parse_record
from kubecell.node.fake_nvml import FakeNvml, example_path
from kubecell.node.inventory import advertised_isolation, build_inventory
from kubecell.node.xid import HealthTracker
from kubecell.scheduler.intake import isolation_nodes
from kubecell.scheduler.observe.inspect import build_report
from kubecell.scheduler.restore_members import held_indices
from kubecell.scheduler.tracking import Tracking


def k8s_node(name: str, description: str | None = None, *, yaml_text: str | None = None,
             configured: tuple[str, ...] = ("accounting",), unhealthy: int | None = None) -> dict[str, Any]:
    """A Node whose annotation is what the agent would publish for a fake-NVML description."""
    backend = FakeNvml.from_text(yaml_text) if yaml_text is not None else FakeNvml.from_file(
        example_path(description or ""))
    devices = backend.devices()
    health = HealthTracker()
    inventory = build_inventory(devices, health).model_copy(
        update={"isolation": advertised_isolation(configured, devices), "device_plugin": True})  # type: ignore[arg-type]
    data = json.loads(inventory.to_annotation())
    if unhealthy is not None:
        data["gpus"][unhealthy]["healthy"] = False
    return {"metadata": {"name": name, "labels": {}, "annotations": {ANNOTATION_INVENTORY: json.dumps(data)}},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


A100_7G = """
gpus: [{product: NVIDIA A100-SXM4-40GB, count: 2}]
mig:
  - {gpu: 0, instances: [{profile: 7g.40gb}]}
  - {gpu: 1, instances: [{profile: 7g.40gb}]}
"""


def test_a_node_of_one_profile_offers_its_instances_as_its_gpus() -> None:
    view = node_view(k8s_node("m1", "a100-mig-1g", unhealthy=1))
    assert view.node is not None
    assert view.isolation == ("mig",)
    assert not view.gpu_note
    assert len(view.node.gpus) == 14
    assert {gpu.model for gpu in view.node.gpus} == {"MIG-1g.5gb"}
    assert {gpu.memory_mib for gpu in view.node.gpus} == {5120}
    assert all(uuid.startswith("MIG-") for uuid in view.uuids)
    assert len(set(view.uuids)) == 14
    assert [gpu.healthy for gpu in view.node.gpus] == [True] * 7 + [False] * 7  # GPU 1's instances
    assert view.node.numa_groups == (tuple(range(7)), tuple(range(7, 14)))
    assert view.serial_binds
    whole = node_view(k8s_node("m2", yaml_text=A100_7G))
    assert whole.node is not None
    assert [gpu.model for gpu in whole.node.gpus] == ["MIG-7g.40gb"] * 2


@pytest.mark.parametrize(("description", "yaml_text", "note"), [
    ("a100-mig", None, "GPU(s) 0 are in MIG mode and GPU(s) 1 are not"),
    (None, "gpus: [{product: NVIDIA A100-SXM4-40GB, count: 1}]\n"
           "mig: [{gpu: 0, instances: [{profile: 3g.20gb}, {profile: 1g.5gb}]}]",
     "several profiles (1g.5gb, 3g.20gb)"),
    (None, "gpus: [{product: NVIDIA A100-SXM4-40GB, count: 1}]\nmig: [{gpu: 0, instances: []}]",
     "without MIG instances"),
    (None, "gpus: [{product: NVIDIA A100-SXM4-40GB, count: 10}]\nmig: ["
           + ", ".join(f"{{gpu: {i}, instances: [{', '.join(['{profile: 1g.5gb}'] * 7)}]}}" for i in range(10)) + "]",
     "70 MIG instances are more than the 64"),
], ids=["some GPUs in MIG mode", "mixed profiles", "no instances", "more instances than a node may hold"])
def test_a_layout_the_core_cannot_place_keeps_the_node_for_cpu_work_and_says_why(
        description: str | None, yaml_text: str | None, note: str) -> None:
    view = node_view(k8s_node("m1", description, yaml_text=yaml_text))
    assert view.node is not None
    assert view.node.gpus == ()
    assert note in view.gpu_note
    assert view.node.cpu_milli == 64_000


def _same_uuid_twice(data: dict[str, Any]) -> None:
    data["gpus"][1]["migInstances"][0]["uuid"] = data["gpus"][0]["migInstances"][0]["uuid"]


def _agent_without_mig(data: dict[str, Any]) -> None:
    del data["isolation"]  # an agent that predates MIG advertises accounting only


@pytest.mark.parametrize(("edit", "note"), [(_same_uuid_twice, "UUID twice"),
                                            (_agent_without_mig, "does not give mig isolation")],
                         ids=["an instance named twice", "an agent that does not give mig"])
def test_an_inventory_that_cannot_be_trusted_with_mig_is_not_placed(edit: Any, note: str) -> None:
    node = k8s_node("m1", "a100-mig-1g")
    data = json.loads(node["metadata"]["annotations"][ANNOTATION_INVENTORY])
    edit(data)
    node["metadata"]["annotations"][ANNOTATION_INVENTORY] = json.dumps(data)
    view = node_view(node)
    assert view.node is not None
    assert view.node.gpus == ()
    assert note in view.gpu_note


def test_a_node_without_mig_mode_never_claims_mig() -> None:
    devices = FakeNvml.from_file(example_path("a100-nvlink")).devices()
    assert advertised_isolation(["accounting", "mps", "mig"], devices) == ["accounting", "mps"]
    assert advertised_isolation(["accounting", "mps"], FakeNvml.from_file(example_path("a100-mig")).devices()) == [
        "mig"]
    data = {"gpus": [{"index": 0, "uuid": "GPU-0", "model": "A100", "memoryMiB": 40536}],
            "isolation": ["accounting", "mig"]}
    node = k8s_node("x", "a100-nvlink")
    node["metadata"]["annotations"][ANNOTATION_INVENTORY] = json.dumps(data)
    assert node_view(node).isolation == ("accounting",)


def views() -> dict[str, NodeView]:
    nodes = {"mig": k8s_node("mig", "a100-mig-1g"), "mixed": k8s_node("mixed", "a100-mig"),
             "plain": k8s_node("plain", "a100-nvlink", configured=("accounting", "mps")),
             "cpu": k8s_node("cpu", "a100-nvlink")}
    del nodes["cpu"]["metadata"]["annotations"][ANNOTATION_INVENTORY]  # no agent, no GFD labels: no GPUs
    return {name: node_view(obj) for name, obj in nodes.items()}


def test_each_isolation_mode_is_placed_only_where_a_node_gives_it() -> None:
    seen = views()
    able, why = isolation_nodes(seen, "mig")
    assert able == {"mig", "cpu"}  # a node without GPUs is left to the engine, which says it has none
    assert "1 node(s) cannot isolate by mig" in why
    assert "1 node(s) have GPUs kubecell cannot place (GPU(s) 0 are in MIG mode" in why
    able, why = isolation_nodes(seen, "accounting")
    assert able == {"plain", "cpu"}
    assert "1 node(s) give GPUs only as MIG instances (kubecell.io/isolation: mig)" in why
    assert isolation_nodes({"plain": seen["plain"]}, "accounting") == (None, "")


def pod(limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": annotations or {}},
            "spec": {"schedulerName": "kubecell",
                     "containers": [{"name": "main", "resources": {"limits": limits}}]}}


def test_a_pod_asks_for_an_instance_by_profile_or_by_isolation() -> None:
    by_profile = pod_demand(pod({"kubecell.io/gpu": "1"}, {"kubecell.io/gpu-models": "MIG-3g.20gb"}))
    assert by_profile.isolation == "mig"
    assert by_profile.request.gpu_models == {"MIG-3g.20gb"}
    assert by_profile.request.is_whole
    assert by_profile.request.gpu_count == 1
    any_instance = pod_demand(pod({"kubecell.io/gpu": "1"}, {"kubecell.io/isolation": "mig"}))
    assert any_instance.isolation == "mig"
    assert any_instance.request.gpu_models is None
    assert pod_demand(pod({"kubecell.io/gpu": "1"})).isolation == "accounting"
    assert is_mig_model(mig_model("1g.5gb+me"))
    assert is_mig_model("MIG-1c.3g.20gb")
    assert not is_mig_model("A100")


@pytest.mark.parametrize(("limits", "annotations", "told"), [
    ({"kubecell.io/gpu-milli": "300"}, {"kubecell.io/isolation": "mig"}, "places one whole MIG instance"),
    ({"kubecell.io/gpu": "2"}, {"kubecell.io/isolation": "mig"}, "asks for 2 GPUs"),
    ({"kubecell.io/gpu": "1"}, {"kubecell.io/isolation": "mig", "kubecell.io/gpu-models": "A100,MIG-1g.5gb"},
     "allows A100"),
    ({"kubecell.io/gpu": "1"}, {"kubecell.io/isolation": "mps", "kubecell.io/gpu-models": "MIG-1g.5gb"},
     "asks for mps on MIG instances"),
], ids=["a share", "two instances", "a full GPU model", "another mode"])
def test_what_mig_cannot_give_is_refused_with_the_reason(limits: dict[str, str], annotations: dict[str, str],
                                                         told: str) -> None:
    with pytest.raises(DemandError, match=told):
        pod_demand(pod(limits, annotations))


def test_inspect_shows_instances_and_says_why_a_layout_is_not_placed() -> None:
    mig, mixed = k8s_node("mig", "a100-mig-1g"), k8s_node("mixed", "a100-mig")
    report = build_report([mig, mixed], [])
    by_name = {node.name: node for node in report.nodes}
    assert [g.model for g in by_name["mig"].gpus] == ["MIG-1g.5gb"] * 14
    assert not by_name["mig"].excluded
    assert by_name["mixed"].gpus == []
    assert by_name["mixed"].excluded.startswith("GPUs not placed: GPU(s) 0 are in MIG mode")


def test_a_restored_record_holds_its_instance_by_uuid_even_when_indices_moved() -> None:
    view = node_view(k8s_node("mig", "a100-mig-1g"))
    moved = NodeView(view.name, view.node, uuids=tuple(reversed(view.uuids)), source="inventory",
                     isolation=view.isolation)
    state = Tracking(cast(Any, None), {"mig": moved})
    granted: dict[str, Any] = {
               "schema": "kubecell.io/allocation/v1", "allocationId": "u-0", "podUID": "u", "attempt": 0,
               "node": "mig", "gpus": [{"index": 2, "uuid": view.uuids[2], "milli": 1000, "memoryMiB": 5120}],
               "cpuMilli": 0, "memoryMiB": 0, "isolation": "mig", "job": "j", "vc": "default", "class": "guaranteed",
               "member": 0, "batch": 1, "scheduler": "t", "createdAt": "2026-11-23T00:00:00Z"}
    assert held_indices(state, parse_record(json.dumps(granted), pod="ns/p")) == (11,)
    granted["gpus"][0]["uuid"] = "MIG-gone"  # an instance the node no longer reports: the recorded index
    assert held_indices(state, parse_record(json.dumps(granted), pod="ns/p")) == (2,)
