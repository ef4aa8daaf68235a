"""Cluster description YAML: expansion of node groups, explicit nodes, and errors that say where and what."""

from __future__ import annotations

import pytest

from kubecell.cli.main import philly_example_paths
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import GPU_MODELS
from kubecell.core.topology import CellForest
from kubecell.inputs.cluster import cluster_notes, load_cluster
from tests.sim.dynamic.support import TINY_CLUSTER, Writer


def test_bundled_philly_cluster() -> None:
    cluster, _ = philly_example_paths()
    nodes = load_cluster(cluster)
    assert len(nodes) == 64
    assert sum(n.gpu_count for n in nodes) == 512
    assert [n.name for n in nodes[:2]] == ["philly-000", "philly-001"]
    assert nodes[-1].name == "philly-063"
    assert {n.gpu_model for n in nodes} == {"P40"}
    assert {(n.cpu_milli, n.memory_mib) for n in nodes} == {(48000, 393216)}
    assert nodes[0].nvlink_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    racks = {n.rack for n in nodes}
    assert racks == {f"philly-rack-{i}" for i in range(8)}
    assert nodes[7].rack == "philly-rack-0"
    assert nodes[8].rack == "philly-rack-1"
    forest = CellForest(nodes)
    assert len(forest.cells_of_type("P40x8/rack")) == 8
    assert cluster_notes(nodes) == []


def test_groups_and_explicit_nodes(write: Writer) -> None:
    path = write("c.yaml", TINY_CLUSTER + """\
    zone: z1
    labels: {team: ml}
nodes:
  - {name: odd, cpuMilli: 8000, memoryMiB: 65536, gpu: {model: MysteryGPU, count: 2, memoryMiB: 12000}, rack: r9}
  - {name: cpu-only, cpuMilli: 8000, memoryMiB: 65536}
""")
    nodes = load_cluster(path)
    assert [n.name for n in nodes] == ["n-000", "n-001", "n-002", "n-003", "odd", "cpu-only"]
    assert nodes[0].zone == "z1"
    assert nodes[0].labels == {"team": "ml"}
    assert nodes[0].rack == "n-rack-0"
    assert nodes[3].rack == "n-rack-1"
    assert nodes[4].gpus[0].memory_mib == 12000
    assert nodes[4].gpu_model == "MysteryGPU"
    assert nodes[5].gpu_count == 0


def test_many_nodes_pad_names(write: Writer) -> None:
    path = write("c.yaml", "nodeGroups:\n  - {count: 1200, namePrefix: x, gpu: {model: T4, count: 1}, "
                 "cpuMilli: 1000, memoryMiB: 1000}\n")
    nodes = load_cluster(path)
    assert nodes[0].name == "x0000"
    assert nodes[-1].name == "x1199"


def _error(write: Writer, text: str) -> str:
    path = write("bad.yaml", text)
    with pytest.raises(InvalidInputError) as info:
        load_cluster(path)
    message = str(info.value)
    assert str(path) in message
    return message


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        (TINY_CLUSTER + "    gpus: 8\n", ["bad.yaml:9", "nodeGroups[0].gpus", "unknown key 'gpus'", "rackSize"]),
        (TINY_CLUSTER.replace("V100M32", "V100X"), ["bad.yaml:4", "nodeGroups[0].gpu.model", "'V100X'",
                                                    *sorted(GPU_MODELS)[:3]]),
        (TINY_CLUSTER.replace("count: 4", "count: 0"), ["bad.yaml:2", "nodeGroups[0].count", "at least 1, got 0"]),
        (TINY_CLUSTER.replace("count: 4", "count: 3"), ["nodeGroups[0].count", "not a multiple of rackSize 2"]),
        (TINY_CLUSTER.replace("count: 8}", "count: -1}"), ["nodeGroups[0].gpu.count"]),
        (TINY_CLUSTER.replace("cpuMilli: 64000", "cpuMilli: lots"), ["bad.yaml:5", "nodeGroups[0].cpuMilli"]),
        (TINY_CLUSTER.replace("    cpuMilli: 64000\n", ""), ["nodeGroups[0].cpuMilli", "required key missing"]),
        (TINY_CLUSTER.replace("[4, 5, 6, 7]", "[4, 5, 6]"), ["nodeGroups[0].nvlinkGroups", "partition"]),
        (TINY_CLUSTER + "nodes:\n  - {name: n-001, cpuMilli: 1, memoryMiB: 1}\n",
         ["bad.yaml:10", "nodes[0].name", "duplicate node name 'n-001'", "nodeGroups[0]"]),
        (TINY_CLUSTER + "nodes:\n  - {name: n-rack-0, cpuMilli: 1, memoryMiB: 1}\n", ["rack 'n-rack-0'", "node"]),
        ("nodes:\n  - {name: a, cpuMilli: 1, memoryMiB: 1}\n", ["no GPU nodes"]),
        ("- just\n- a list\n", ["expected a mapping"]),
        ("nodeGroups: [\n", ["not valid YAML"]),
        ("racks: 3\n", ["unknown key 'racks'", "nodeGroups"]),
    ],
)
def test_errors_name_file_line_key_and_what_is_accepted(write: Writer, text: str, mentions: list[str]) -> None:
    message = _error(write, text)
    for mention in mentions:
        assert mention in message, message


def test_missing_file(tmp_path: object) -> None:
    with pytest.raises(InvalidInputError, match="file not found"):
        load_cluster("/nonexistent/cluster.yaml")
