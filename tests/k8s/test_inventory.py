"""Reading GPU nodes from the API: the node agent's inventory annotation, GFD labels, exclusions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import TopologyLevel, make_node
from kubecell.k8s.inventory import catalog_model, cpu_milli, inventory_of, memory_mib, node_view
from kubecell.k8s.names import ANNOTATION_INVENTORY
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
    """A taint keeps away the pods that do not tolerate it (kubecell.k8s.constraints), not every pod:
    clusters taint their GPU nodes (nvidia.com/gpu:NoSchedule) precisely so that GPU pods land there."""
    node = k8s_node()
    node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    view = node_view(node)
    assert view.node is not None
    assert not view.excluded
