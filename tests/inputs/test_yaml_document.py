"""The one YAML reader: duplicate keys refused with both lines, every key path has a line, sections of a
file report the file's lines, and files that are not YAML say what they are."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubecell.core.errors import InvalidInputError
from kubecell.core.topology import CellForest
from kubecell.inputs.cluster import load_cluster
from kubecell.inputs.tenants import load_tenants
from kubecell.inputs.yaml_document import YamlDocument
from tests.support import RACKED_CLUSTER as CLUSTER


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _forest(tmp_path: Path) -> CellForest:
    return CellForest(load_cluster(_write(tmp_path, "cluster.yaml", CLUSTER)))


def _refused(load: object, path: Path, *args: object) -> str:
    with pytest.raises(InvalidInputError) as info:
        load(path, *args)  # type: ignore[operator]
    return str(info.value)


# ============================================================================ duplicate keys
def test_a_vc_defined_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, "tenants.yaml", """\
virtualClusters:
  vision:
    gpus: 8
  speech:
    gpus: 8
  vision:
    gpus: 16
""")
    message = _refused(load_tenants, path, _forest(tmp_path))
    assert message.startswith(f"{path}:6: virtualClusters.vision: duplicate key 'vision' (first defined at line 2)")


def test_a_field_twice_inside_one_vc_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, "tenants.yaml", """\
virtualClusters:
  vision:
    gpus: 8
    weight: 2
    gpus: 16
""")
    message = _refused(load_tenants, path, _forest(tmp_path))
    assert message.startswith(f"{path}:5: virtualClusters.vision.gpus: duplicate key 'gpus' (first defined at line 3)")


def test_count_twice_in_a_node_group_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, "cluster.yaml", CLUSTER + "    count: 2\n")
    message = _refused(load_cluster, path)
    assert message.startswith(f"{path}:8: nodeGroups[0].count: duplicate key 'count' (first defined at line 2)")


def test_a_duplicate_on_one_line_names_the_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "cluster.yaml", "nodeGroups:\n  - {count: 4, namePrefix: n-, count: 5}\n")
    message = _refused(load_cluster, path)
    assert f"{path}:2: nodeGroups[0].count: duplicate key 'count' (first defined at line 2, column 6)" in message


@pytest.mark.parametrize("keys", ["1: a\n0x1: b\n", "true: a\nyes: b\n"], ids=["int", "bool"])
def test_keys_that_mean_the_same_value_are_duplicates(keys: str) -> None:
    with pytest.raises(InvalidInputError, match=r"x\.yaml:2: .*duplicate key .*first defined at line 1"):
        YamlDocument("x.yaml", keys)


def test_merge_keys_may_be_overridden() -> None:
    doc = YamlDocument("x.yaml", "base: &b {cpuMilli: 1, memoryMiB: 2}\nnode:\n  <<: *b\n  cpuMilli: 3\n")
    assert doc.data["node"] == {"cpuMilli": 3, "memoryMiB": 2}


def test_data_is_what_a_safe_load_gives(tmp_path: Path) -> None:
    text = "a: &x [1, 2, {b: c}]\nd: *x\ne: {f: 1.5, g: null, h: yes, i: '2'}\nj: 2024-01-02\n"
    assert YamlDocument("x.yaml", text).data == yaml.safe_load(text)


# ============================================================================ lines and sections
def test_where_gives_the_line_of_the_deepest_key_present() -> None:
    doc = YamlDocument("c.yaml", CLUSTER)
    assert doc.where(["nodeGroups", 0, "gpu", "model"]) == "c.yaml:4: nodeGroups[0].gpu.model"
    assert doc.where(["nodeGroups", 0, "rackSize"]) == "c.yaml:7: nodeGroups[0].rackSize"
    assert doc.where(["nodeGroups", 0, "zone"]) == "c.yaml:2: nodeGroups[0].zone"  # absent: its group's line
    assert doc.where([]) == "c.yaml:1"


def test_a_section_reports_the_file_lines_and_the_full_key_path() -> None:
    doc = YamlDocument("s.yaml", "name: probe\ncluster:\n" + "".join(f"  {line}\n" for line in CLUSTER.splitlines()))
    section = doc.section("cluster")
    assert section.data["nodeGroups"][0]["count"] == 4
    assert section.where(["nodeGroups", 0, "cpuMilli"]) == "s.yaml:7: cluster.nodeGroups[0].cpuMilli"
    assert section.where() == "s.yaml:2: cluster"
    assert doc.section("absent").data is None


# ============================================================================ files that are not YAML
def test_a_directory_says_it_is_a_directory(tmp_path: Path) -> None:
    assert _refused(load_cluster, tmp_path) == f"{tmp_path}: is a directory, expected a YAML file"


def test_a_missing_file(tmp_path: Path) -> None:
    assert _refused(load_cluster, tmp_path / "nope.yaml") == f"{tmp_path / 'nope.yaml'}: file not found"


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x01nodeGroups")
    assert _refused(load_cluster, path).startswith(f"{path}: not a UTF-8 text file")


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.yaml", "nodeGroups:\n  - {count: 4\n")
    assert _refused(load_cluster, path).startswith(f"{path}:3: not valid YAML")
