"""The conformance-scenario format's ``groups:`` list: parsed into a heterogeneous gang, and every mistake
named with the scenario file, the step and the group."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubecell.core.engine.job import JobSpec, MemberGroup
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.testing.scenarios import load_scenario, run_scenario
from tests.core.engine.test_scenarios import write


def submitted(tmp_path: Path, job: str) -> JobSpec:
    scenario = load_scenario(write(tmp_path, f"- submit: {job}\n"))
    spec = scenario.steps[0].args[0]
    assert isinstance(spec, JobSpec)
    return spec


def test_groups_become_member_groups_with_their_defaults(tmp_path: Path) -> None:
    spec = submitted(tmp_path, "{name: mpi, vc: a, min: 5, topology: node, priority: 1, groups: ["
                               "{name: launcher, cpuMilli: 4000}, {name: worker, gpus: 8, members: 4, min: 2}, "
                               "{name: ps, milli: 250, gpuMemoryMiB: 1024, members: 2, min: 0, models: [V100M32]}, "
                               "{name: nv, gpus: 2, topology: nvlink}]}")
    assert spec.groups == (
        MemberGroup("launcher", Request("mpi", cpu_milli=4000), 1, 1),
        MemberGroup("worker", Request("mpi", gpu_count=8, gpu_milli=MILLI_PER_GPU), 4, 2),
        MemberGroup("ps", Request("mpi", gpu_count=1, gpu_milli=250, gpu_memory_mib=1024,
                                  gpu_models=frozenset({"V100M32"})), 2, 0),
        MemberGroup("nv", Request("mpi", gpu_count=2, gpu_milli=MILLI_PER_GPU, topology=TopologyLevel.NVLINK), 1, 1),
    )
    assert (spec.members, spec.minimum, spec.topology, spec.priority) == (8, 5, TopologyLevel.NODE, 1)
    assert list(spec.fill_order()) == [0, 1, 2, 7, 3, 4, 5, 6]  # launcher, 2 workers, nv; then the rest
    strict = submitted(tmp_path, "{name: s, vc: a, groups: [{name: l, cpuMilli: 1}, {name: w, gpus: 1, members: 3}]}")
    assert strict.minimum == strict.members == 4  # every group whole by default: all or nothing


@pytest.mark.parametrize(("job", "match"), [
    ("{name: j, vc: a, gpus: 8, groups: [{name: w, gpus: 8}]}", r"gpus given next to groups"),
    ("{name: j, vc: a, groups: []}", r"groups must be a non-empty list"),
    ("{name: j, vc: a, groups: [{gpus: 8}]}", r"groups\[0\].*missing key\(s\) name"),
    ("{name: j, vc: a, groups: [{name: w, gpus: 8, colour: red}]}", r"groups\[0\].*unknown key\(s\) colour"),
    ("{name: j, vc: a, groups: [{name: w, gpus: 8, members: 2, min: 3}]}",
     r"steps\[0\] \(submit\).*job 'j' group 'w'.*minimum 3"),
    ("{name: j, vc: a, groups: [{name: w, gpus: 8}, {name: w, cpuMilli: 1}]}", r"duplicate group name 'w'"),
    ("{name: j, vc: a, min: 1, groups: [{name: w, gpus: 8, members: 2}]}", r"total minimum 1 outside 2\.\.2"),
    ("{name: j, vc: a, groups: [{name: w, gpus: lots}]}", r"group 'w'.*gpus must be an integer"),
    ("{name: j, vc: a, groups: [{name: 7, gpus: 1}]}", r"name must be a string"),
])
def test_a_malformed_group_names_the_file_the_step_and_the_group(tmp_path: Path, job: str, match: str) -> None:
    path = write(tmp_path, f"- submit: {job}\n", name="bad.yaml")
    with pytest.raises(InvalidInputError, match=match) as info:
        load_scenario(path)
    assert "bad.yaml" in str(info.value)


def test_a_scenario_runs_a_heterogeneous_gang(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        - submit: {name: mpi, vc: a, groups: [{name: launcher, cpuMilli: 1000}, {name: worker, gpus: 4, members: 2}]}
        - expect_bound: {job: mpi, class: guaranteed, members: 3, gpus: 8}
    """)
    result = run_scenario(path)
    assert result.engine.jobs["mpi"].spec.heterogeneous
