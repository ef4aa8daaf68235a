"""Conformance scenarios (tests/core/engine/scenarios/*.yaml) and the scenario runner itself.

Each YAML file is one test, named after its file stem. A scenario marked ``known_failure`` documents
an engine bug: it still asserts the correct behaviour and runs as ``xfail(strict=True)``, so the suite
turns red both when a new bug appears and when a known one is fixed without removing the mark.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubecell.core.engine.engine import Engine
from kubecell.core.errors import InvalidInputError
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.testing.scenarios import ScenarioFailure, discover, load_scenario, parse_scenario, run_scenario

SCENARIOS = Path(__file__).parent / "scenarios"


def _known_failure(path: Path) -> str | None:
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return None  # the test itself reports the malformed file
    reason = data.get("known_failure") if isinstance(data, dict) else None
    return str(reason) if reason else None


def _params() -> list[Any]:
    params = []
    for path in discover(SCENARIOS):
        reason = _known_failure(path)
        marks = [pytest.mark.xfail(strict=True, raises=ScenarioFailure, reason=reason)] if reason else []
        params.append(pytest.param(path, marks=marks, id=path.stem))
    return params


@pytest.mark.parametrize("path", _params())
def test_scenario(path: Path) -> None:
    result = run_scenario(path)
    assert result.cycles > 0


def test_suite_size_and_metadata() -> None:
    paths = discover(SCENARIOS)
    assert len(paths) >= 32
    for path in paths:
        scenario = load_scenario(path)
        assert scenario.name == path.stem.replace("_", "-"), path
        assert len(scenario.description) > 80, f"{path}: describe why the case matters and cite its source"


# ---------------------------------------------------------------------------------------------- the runner
BASE = """\
name: probe
description: a scenario used to test the runner
policy: kubecell
cluster:
  nodeGroups:
    - {count: 2, namePrefix: n, nameDigits: 1, gpu: {model: V100M32, count: 8}, cpuMilli: 128000, memoryMiB: 1048576}
tenants:
  virtualClusters:
    a: {gpus: 8}
    b: {gpus: 8}
steps:
"""


def write(tmp_path: Path, steps: str, name: str = "probe.yaml", head: str = BASE) -> Path:
    path = tmp_path / name
    path.write_text(head + textwrap.indent(textwrap.dedent(steps), "  "), encoding="utf-8")
    return path


def test_runner_passes_a_true_story(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        - at: 0
          submit: {name: j1, vc: a, gpus: 8}
        - expect_bound: {job: j1, class: guaranteed, same_node: true, gpus: 8, within_cell: V100M32x8/node}
        - submit: {name: j2, vc: a, gpus: 8}
        - expect_bound: {job: j2, class: borrowed}
        - submit: {name: j3, vc: b, gpus: 8}
        - expect_preempted: {jobs: [j2], not: [j1], exactly: true}
        - expect_waiting: {job: j2, reason_contains: preempted by j3}
        - expect_status: {vc: b, guaranteed_used_gpus: 8}
        - expect_invariants: {}
    """)
    result = run_scenario(path)
    assert result.cycles == 3
    assert result.engine.jobs["j3"].phase.value == "running"  # confirmed automatically


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ("expect_bound: {job: j1, class: borrowed}", "expected j1 to run as borrowed"),
        ("expect_bound: {job: j1, gpus: 4}", "to hold 4 GPU(s), it holds 8"),
        ("expect_waiting: {job: j1}", "expected j1 to wait"),
        ("expect_rejected: {job: j1}", "expected j1 to be rejected"),
        ("expect_preempted: {jobs: [j1]}", "expected ['j1'] preempted"),
        ("expect_status: {vc: a, guaranteed_used_gpus: 3}", "expected guaranteed_used_gpus = 3, got 8"),
        ("expect_bound: {job: j1, within_cell: n1}", "expected j1 inside cell n1"),
    ],
)
def test_a_false_expectation_fails_with_file_and_step(tmp_path: Path, step: str, expected: str) -> None:
    path = write(tmp_path, f"""\
        - at: 0
          submit: {{name: j1, vc: a, gpus: 8}}
        - expect_bound: {{job: j1, node_in: [n0]}}
        - {step}
    """)
    with pytest.raises(ScenarioFailure) as info:
        run_scenario(path)
    message = str(info.value)
    assert str(path) in message
    assert "steps[2]" in message
    assert expected in message
    assert info.value.step == 2


def test_reason_mismatch_quotes_the_explanation(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        - submit: [{name: j1, vc: a, gpus: 8}, {name: j2, vc: a, gpus: 8}, {name: j3, vc: a, gpus: 8}]
        - expect_waiting: {job: j3, reason_contains: "cosmic rays"}
    """)
    with pytest.raises(ScenarioFailure, match=r"steps\[1\] \(expect_waiting\): the reason for j3 lacks"):
        run_scenario(path)


@pytest.mark.parametrize(
    ("steps", "match"),
    [
        ("- launch: {name: j1}\n", r"steps\[0\].*exactly one action, found launch"),
        ("- submit: {name: j1, vc: a, gpus: lots}\n", r"steps\[0\] \(submit\).*gpus must be an integer"),
        ("- submit: {name: j1, vc: a, gpus: 8, colour: red}\n", r"steps\[0\] \(submit\).*unknown key\(s\) colour"),
        ("- submit: {name: j1, vc: a, gpus: 8, members: 0}\n", r"steps\[0\] \(submit\)"),
        ("- expect_bound: {job: j1, shiny: true}\n", r"steps\[0\] \(expect_bound\).*unknown key\(s\) shiny"),
        ("- submit: {name: j1, vc: a, gpus: 1}\n- expect_bound: {job: nope}\n",
         r"steps\[1\] \(expect_bound\).*no job named 'nope'"),
        ("- at: 5\n  schedule: {}\n- at: 1\n  schedule: {}\n", r"steps\[1\].*time goes backwards"),
        ("- submit: {name: j1, vc: a, gpus: 1}\n- finish: {job: j1}\n", r"steps\[1\] \(finish\).*not running"),
        ("- expect_status: {vc: a, happiness: 1}\n", r"steps\[0\] \(expect_status\).*unknown status key"),
        ("- mark_node_bad: {node: n7}\n", r"steps\[0\] \(mark_node_bad\).*unknown node 'n7'"),
        ("- submit: {name: j1, vc: a, topology: galaxy, gpus: 1}\n", r"steps\[0\] \(submit\).*topology level"),
        ("- submit: {name: j1, vc: a, gpus: 1, members: 2, min: 3}\n", r"steps\[0\] \(submit\): job 'j1'.*minimum 3"),
        ("- reload_config: {virtualClusters: {a: {gpus: 99}}}\n", r"steps\[0\] \(reload_config\).*cannot all be met"),
    ],
)
def test_a_malformed_step_names_file_and_step(tmp_path: Path, steps: str, match: str) -> None:
    path = write(tmp_path, steps, name="bad.yaml")
    with pytest.raises((ScenarioFailure, InvalidInputError), match=match) as info:
        run_scenario(path)
    assert "bad.yaml" in str(info.value)


@pytest.mark.parametrize(
    ("head", "match"),
    [
        (BASE.replace("policy: kubecell", "policy: anarchy"), "unknown policy 'anarchy'"),
        (BASE.replace("policy: kubecell", "policy: kubecell\noptions: {warp_speed: 9}"), "unknown key.*warp_speed"),
        (BASE.replace("a: {gpus: 8}", "a: {gpus: 99}"), "tenants.*cannot all be met"),
        (BASE.replace("model: V100M32", "model: Z80"), "unknown GPU model 'Z80'"),
        (BASE.replace("name: probe\n", ""), "missing key.*name"),
        (BASE.replace("policy: kubecell", "policy: kubecell\noptions: {borrowing: maybe}"), "borrowing must be true"),
        (BASE.replace("policy: kubecell", "policy: kubecell\noptions: {max_preemptions: 2.5}"), "must be an integer"),
    ],
)
def test_a_malformed_header_names_the_file(tmp_path: Path, head: str, match: str) -> None:
    path = write(tmp_path, "- schedule: {}\n", name="header.yaml", head=head)
    with pytest.raises(InvalidInputError, match=match) as info:
        load_scenario(path)
    assert "header.yaml" in str(info.value)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"broken\.yaml:\d+: not valid YAML"):
        load_scenario(path)


def test_an_engine_crash_is_a_scenario_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(self: Engine, now: float) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(Engine, "schedule", explode)
    path = write(tmp_path, "- submit: {name: j1, vc: a, gpus: 1}\n- schedule: {}\n")
    with pytest.raises(ScenarioFailure, match=r"steps\[1\] \(schedule\): the engine raised RuntimeError: boom"):
        run_scenario(path)


def test_unconfirmed_preemptor_stays_reserved(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        - at: 0
          submit: [{name: a1, vc: a, gpus: 8}, {name: a2, vc: a, gpus: 8}]
        - expect_bound: {job: a2, class: borrowed}
        - at: 1
          submit: {name: b1, vc: b, gpus: 8}
        - schedule: {confirm: false}
        - expect_phase: {job: b1, phase: reserved}
        - confirm: {job: b1}
        - expect_phase: {job: b1, phase: running}
    """)
    run_scenario(path)


def test_cycle_false_inspects_state_before_the_engine_reacts(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        - submit: {name: j1, vc: a, gpus: 8}
        - cycle: false
          expect_phase: {job: j1, phase: pending}
        - expect_phase: {job: j1, phase: running}
    """)
    assert run_scenario(path).cycles == 1


def test_options_override_the_preset(tmp_path: Path) -> None:
    head = BASE.replace("policy: kubecell", "policy: quota\noptions: {starvation_seconds: 30, borrowing: false}")
    scenario = load_scenario(write(tmp_path, "- schedule: {}\n", head=head))
    assert scenario.options.name == "quota"
    assert scenario.options.starvation_seconds == 30.0
    assert scenario.options.borrowing is False
    head = BASE.replace("policy: kubecell", "policy: kubecell\noptions: {starvation_seconds: null}")
    assert load_scenario(write(tmp_path, "- schedule: {}\n", head=head)).options.starvation_seconds is None


def test_parse_scenario_accepts_explicit_nodes_and_known_failure() -> None:
    text = (BASE.replace("  nodeGroups:\n", "  nodes:\n")
            .replace("{count: 2, namePrefix: n, nameDigits: 1, gpu: {model: V100M32, count: 8}",
                     "{name: big, rack: r1, gpu: {model: A100, count: 8}")
            .replace("a: {gpus: 8}", "a: {cells: {A100x8/node: 1}}")
            .replace("    b: {gpus: 8}\n", "") + "  - schedule: {}\nknown_failure: the engine is wrong\n")
    scenario = parse_scenario(YamlDocument("inline.yaml", text))
    assert [n.name for n in scenario.nodes] == ["big"]
    assert scenario.known_failure == "the engine is wrong"
