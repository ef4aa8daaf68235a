"""The one YAML reader: duplicate keys refused with both lines, every key path has a line, sections of a
file report the file's lines, files that are not YAML say what they are, and hostile YAML (deep nesting,
alias bombs, huge numbers, dates that do not exist, tags on text they cannot read) is refused quickly with
the source, the line and what is accepted (the property over random hostile text: test_hostile_yaml.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from kubecell.core.errors import InvalidInputError
from kubecell.core.topology import CellForest
from kubecell.inputs.cluster import load_cluster
from kubecell.inputs.tenants import load_tenants, parse_tenants
from kubecell.inputs.yaml_document import (
    MAX_YAML_CHARS,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    MAX_YAML_NUMBER_CHARS,
    YamlDocument,
)
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
    assert doc.where(["node", "cpuMilli"]) == "x.yaml:4: node.cpuMilli"  # the key that counts, not the merged one
    assert doc.where(["node", "memoryMiB"]) == "x.yaml:1: node.memoryMiB"  # merged: where it is written


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


# ============================================================================ hostile YAML
CONFIGMAP = "configmap kubecell-system/kubecell-tenants key tenants.yaml"
"""The source the scheduler names when it reads the tenant ConfigMap (``kubecell.scheduler.tenants``)."""


def bomb(levels: int, fanout: int = 9) -> str:
    """"Billion laughs": each anchor a list of ``fanout`` aliases of the one before, ``fanout ** levels`` values
    from a few hundred characters."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * fanout)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def deep_anchor(depth: int) -> str:
    """An anchor nested ``depth`` levels (its value at the top counts as one more), aliased inside a list."""
    return f"a: &a {'[' * depth}1{']' * depth}\nb: [*a]\n"


def refusal(text: str, budget: float = 1.0) -> str:
    """The message ``YamlDocument`` refuses ``text`` with, checked to come within ``budget`` seconds and on one
    line."""
    started = time.perf_counter()
    with pytest.raises(InvalidInputError) as info:
        YamlDocument("x.yaml", text)
    assert time.perf_counter() - started < budget
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(("text", "fragments"), [
    pytest.param("a: 1\nb: " + "1" * 5000, ("x.yaml:2: has a number of 5000 characters",
                                            f"(accepted: integers of at most {MAX_YAML_NUMBER_CHARS} characters)"),
                 id="5000 digits"),
    pytest.param("a: 0x" + "f" * 5000, ("x.yaml:1: has a number of 5002 characters",), id="5000 hex digits"),
    pytest.param("a: 1\n? " + "1" * 5000 + "\n: b", ("x.yaml:2: has a number of 5000 characters",),
                 id="5000-digit key"),
    pytest.param("when: 2026-02-31", ("x.yaml:1: has a date that does not exist (day is out of range for month)",
                                      "(accepted: a date that exists"), id="February 31"),
    pytest.param("a: 1\n2026-02-31: b", ("x.yaml:2: has a date that does not exist",), id="a date key"),
    pytest.param("when: 2026-01-01 24:00:00", ("has a date that does not exist (hour must be in 0..23)",),
                 id="hour 24"),
    pytest.param("when: 2026-01-01T00:00:00+99:00", ("has a date that does not exist (offset must be",),
                 id="offset of 99 hours"),
    pytest.param("[" * 5000, ("x.yaml:1: nests deeper than 32 levels",
                              f"(accepted: at most {MAX_YAML_DEPTH} levels of nested lists and mappings)"),
                 id="5000 ["),
    pytest.param("{a: " * 5000, ("x.yaml:1: nests deeper than 32 levels",), id="5000 {"),
    pytest.param("".join(" " * i + "a:\n" for i in range(100)), ("x.yaml:32: nests deeper than 32 levels",),
                 id="100 block levels"),
    pytest.param(deep_anchor(30), ("x.yaml:2: nests deeper than 32 levels once the alias *a is expanded",),
                 id="deep once expanded"),
    pytest.param(bomb(9), ("x.yaml:5: holds more than 65536 values once its aliases are expanded (at the alias *l3)",
                           f"(accepted: at most {MAX_YAML_NODES} values"), id="billion laughs"),
    pytest.param(bomb(30, fanout=2), ("holds more than 65536 values once its aliases are expanded",),
                 id="doubling laughs"),
    pytest.param("&a [*a]", ("x.yaml:1: uses the YAML alias *a inside the node &a it names",
                             "(accepted: aliases of nodes that are complete where the alias stands)"), id="a loop"),
    pytest.param("a: &a\n  b:\n    c: [1, *a]\n", ("x.yaml:3: uses the YAML alias *a inside the node &a",),
                 id="a loop in blocks"),
    pytest.param("a: !!int ''", ("x.yaml:1: has a value that !!int cannot hold (IndexError",
                                 "(accepted: a value of the form !!int describes)"), id="empty !!int"),
    pytest.param("a: !!bool maybe", ("has a value that !!bool cannot hold (KeyError",), id="!!bool maybe"),
    pytest.param("a: !!float ''", ("has a value that !!float cannot hold",), id="empty !!float"),
    pytest.param("a: !!timestamp soon", ("x.yaml:1: has a !!timestamp that is not a date",), id="!!timestamp soon"),
    pytest.param("a: !!int [1]", ("has a number or date that is not a scalar",), id="!!int on a list"),
    pytest.param("a: !!python/object/apply:os.system [ls]", ("x.yaml:1: not valid YAML: could not determine a "
                                                             "constructor",), id="python tag"),
    pytest.param("a: 1\nb: \x00", ("x.yaml:2: not valid YAML: unacceptable character #x0000",), id="NUL"),
    pytest.param("#" * (MAX_YAML_CHARS + 1), (f"x.yaml: is {MAX_YAML_CHARS + 1} characters long "
                                              f"(accepted: YAML of at most {MAX_YAML_CHARS} characters)",),
                 id="too long"),
])
def test_hostile_yaml_is_refused_quickly_with_line_and_what_is_accepted(text: str, fragments: tuple[str, ...]) -> None:
    message = refusal(text)
    for fragment in fragments:
        assert fragment in message


def test_a_document_of_too_many_values_is_refused_once_it_reaches_the_bound() -> None:
    """Without aliases the text bound nearly bounds the values too, but flow collections write one in two
    characters: composing the 65,536 allowed takes PyYAML about a second, so the budget is wider here."""
    message = refusal("{" + ",".join(["1"] * 40_000) + "}", budget=5.0)
    assert message.startswith(f"x.yaml:1: holds more than {MAX_YAML_NODES} values (accepted: at most")


def test_a_hostile_tenant_configmap_is_refused_naming_the_configmap(tmp_path: Path) -> None:
    """The scheduler and ``kubecell inspect`` parse the ConfigMap's text through ``YamlDocument`` and
    ``parse_tenants`` and catch ``InvalidInputError`` alone: an alias bomb must be one."""
    forest = _forest(tmp_path)
    text = "virtualClusters:\n  vision:\n    gpus: 8\n" + bomb(9).replace("l0:", "x0:")
    with pytest.raises(InvalidInputError) as info:
        parse_tenants(YamlDocument(CONFIGMAP, text), forest)
    assert str(info.value).startswith(f"{CONFIGMAP}:8: holds more than 65536 values")


def test_anchors_aliases_and_merges_within_the_bounds_are_read() -> None:
    shape = "shape: &s {cpuMilli: 1000, memoryMiB: 2048, gpu: {model: V100, count: 8}}\n"
    nodes = "".join(f"n{i}: {{<<: *s, name: n{i}}}\n" for i in range(500))
    doc = YamlDocument("x.yaml", shape + nodes + "all: [" + ", ".join(["*s"] * 1000) + "]\n")
    assert doc.data["n499"] == {"cpuMilli": 1000, "memoryMiB": 2048, "gpu": {"model": "V100", "count": 8},
                                "name": "n499"}
    assert len(doc.data["all"]) == 1000
    assert doc.where(["n7", "name"]) == "x.yaml:9: n7.name"
    deep = YamlDocument("x.yaml", deep_anchor(29)).data  # the deepest scalar is at level 32 once expanded
    assert deep["b"][0] is deep["a"]
    assert YamlDocument("x.yaml", bomb(3)).data["l3"][8][8][8] == ["lol"] * 9  # 9^4 values: within the bound


def test_numbers_and_dates_within_the_bounds_are_read() -> None:
    binary = "-0b" + "_".join(["1111"] * 16)  # 82 characters: the longest int64 YAML writes, nearly
    doc = YamlDocument("x.yaml", f"big: {2**63 - 1}\nbinary: {binary}\nwhen: 2024-02-29 23:59:59\n")
    assert doc.data["big"] == 2**63 - 1
    assert doc.data["binary"] == -(2**64 - 1)
    assert doc.data["when"].day == 29


def test_a_file_longer_than_the_bound_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = _write(tmp_path, "big.yaml", "#" * (4 * MAX_YAML_CHARS))
    assert _refused(load_cluster, path) == (f"{path}: is more than {MAX_YAML_CHARS} characters long "
                                            f"(accepted: YAML of at most {MAX_YAML_CHARS} characters)")
