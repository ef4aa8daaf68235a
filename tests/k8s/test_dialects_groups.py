"""Gangs and HiveD: HiveD's pod-scheduling-spec (virtual cluster, priority, GPUs, affinity group) and the
PodGroup sources (coscheduling, Volcano, KAI) beside kubecell's group annotations, with every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.k8s.dialects import GroupDemand, pod_demand
from tests.k8s.dialect_support import HIVED, make_pod, refused, shape

# ---------------------------------------------------------------- HiveD

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


def test_volcano_tasks_and_kai_subgroups_are_member_groups() -> None:
    volcano = pod_demand(make_pod({}, annotations={"scheduling.k8s.io/group-name": "vj",
                                                   "volcano.sh/task-spec": "ps"}),
                         pod_groups={("default", "vj"): {"minMember": 3, "minTaskMember": {"ps": 1, "worker": 2}}})
    assert volcano.group is not None
    assert (volcano.group.part, volcano.group.part_minimum, volcano.group.minimum) == ("ps", 1, 3)
    kai = pod_demand(make_pod({}, labels={"kai.scheduler/subgroup-name": "workers"},
                              annotations={"pod-group-name": "kj"}),
                     pod_groups={("default", "kj"): {"minMember": 3, "subGroups": [
                         {"name": "leader", "minMember": 1}, {"name": "workers", "minMember": 2}]}})
    assert kai.group is not None
    assert (kai.group.part, kai.group.part_minimum) == ("workers", 2)


@pytest.mark.parametrize(("labels", "annotations", "spec", "fragments"), [
    ({}, {"scheduling.k8s.io/group-name": "g", "volcano.sh/task-spec": "w"}, {"minMember": 2, "minTaskMember": [1]},
     ("spec.minTaskMember", "not a mapping")),
    ({}, {"scheduling.k8s.io/group-name": "g", "volcano.sh/task-spec": "w"}, {"minMember": 2, "minTaskMember":
                                                                              {"w": "9" * 5000}},
     ("spec.minTaskMember.w", "0..")),
    ({"kai.scheduler/subgroup-name": "w"}, {"pod-group-name": "g"}, {"minMember": 2, "subGroups": "x"},
     ("spec.subGroups",)),
    ({"kai.scheduler/subgroup-name": "w"}, {"pod-group-name": "g"}, {"minMember": 2, "subGroups": [{"name": "a"}]},
     ("does not list", "a")),
    ({"kai.scheduler/subgroup-name": "w"}, {"pod-group-name": "g"},
     {"minMember": 2, "subGroups": [{"name": "w", "minMember": -1}]}, ("minMember", "-1")),
])
def test_hostile_member_groups_are_refused(labels: dict[str, str], annotations: dict[str, str],
                                           spec: dict[str, object], fragments: tuple[str, ...]) -> None:
    refused(make_pod({}, labels=labels, annotations=annotations), *fragments, pod_groups={("default", "g"): spec})


def test_hived_and_resources_must_agree() -> None:
    agreed = pod_demand(hived("virtualCluster: a\nleafCellNumber: 2\n", {"nvidia.com/gpu": "2"}))
    assert agreed.dialects == ("nvidia", "hived")
    refused(hived("virtualCluster: a\nleafCellNumber: 2\n", {"kubecell.io/gpu": "4"}),
            f"kubecell.io/gpu 4 and annotation {HIVED}: leafCellNumber 2",
            "kubecell asks for 4 whole GPUs but hived asks for 2 whole GPUs")


def test_hived_vc_and_priority_must_agree_with_kubecells() -> None:
    same = hived("virtualCluster: a\nleafCellNumber: 1\npriority: -1\n",
                 annotations={"kubecell.io/vc": "a", "kubecell.io/opportunistic": "true"})
    assert (pod_demand(same).vc, pod_demand(same).priority) == ("a", -1)
    refused(hived("virtualCluster: a\nleafCellNumber: 1\n", annotations={"kubecell.io/vc": "b"}),
            'annotation kubecell.io/vc "b"', "name different virtual clusters")
    refused(hived("virtualCluster: a\nleafCellNumber: 1\npriority: 5\n",
                  annotations={"kubecell.io/opportunistic": "true"}),
            "kubecell states priority -1 but hived states 5")


# ---------------------------------------------------------------- PodGroup sources

PG = {("default", "g"): {"minMember": 4}}


@pytest.mark.parametrize(("labels", "annotations", "source"), [
    ({"scheduling.x-k8s.io/pod-group": "g"}, {}, "coscheduling"),
    ({}, {"scheduling.k8s.io/group-name": "g"}, "volcano"),
    ({}, {"scheduling.volcano.sh/group-name": "g"}, "volcano"),
    ({}, {"pod-group-name": "g"}, "kai"),
])
def test_podgroup_sources(labels: dict[str, str], annotations: dict[str, str], source: str) -> None:
    pod = make_pod(labels=labels, annotations=annotations)
    demand = pod_demand(pod, pod_groups=PG)
    assert demand.group == GroupDemand("default/g", source, None, 4)
    assert demand.dialects == (source,)
    assert pod_demand(pod).group == GroupDemand("default/g", source, None, None, "PodGroup default/g")


def test_kai_reads_its_group_from_the_annotation_only() -> None:
    assert pod_demand(make_pod(labels={"pod-group-name": "g"}), pod_groups=PG).group is None


def test_group_keys_are_namespaced() -> None:
    pod = make_pod(labels={"scheduling.x-k8s.io/pod-group": "g"}, namespace="team-b")
    demand = pod_demand(pod, pod_groups=PG)  # the PodGroup of another namespace is not this pod's
    assert demand.group == GroupDemand("team-b/g", "coscheduling", None, None, "PodGroup team-b/g")
    assert demand.pod == "team-b/p1"


def test_podgroup_without_min_member_asks_no_gang() -> None:
    demand = pod_demand(make_pod(annotations={"pod-group-name": "g"}), pod_groups={("default", "g"): {}})
    assert demand.group == GroupDemand("default/g", "kai", None, 1)


def test_kubecell_group_and_podgroup_together() -> None:
    notes = {"kubecell.io/group": "g", "kubecell.io/group-size": "6", "kubecell.io/group-min": "4"}
    pod = make_pod(labels={"scheduling.x-k8s.io/pod-group": "g"}, annotations=notes)
    assert pod_demand(pod, pod_groups=PG).group == GroupDemand("default/g", "kubecell", 6, 4)
    # the PodGroup not seen yet: kubecell's annotation already says all there is to know
    assert pod_demand(pod).group == GroupDemand("default/g", "kubecell", 6, 4)
    refused(pod, 'annotation kubecell.io/group "g" and label scheduling.x-k8s.io/pod-group "g"',
            "kubecell states a minimum of 4 but coscheduling of 5", pod_groups={("default", "g"): {"minMember": 5}})


def test_an_unstated_kubecell_minimum_is_the_podgroups() -> None:
    pod = make_pod(labels={"scheduling.x-k8s.io/pod-group": "g"},
                   annotations={"kubecell.io/group": "g", "kubecell.io/group-size": "6"})
    assert pod_demand(pod, pod_groups=PG).group == GroupDemand("default/g", "kubecell", 6, 4)


@pytest.mark.parametrize(("labels", "annotations", "pod_groups", "fragments"), [
    ({"scheduling.x-k8s.io/pod-group": "g"}, {"kubecell.io/group": "h", "kubecell.io/group-size": "2"}, PG,
     ('annotation kubecell.io/group "h" and label scheduling.x-k8s.io/pod-group "g"', "name different groups")),
    ({}, {"scheduling.k8s.io/group-name": "g", "pod-group-name": "h"}, PG,
     ("volcano and kai name different groups",)),
    ({"scheduling.x-k8s.io/pod-group": "g"}, {"kubecell.io/group": "g", "kubecell.io/group-size": "3"}, PG,
     ("the minimum 4 (coscheduling) is above the headcount 3 (kubecell)",)),
    ({"scheduling.x-k8s.io/pod-group": "g"}, {}, {("default", "g"): {"minMember": -2}},
     ("its PodGroup default/g has spec.minMember -2",)),
    ({"scheduling.x-k8s.io/pod-group": " "}, {}, PG, ('label scheduling.x-k8s.io/pod-group " "', "is empty")),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "4", "sharedgpu/group_threshold": "1"},
     {HIVED: "virtualCluster: a\nleafCellNumber: 1\naffinityGroup: {name: g, members: [{podNumber: 3, "
             "leafCellNumber: 1}]}\n"}, {},
     ("hived states a headcount of 3 but kubeshare of 4",)),
])
def test_group_refusals(labels: dict[str, str], annotations: dict[str, str],
                        pod_groups: dict[tuple[str, str], dict[str, Any]], fragments: tuple[str, ...]) -> None:
    refused(make_pod(labels=labels, annotations=annotations), *fragments, pod_groups=pod_groups)
