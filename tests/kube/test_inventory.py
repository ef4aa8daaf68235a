"""Reading GPU nodes from the API: the node agent's inventory annotation, GFD labels, exclusions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import TopologyLevel, make_node
from kubecell.kube.gfd import catalog_model
from kubecell.kube.inventory import cpu_milli, inventory_of, memory_mib, node_view
from kubecell.kube.names import ANNOTATION_INVENTORY
from kubecell.testbed.nodes import load_cluster_nodes, node_manifest


def k8s_node(*, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
             allocatable: dict[str, str] | None = None, ready: bool = True,
             unschedulable: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"allocatable": allocatable or {"cpu": "32", "memory": "256Gi"},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_every_bundled_and_synthetic_node_round_trips_through_the_node_object() -> None:
    for cluster, count in (("philly", None), ("openb", 200), ("synthetic", 30)):
        for node in load_cluster_nodes(cluster, count):
            view = node_view(node_manifest(node))
            assert view.node is not None
            got = view.node
            assert (got.cpu_milli, got.memory_mib, got.rack, got.zone) == (
                node.cpu_milli, node.memory_mib, node.rack, node.zone)
            assert got.gpus == node.gpus
            assert got.groups_at(TopologyLevel.NVLINK) == node.groups_at(TopologyLevel.NVLINK)
            assert got.groups_at(TopologyLevel.NUMA) == node.groups_at(TopologyLevel.NUMA)


def test_unhealthy_gpu_stays_in_the_inventory_marked_unhealthy() -> None:
    node = make_node("n1", cpu_milli=32_000, memory_mib=262_144, gpu_count=4, gpu_model="V100M32",
                     nvlink_groups=[[0, 1], [2, 3]])
    inventory = json.loads(inventory_of(node).to_annotation())
    inventory["gpus"][2]["healthy"] = False
    view = node_view(k8s_node(annotations={ANNOTATION_INVENTORY: json.dumps(inventory)}))
    assert view.node is not None
    assert [gpu.healthy for gpu in view.node.gpus] == [True, True, False, True]
    assert view.node.nvlink_groups == ((0, 1), (2, 3))
    assert view.uuids == ("GPU-n1-0", "GPU-n1-1", "GPU-n1-2", "GPU-n1-3")


def test_gfd_labels_stand_in_when_no_agent_runs() -> None:
    view = node_view(k8s_node(labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                                      "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8"}))
    assert view.source == "gfd"
    assert view.node is not None
    assert [gpu.model for gpu in view.node.gpus] == ["A100-80G"] * 8
    assert {gpu.memory_mib for gpu in view.node.gpus} == {81920}


def test_nvidia_gpu_capacity_alone_gives_whole_gpus_of_unknown_memory() -> None:
    view = node_view(k8s_node(allocatable={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}))
    assert view.node is not None
    assert view.node.gpu_count == 2
    assert {gpu.memory_mib for gpu in view.node.gpus} == {0}


@pytest.mark.parametrize(("ready", "unschedulable", "reason"), [
    (True, True, "cordoned"),
    (False, False, "not Ready"),
])
def test_cordoned_and_not_ready_nodes_are_excluded_with_a_reason(ready: bool, unschedulable: bool,
                                                                 reason: str) -> None:
    view = node_view(k8s_node(ready=ready, unschedulable=unschedulable))
    assert view.node is None
    assert reason in view.excluded


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not JSON"),
    ('{"schema": "kubecell.io/gpu-inventory/v9", "gpus": []}', "unsupported schema 'kubecell.io/gpu-inventory/v9'"),
    ('{"gpus": [{"index": 0, "uuid": "u", "model": "A100", "memoryMiB": -1}]}', "gpus.0.memoryMiB"),
    ('{"gpus": [{"index": 1, "uuid": "u", "model": "A100", "memoryMiB": 1}]}', "not 0..0"),
])
def test_malformed_inventory_is_rejected_naming_node_and_field(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError) as error:
        node_view(k8s_node(annotations={ANNOTATION_INVENTORY: text}))
    assert "node n1: annotation kubecell.io/gpu-inventory" in str(error.value)
    assert message in str(error.value)


@pytest.mark.parametrize(("product", "memory", "model"), [
    ("Tesla-V100-SXM2-32GB", None, "V100M32"),
    ("Tesla-V100-PCIE-16GB", None, "V100M16"),
    ("NVIDIA-A100-SXM4-40GB", 40960, "A100"),
    ("NVIDIA-H100-80GB-HBM3", None, "H100"),
    ("Tesla-T4", None, "T4"),
    ("NVIDIA-Mystery-9000", None, "NVIDIA-Mystery-9000"),
])
def test_vendor_product_names_map_to_the_catalog(product: str, memory: int | None, model: str) -> None:
    assert catalog_model(product, memory) == model


def test_quantities() -> None:
    assert cpu_milli("48") == 48_000
    assert cpu_milli("500m") == 500
    assert cpu_milli("1.5") == 1_500
    assert memory_mib("384Gi") == 393_216
    assert memory_mib("1Mi") == 1
    assert memory_mib("2097152") == 2
    assert memory_mib("1G") == 953


def test_tainted_nodes_stay_in_the_inventory_taints_are_matched_per_pod() -> None:
    """A taint keeps away the pods that do not tolerate it (kubecell.kube.constraints), not every pod:
    clusters taint their GPU nodes (nvidia.com/gpu:NoSchedule) precisely so that GPU pods land there."""
    node = k8s_node()
    node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    view = node_view(node)
    assert view.node is not None
    assert not view.excluded


# ---------------------------------------------------------------- an inventory never claims more than advertised

def advertising(inventory: dict[str, Any], *, allocatable: dict[str, str] | None = None,
                capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """A Ready node with ``inventory`` as its annotation and these GPU resources in its status."""
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True"}]}
    host = {"cpu": "64", "memory": "512Gi"}
    status["allocatable"] = {**host, **(allocatable or {})}
    if capacity is not None:
        status["capacity"] = {**host, **capacity}
    return {"metadata": {"name": "n1", "labels": {}, "annotations": {ANNOTATION_INVENTORY: json.dumps(inventory)}},
            "spec": {}, "status": status}


def sixteen_gpus(unhealthy: tuple[int, ...] = ()) -> dict[str, Any]:
    """16 GPUs in four NVLink quads, two NUMA nodes of eight."""
    quads = [list(range(start, start + 4)) for start in range(0, 16, 4)]
    node = make_node("n1", cpu_milli=64_000, memory_mib=524_288, gpu_count=16, gpu_model="A100",
                     nvlink_groups=quads, numa_groups=[list(range(8)), list(range(8, 16))])
    inventory: dict[str, Any] = json.loads(inventory_of(node).to_annotation())
    for index in unhealthy:
        inventory["gpus"][index]["healthy"] = False
    return inventory


def test_an_inventory_listing_more_gpus_than_advertised_keeps_the_lowest_indices() -> None:
    view = node_view(advertising(sixteen_gpus(), allocatable={"kubecell.io/gpu": "8"}))
    assert view.node is not None
    assert [gpu.index for gpu in view.node.gpus] == list(range(8))
    assert view.uuids == tuple(f"GPU-n1-{i}" for i in range(8))
    assert view.node.nvlink_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert view.node.numa_groups == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert view.inventory_note == "inventory lists 16 GPUs but the node advertises kubecell.io/gpu: 8; using 8"


@pytest.mark.parametrize(("allocatable", "capacity", "kept", "resource"), [
    ({"kubecell.io/gpu": "6"}, {"kubecell.io/gpu": "8"}, 6, "kubecell.io/gpu"),      # allocatable first
    ({}, {"kubecell.io/gpu": "8"}, 8, "kubecell.io/gpu"),                            # else capacity
    ({"nvidia.com/gpu": "4"}, None, 4, "nvidia.com/gpu"),                            # NVIDIA's device plugin
    ({"kubecell.io/gpu": "12", "nvidia.com/gpu": "4"}, None, 12, "kubecell.io/gpu"),  # kubecell's wins
    ({"nvidia.com/gpu": "0"}, None, 0, "nvidia.com/gpu"),                            # none left: CPU work only
])
def test_the_advertised_count_is_allocatable_else_capacity_of_kubecells_resource_else_nvidias(
        allocatable: dict[str, str], capacity: dict[str, str] | None, kept: int, resource: str) -> None:
    view = node_view(advertising(sixteen_gpus(), allocatable=allocatable, capacity=capacity))
    assert view.node is not None
    assert view.node.gpu_count == kept
    count = allocatable.get(resource) or (capacity or {}).get(resource)
    assert view.inventory_note == f"inventory lists 16 GPUs but the node advertises {resource}: {count}; using {kept}"


@pytest.mark.parametrize(("allocatable", "capacity"), [
    ({}, None),                                     # the node advertises no GPU resource: the inventory stands
    ({"kubecell.io/gpu": "16"}, None),              # as many as listed
    ({"nvidia.com/gpu": "32"}, None),               # more than listed: the inventory is more precise
    ({"kubecell.io/gpu-milli": "8000"}, None),      # a share resource is no count of GPUs
])
def test_an_inventory_within_what_the_node_advertises_stands(allocatable: dict[str, str],
                                                             capacity: dict[str, str] | None) -> None:
    view = node_view(advertising(sixteen_gpus(), allocatable=allocatable, capacity=capacity))
    assert view.node is not None
    assert view.node.gpu_count == 16
    assert view.inventory_note == ""


def test_unhealthy_gpus_are_not_counted_against_what_the_node_advertises() -> None:
    """The kubelet leaves devices its plugin reports unhealthy out of allocatable: a node with one failed GPU of
    sixteen advertises 15 and keeps all sixteen, the failed one marked unhealthy (never a healthy one dropped)."""
    view = node_view(advertising(sixteen_gpus(unhealthy=(2,)), allocatable={"kubecell.io/gpu": "15"},
                                 capacity={"kubecell.io/gpu": "16"}))
    assert view.node is not None
    assert view.node.gpu_count == 16
    assert not view.node.gpus[2].healthy
    assert view.inventory_note == ""
    cut = node_view(advertising(sixteen_gpus(unhealthy=(0, 5)), allocatable={"kubecell.io/gpu": "4"}))
    assert cut.node is not None
    # the longest prefix with four healthy GPUs: the failed GPU 5 stays (marked unhealthy) before healthy GPU 6
    assert [gpu.healthy for gpu in cut.node.gpus] == [False, True, True, True, True, False]
    assert cut.inventory_note == ("inventory lists 16 GPUs (14 healthy) but the node advertises kubecell.io/gpu: 4; "
                                  "using 6 (4 healthy)")


def test_gfd_labels_listing_more_gpus_than_advertised_are_cut_too() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"}
    view = node_view(k8s_node(labels=labels, allocatable={"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "7"}))
    assert view.node is not None
    assert view.node.gpu_count == 7
    assert view.inventory_note == ("label nvidia.com/gpu.count lists 8 GPUs but the node advertises nvidia.com/gpu: 7;"
                                   " using 7")


def mig_inventory(gpus: int = 2, instances: int = 2) -> dict[str, Any]:
    return {"schema": "kubecell.io/gpu-inventory/v1", "isolation": ["accounting", "mig"], "devicePlugin": True,
            "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": "A100", "memoryMiB": 40536, "numaNode": i,
                      "migMode": "enabled",
                      "migInstances": [{"uuid": f"MIG-{i}-{j}", "profile": "3g.20gb", "memoryMiB": 20096,
                                        "start": 4 * j, "size": 4} for j in range(instances)]}
                     for i in range(gpus)]}


@pytest.mark.parametrize(("allocatable", "kept", "resource"), [
    ({"kubecell.io/gpu": "3"}, 3, "kubecell.io/gpu"),                       # kubecell's plugin: one per instance
    ({"nvidia.com/mig-3g.20gb": "2", "nvidia.com/gpu": "0"}, 2, "nvidia.com/mig-3g.20gb"),  # NVIDIA's mixed strategy
    ({"nvidia.com/gpu": "1"}, 1, "nvidia.com/gpu"),                          # NVIDIA's single strategy
])
def test_a_mig_node_compares_its_instances_with_what_it_advertises(allocatable: dict[str, str], kept: int,
                                                                     resource: str) -> None:
    view = node_view(advertising(mig_inventory(), allocatable=allocatable))
    assert view.node is not None
    assert view.uuids == ("MIG-0-0", "MIG-0-1", "MIG-1-0", "MIG-1-1")[:kept]
    assert sorted(i for group in view.node.numa_groups for i in group) == list(range(kept))
    assert sorted(i for group in view.node.nvlink_groups for i in group) == list(range(kept))
    count = allocatable[resource]
    assert view.inventory_note == (f"inventory lists 4 MIG instances but the node advertises {resource}: {count}; "
                                   f"using {kept}")
    assert view.isolation == ("mig",)


def test_a_mig_node_advertising_every_instance_keeps_them_all() -> None:
    view = node_view(advertising(mig_inventory(), allocatable={"kubecell.io/gpu": "4"}))
    assert view.node is not None
    assert view.node.gpu_count == 4
    assert view.inventory_note == ""


@settings(max_examples=150, deadline=None, derandomize=True)
@given(count=st.integers(1, 16), broken=st.sets(st.integers(0, 15)), advertised=st.integers(0, 20),
       resource=st.sampled_from(["kubecell.io/gpu", "nvidia.com/gpu"]), table=st.sampled_from(["allocatable",
                                                                                              "capacity"]))
def test_the_view_never_offers_more_healthy_gpus_than_advertised(count: int, broken: set[int], advertised: int,
                                                                  resource: str, table: str) -> None:
    node = make_node("n1", cpu_milli=64_000, memory_mib=524_288, gpu_count=count, gpu_model="A100")
    inventory = json.loads(inventory_of(node).to_annotation())
    for index in broken & set(range(count)):
        inventory["gpus"][index]["healthy"] = False
    obj = advertising(inventory, **{table: {resource: str(advertised)}})
    view = node_view(obj)
    assert view.node is not None
    healthy = count - len(broken & set(range(count)))
    assert sum(gpu.healthy for gpu in view.node.gpus) == min(healthy, advertised)
    assert [gpu.index for gpu in view.node.gpus] == list(range(view.node.gpu_count))   # a prefix, indices kept
    assert view.uuids == tuple(f"GPU-n1-{i}" for i in range(view.node.gpu_count))
    assert bool(view.inventory_note) == (healthy > advertised)
