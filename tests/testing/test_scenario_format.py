"""The scenario format's inputs: its cluster is the dynamic simulator's cluster description, and errors
in the cluster, the tenants, a reload or a step name the scenario file and the line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubecell.core.errors import InvalidInputError
from kubecell.inputs.cluster import load_cluster
from kubecell.testing.scenarios import ScenarioFailure, discover, load_scenario, run_scenario

SCENARIOS = Path(__file__).parents[1] / "core" / "engine" / "scenarios"

HEAD = """\
name: probe
description: a scenario used to test the format
cluster:
  nodeGroups:
    - count: 2
      namePrefix: n
      nameDigits: 1
      gpu: {model: V100M32, count: 8}
      cpuMilli: 128000
      memoryMiB: 1048576
tenants:
  virtualClusters:
    a: {gpus: 8}
    b: {gpus: 8}
steps:
  - submit: {name: j1, vc: a, gpus: 8}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _refused(path: Path) -> str:
    with pytest.raises(InvalidInputError) as info:
        load_scenario(path)
    return str(info.value)


@pytest.mark.parametrize("name", [p.stem for p in discover(SCENARIOS)])
def test_a_scenario_cluster_is_a_dynamic_simulator_cluster(tmp_path: Path, name: str) -> None:
    path = SCENARIOS / f"{name}.yaml"
    standalone = tmp_path / "cluster.yaml"
    standalone.write_text(yaml.safe_dump(yaml.safe_load(path.read_text(encoding="utf-8"))["cluster"]),
                          encoding="utf-8")
    assert list(load_scenario(path).nodes) == load_cluster(standalone)


def test_a_bad_cluster_key_names_the_scenario_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD.replace("      nameDigits: 1\n", "      nameDigits: 1\n      gpus: 8\n"))
    message = _refused(path)
    assert message.startswith(f"{path}:8: cluster.nodeGroups[0].gpus: unknown key 'gpus'"), message
    assert "namePrefix" in message  # what is accepted


def test_the_old_list_cluster_is_refused_with_the_format_expected(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD.replace(HEAD[HEAD.index("  nodeGroups:"):HEAD.index("tenants:")],
                                         "  - {count: 2, gpus: 8}\n"))
    message = _refused(path)
    assert message.startswith(f"{path}:3: cluster: expected a mapping with nodeGroups and/or nodes"), message


def test_a_tenant_error_names_the_scenario_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD.replace("a: {gpus: 8}", "a: {gpus: {count: 0}}"))
    assert _refused(path).startswith(f"{path}:13: tenants.virtualClusters.a.gpus.count: must be at least 1, got 0")


def test_a_vc_defined_twice_in_a_scenario_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD.replace("    b: {gpus: 8}\n", "    b: {gpus: 8}\n    a: {gpus: 16}\n"))
    assert _refused(path).startswith(
        f"{path}:15: tenants.virtualClusters.a: duplicate key 'a' (first defined at line 13)")


def test_a_reload_error_names_the_line_and_the_step(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD + "  - reload_config:\n      virtualClusters:\n        a: {gpus: 99}\n")
    with pytest.raises(InvalidInputError) as info:
        run_scenario(path)
    assert str(info.value).startswith(f"{path}:18: steps[1] (reload_config): virtualClusters: guarantees cannot")


def test_a_failed_expectation_names_the_line_of_its_step(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD + "  - expect_bound: {job: j1, node_in: [n0]}\n  - expect_waiting: {job: j1}\n")
    with pytest.raises(ScenarioFailure) as info:
        run_scenario(path)
    assert str(info.value).startswith(f"{path}:18: steps[2] (expect_waiting): expected j1 to wait")
    assert info.value.step == 2
