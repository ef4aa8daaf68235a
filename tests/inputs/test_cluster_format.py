"""Cluster format additions: node-name digits, rack names shared across groups, strict counts, and a
cluster description embedded in another document (a scenario's ``cluster:``) located in that file."""

from __future__ import annotations

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.topology import CellForest
from kubecell.inputs.cluster import parse_cluster
from kubecell.inputs.yaml_document import YamlDocument

V100 = "gpu: {model: V100M32, count: 8}, cpuMilli: 1000, memoryMiB: 1000"


def _nodes(text: str) -> list[tuple[str, str]]:
    return [(n.name, n.rack) for n in parse_cluster(YamlDocument("c.yaml", text))]


def test_name_digits_and_rack_prefix() -> None:
    text = f"nodeGroups:\n  - {{count: 4, namePrefix: n, nameDigits: 1, rackSize: 2, rackPrefix: rack, {V100}}}\n"
    assert _nodes(text) == [("n0", "rack0"), ("n1", "rack0"), ("n2", "rack1"), ("n3", "rack1")]


def test_names_stay_in_numeric_order_beyond_the_digits_asked_for() -> None:
    text = f"nodeGroups:\n  - {{count: 12, namePrefix: n, nameDigits: 1, {V100}}}\n"
    names = [name for name, _ in _nodes(text)]
    assert names[0] == "n00"
    assert names[-1] == "n11"
    assert names == sorted(names)


def test_default_names_and_racks_are_unchanged() -> None:
    text = f"nodeGroups:\n  - {{count: 4, namePrefix: p-, rackSize: 2, {V100}}}\n"
    assert _nodes(text) == [("p-000", "p-rack-0"), ("p-001", "p-rack-0"), ("p-002", "p-rack-1"), ("p-003", "p-rack-1")]


def test_groups_with_one_rack_prefix_share_racks() -> None:
    text = (f"nodeGroups:\n  - {{count: 2, namePrefix: v, rackSize: 1, rackPrefix: r, {V100}}}\n"
            "  - {count: 2, namePrefix: a, rackSize: 1, rackPrefix: r, gpu: {model: A100, count: 8}, "
            "cpuMilli: 1000, memoryMiB: 1000}\n")
    assert _nodes(text) == [("v000", "r0"), ("v001", "r1"), ("a000", "r0"), ("a001", "r1")]
    # a rack of two GPU kinds has a rack cell per kind (before, the cell forest refused two cells named r0)
    forest = CellForest(parse_cluster(YamlDocument("c.yaml", text)))
    assert sorted(cell.id for cell in forest.roots) == ["r0/A100x8", "r0/V100M32x8", "r1/A100x8", "r1/V100M32x8"]
    assert {cell.type_name for cell in forest.roots} == {"A100x8/rack", "V100M32x8/rack"}


def test_a_count_past_any_cluster_is_refused_before_a_node_is_built() -> None:
    """``count: 1000000000`` built nodes until memory ran out."""
    with pytest.raises(InvalidInputError, match=r"c\.yaml:2: nodeGroups\[0\]\.count: .*100,000"):
        parse_cluster(YamlDocument("c.yaml", f"nodeGroups:\n  - {{count: 1000000000, namePrefix: n, {V100}}}\n"))
    text = "nodeGroups:\n" + "".join(f"  - {{count: 60000, namePrefix: g{i}-, {V100}}}\n" for i in range(2))
    with pytest.raises(InvalidInputError, match=r"the cluster has 120,000 nodes .*at most 100,000"):
        parse_cluster(YamlDocument("c.yaml", text))


@pytest.mark.parametrize("index", ["true", "'2'", "3.0"])
def test_gpu_indices_in_groups_are_whole_numbers(index: str) -> None:
    text = f"nodeGroups:\n  - {{count: 1, namePrefix: n, nvlinkGroups: [[0, 1, {index}, 3], [4, 5, 6, 7]], {V100}}}\n"
    with pytest.raises(InvalidInputError, match=r"nvlinkGroups\[0\]\[2\]"):
        parse_cluster(YamlDocument("c.yaml", text))


def test_an_unknown_model_is_named_briefly() -> None:
    model = "Z" * 120_000
    with pytest.raises(InvalidInputError, match="unknown GPU model") as info:
        parse_cluster(YamlDocument("c.yaml", f"nodes:\n  - {{name: a, gpu: {{model: {model}, count: 1}}, cpuMilli: 1, "
                                             "memoryMiB: 1}\n"))
    assert len(str(info.value)) < 2_000


@pytest.mark.parametrize(("value", "says"), [("yes", "got true"), ("4.0", "must be a whole number, got 4.0"),
                                             ("'4'", "must be a whole number, got '4'")])
def test_counts_are_strict(value: str, says: str) -> None:
    # `count: yes` used to build one node; a quoted or fractional count is a typo, not a number
    with pytest.raises(InvalidInputError, match=r"c\.yaml:2: nodeGroups\[0\]\.count: ") as info:
        parse_cluster(YamlDocument("c.yaml", f"nodeGroups:\n  - {{count: {value}, namePrefix: n, {V100}}}\n"))
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("line", "where", "says"),
    [
        (f"- {{count: 2, namePrefix: n, gpus: 8, {V100}}}", "s.yaml:4: cluster.nodeGroups[0].gpus",
         "unknown key 'gpus'"),
        ("- {count: 2, namePrefix: n, gpu: {model: Z80, count: 8}, cpuMilli: 1, memoryMiB: 1}",
         "s.yaml:4: cluster.nodeGroups[0].gpu.model", "unknown GPU model 'Z80'"),
        ("- {count: 3, namePrefix: n, rackSize: 2, gpu: {model: V100M32, count: 8}, cpuMilli: 1, memoryMiB: 1}",
         "s.yaml:4: cluster.nodeGroups[0].count", "not a multiple of rackSize 2"),
        ("- {count: 2, namePrefix: n, gpu: {model: V100M32, count: 8}, cpuMilli: 1, memoryMiB: 100000000000000000}",
         "s.yaml:4: cluster.nodeGroups[0].memoryMiB", "out of range"),
    ],
)
def test_an_embedded_cluster_is_located_in_its_file(line: str, where: str, says: str) -> None:
    doc = YamlDocument("s.yaml", f"name: probe\ncluster:\n  nodeGroups:\n    {line}\n")
    with pytest.raises(InvalidInputError) as info:
        parse_cluster(doc, ("cluster",))
    message = str(info.value)
    assert message.startswith(f"{where}: "), message
    assert says in message
