"""HiveD's dialect (``kubecell.kube.dialects.hived``): its pod-scheduling-spec annotation (virtual cluster,
priority, whole GPUs, GPU type, affinity group), what its reader states, and every malformed spec."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.inputs.bounded_yaml import YamlRefused
from kubecell.kube.dialects import GroupDemand, pod_demand
from kubecell.kube.dialects.hived import _SpecLoader, read
from tests.kube.dialect_support import HIVED, make_pod, refused, shape, states


def hived(text: str, gpu: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
    return make_pod(gpu, annotations={HIVED: text, **kwargs.pop("annotations", {})}, **kwargs)


def test_hived_spec_gives_vc_priority_whole_gpus_model_and_group() -> None:
    demand = pod_demand(hived("""
virtualCluster: vc1
priority: 100
leafCellType: V100
leafCellNumber: 4
lazyPreemptionEnable: true
affinityGroup:
  name: job-1
  members:
  - podNumber: 2
    leafCellNumber: 4
  - {podNumber: 1, gpuNumber: 4}
"""))
    assert (demand.vc, demand.priority) == ("vc1", 100)
    assert shape(demand.request) == (4, 1000, 0)
    assert demand.request.gpu_models == frozenset({"V100M16", "V100M32"})
    assert demand.group == GroupDemand("default/job-1", "hived", 3, 3)
    assert demand.dialects == ("hived",)


def test_hived_opportunistic_and_unstated_priority() -> None:
    assert pod_demand(hived("virtualCluster: a\nleafCellNumber: 1\npriority: -1\n")).opportunistic
    assert pod_demand(hived("virtualCluster: a\nleafCellNumber: 1\n", priority=12)).priority == 12


@pytest.mark.parametrize(("text", "expected"), [
    ("virtualCluster: a\nleafCellNumber: 1\n", ("a", 0, (1, 1000, 0), None)),
    ("virtualCluster: ' b '\nleafCellNumber: 8\npriority: 1000\n", ("b", 1000, (8, 1000, 0), None)),
    ("virtualCluster: a\ngpuNumber: 2\ngpuType: T4\n", ("a", 0, (2, 1000, 0), frozenset({"T4"}))),
    ("virtualCluster: a\nleafCellNumber: 2\ngpuNumber: 2\n", ("a", 0, (2, 1000, 0), None)),  # both names agree
    ("virtualCluster: a\nleafCellNumber: 1\nleafCellType: ''\n", ("a", 0, (1, 1000, 0), None)),  # empty: any
    ("virtualCluster: a\nleafCellNumber: 1\nleafCellType: a100\n", ("a", 0, (1, 1000, 0),
                                                                     frozenset({"A100", "A100-80G"}))),
    ("{virtualCluster: a, leafCellNumber: 1, gangReleaseEnable: true, ignoreK8sSuggestedNodes: false}",
     ("a", 0, (1, 1000, 0), None)),
    ("virtualCluster: a\nleafCellNumber: 1\npinnedCellId: ''\n", ("a", 0, (1, 1000, 0), None)),  # empty: no pin
])
def test_hived_specs_accepted(text: str, expected: tuple[str, int, tuple[int, int, int], frozenset[str] | None]
                              ) -> None:
    demand = pod_demand(hived(text))
    assert (demand.vc, demand.priority, shape(demand.request), demand.request.gpu_models) == expected
    assert demand.group is None
    assert demand.dialects == ("hived",)


@pytest.mark.parametrize(("text", "expected"), [
    ("virtualCluster: a\nleafCellNumber: 2\n", {"ask": ("hived", (2, 1000, 0)), "vc": "a"}),
    ("virtualCluster: a\nleafCellNumber: 1\npriority: -1\nleafCellType: T4\n",
     {"ask": ("hived", (1, 1000, 0)), "vc": "a", "priority": -1, "models": [frozenset({"T4"})]}),
    ("virtualCluster: a\nleafCellNumber: 1\naffinityGroup: {name: g, members: [{podNumber: 3, leafCellNumber: 1}]}",
     {"ask": ("hived", (1, 1000, 0)), "vc": "a", "groups": [("hived", "g", 3, 3)]}),
])
def test_what_hived_states(text: str, expected: dict[str, Any]) -> None:
    assert states(read, hived(text)) == expected
    assert states(read, make_pod({"nvidia.com/gpu": "1"})) == {}


@pytest.mark.parametrize(("text", "fragments"), [
    ("virtualCluster: a\nleafCellNumber: [1\n", ("is not valid YAML at line",)),
    ("", ("must be a mapping of keys to values, got nothing",)),
    ("leafCellNumber: 1\n", ("virtualCluster: is missing or empty",)),
    ("virtualCluster: a\n", ("leafCellNumber: is missing",)),
    ("virtualCluster: a\nleafCellNumber: 0\n", ("leafCellNumber: 0 is out of range", "1..64")),
    ("virtualCluster: a\nleafCellNumber: two\n", ("leafCellNumber: must be a whole number, got 'two'",)),
    ("virtualCluster: a\nleafCellNumber: true\n", ("leafCellNumber: must be a whole number, got True",)),
    ("virtualCluster: a\nleafCellNumer: 1\n", ("leafCellNumer: unknown key", "leafCellNumber")),
    ("virtualCluster: a\nleafCellNumber: 1\npriority: 2000\n", ("priority: 2000 is out of range", "-1..1000")),
    ("virtualCluster: a\nleafCellNumber: 1\npinnedCellId: vc-a-pin\n", ("pinnedCellId:", "cannot pin")),
    ("virtualCluster: a\nleafCellNumber: 2\ngpuNumber: 3\n", ("gpuNumber: says 3 but leafCellNumber says 2",)),
    ("virtualCluster: a\nleafCellNumber: 2\nleafCellType: B300\n", ("leafCellType \"B300\":", "no GPU model")),
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {members: [{podNumber: 1, leafCellNumber: 2}]}\n",
     ("affinityGroup.name: is missing",)),
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: g, members: []}\n",
     ("affinityGroup.members: must be a non-empty list",)),
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: g, members: [{podNumber: 2, leafCellNumber: 4}]}\n",
     ("no member asks for this pod's leafCellNumber 2",)),
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: g, members: [{podNumber: 0, leafCellNumber: 2}]}\n",
     ("affinityGroup.members[0].podNumber: 0 is out of range",)),
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: g, members: [{pods: 1, leafCellNumber: 2}]}\n",
     ("affinityGroup.members[0].pods: unknown key", "podNumber")),
    # added with the cut by dialect
    ("virtualCluster: a\nleafCellNumber: 1\nleafCellType: [V100]\n", ("leafCellType: must be text",)),
    ("virtualCluster: a\nleafCellNumber: 1\naffinityGroup: [g]\n", ("affinityGroup: must be a mapping",)),
    ("virtualCluster: " + "v" * 254 + "\nleafCellNumber: 1\n", ("is 254 characters long", "at most 253")),
    ("a: &x 1\nb: *x\n", ("HiveD's keys in plain YAML", "without aliases")),
    ("[" * 40 + "]" * 40, ("HiveD's keys in plain YAML",)),
    ("virtualCluster: a\nleafCellNumber: 1\nx: [" + ", ".join(["1"] * 1300) + "]\n",
     ("holds more than 256 values", "HiveD's keys in plain YAML")),
])
def test_malformed_hived_specs_are_refused(text: str, fragments: tuple[str, ...]) -> None:
    refused(hived(text), f"annotation {HIVED}", *fragments)


def test_a_hived_group_of_several_gpu_counts_is_a_gang_of_member_groups() -> None:
    """HiveD's affinity group with members of different leafCellNumbers: each GPU count is one member group,
    sized by its podNumber and all or nothing (issue 20: kubecell used to refuse it)."""
    text = ("virtualCluster: a\nleafCellNumber: {n}\naffinityGroup:\n  name: g\n  members:\n"
            "  - {{podNumber: 2, leafCellNumber: 2}}\n  - {{podNumber: 1, leafCellNumber: 8}}\n")
    small, big = pod_demand(hived(text.format(n=2))).group, pod_demand(hived(text.format(n=8))).group
    assert small is not None
    assert big is not None
    assert (small.key, small.size, small.minimum) == (big.key, 3, 3)
    assert (small.part, small.part_size, small.part_minimum) == ("2gpu", 2, 2)
    assert (big.part, big.part_size, big.part_minimum) == ("8gpu", 1, 1)
    alone = pod_demand(hived("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: g, members: "
                             "[{podNumber: 3, leafCellNumber: 2}]}\n")).group
    assert alone is not None
    assert alone.part is None, "one GPU count: a homogeneous gang, exactly as before"


def test_the_largest_hived_spec_a_user_needs_is_read_and_a_bigger_one_is_refused_before_it_is_read_whole() -> None:
    """Every HiveD key and 30 member shapes fit the value bound (MAX_SPEC_NODES); the loader's time is per value,
    so a spec of thousands of values (16 KiB of them took PyYAML 0.2-0.4 s per pod read) is refused once it passes
    the bound."""
    members = ", ".join(f"{{podNumber: 1, leafCellNumber: {1 + i % 8}}}" for i in range(30))
    spec = ("virtualCluster: a\npriority: 10\nleafCellType: A100\nleafCellNumber: 2\ngangReleaseEnable: false\n"
            "lazyPreemptionEnable: true\nignoreK8sSuggestedNodes: true\n"
            f"affinityGroup: {{name: big, members: [{members}]}}\n")
    demand = pod_demand(hived(spec))
    assert isinstance(demand.group, GroupDemand)
    assert demand.group.size == 30
    loader = _SpecLoader("a: [" + ", ".join(["1"] * 5000) + "]")  # the loader alone: past the length bound
    with pytest.raises(YamlRefused, match="holds more than 256 values"):
        loader.get_single_data()
    assert loader.index < len("a: [" + "1, " * 300), f"the loader read {loader.index} characters, past the bound"
