"""Cluster descriptions become testbed nodes; bad descriptions fail before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.kube.names import k8s_name
from kubecell.testbed import testbed as testbed_driver
from kubecell.testbed.nodes import load_cluster_nodes, node_manifest


def test_synthetic_cluster_has_racks_and_nvlink_quads() -> None:
    nodes = load_cluster_nodes("synthetic", 45)
    assert len(nodes) == 45
    assert {n.gpu_count for n in nodes} == {8}
    assert len({n.rack for n in nodes}) == 3
    assert nodes[0].nvlink_groups == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_node_objects_advertise_gpus_the_way_devices_and_gfd_do() -> None:
    manifest = node_manifest(load_cluster_nodes("philly")[0])
    allocatable = manifest["status"]["allocatable"]
    assert allocatable["nvidia.com/gpu"] == "8"
    assert allocatable["kubecell.io/gpu-milli"] == "8000"
    assert manifest["metadata"]["labels"]["nvidia.com/gpu.product"] == "P40"
    assert manifest["metadata"]["labels"]["kubecell.io/rack"] == "philly-rack-0"


def test_trace_node_names_become_dns_names() -> None:
    assert k8s_name("OpenB_Node_0001") == "openb-node-0001"


@pytest.mark.parametrize(("cluster", "nodes", "message"), [
    ("mars", None, "unknown cluster 'mars'"),
    ("synthetic", None, "--cluster synthetic needs --nodes N"),
    ("synthetic", 0, "at least one node"),
])
def test_bad_cluster_choice_is_refused(cluster: str, nodes: int | None, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        load_cluster_nodes(cluster, nodes)


def test_up_refuses_bad_input_before_starting_anything(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError):
        testbed_driver.up("mars", directory=tmp_path)
    assert not (tmp_path / "state.json").exists()
    assert testbed_driver.down(tmp_path) == []
