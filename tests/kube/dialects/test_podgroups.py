"""Gangs named through PodGroup objects (``kubecell.kube.dialects.podgroups``): scheduler-plugins
coscheduling, Volcano (with tasks) and KAI-Scheduler (with subgroups), and every malformed PodGroup."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube.dialects import GroupDemand, pod_demand
from kubecell.kube.dialects.podgroups import read
from tests.kube.dialect_support import make_pod, refused, states

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


@pytest.mark.parametrize(("labels", "annotations", "spec", "expected"), [
    # a task the PodGroup gives no minimum, or a PodGroup without minTaskMember: the task, no minimum of its own
    ({}, {"scheduling.k8s.io/group-name": "g", "volcano.sh/task-spec": "w"}, {"minMember": 2, "minTaskMember":
                                                                               {"ps": 1}}, ("w", None, 2)),
    ({}, {"scheduling.volcano.sh/group-name": "g", "volcano.sh/task-spec": " w "}, {"minMember": 2}, ("w", None, 2)),
    ({}, {"scheduling.k8s.io/group-name": "g", "volcano.sh/task-spec": "w"}, {"minTaskMember": {"w": 0}},
     ("w", 0, 1)),
    ({"kai.scheduler/subgroup-name": "w"}, {"pod-group-name": "g"}, {"minMember": 2, "subGroups": [{"name": "w"}]},
     ("w", None, 2)),
    # a part is read only in its own scheduler's PodGroup: a Volcano task beside a KAI group is no part
    ({}, {"pod-group-name": "g", "volcano.sh/task-spec": "w"}, {"minMember": 2}, (None, None, 2)),
    ({"kai.scheduler/subgroup-name": "w"}, {"scheduling.k8s.io/group-name": "g"}, {"minMember": 2},
     (None, None, 2)),
])
def test_member_groups_read(labels: dict[str, str], annotations: dict[str, str], spec: dict[str, Any],
                            expected: tuple[str | None, int | None, int]) -> None:
    group = pod_demand(make_pod(labels=labels, annotations=annotations), pod_groups={("default", "g"): spec}).group
    assert group is not None
    assert (group.part, group.part_minimum, group.minimum) == expected


@pytest.mark.parametrize(("labels", "annotations", "expected"), [
    ({}, {}, {}),
    ({"scheduling.x-k8s.io/pod-group": "g"}, {"scheduling.k8s.io/group-name": "g", "pod-group-name": "g"},
     {"groups": [("coscheduling", "g", None, 4), ("volcano", "g", None, 4), ("kai", "g", None, 4)]}),
    ({}, {"scheduling.volcano.sh/group-name": "h"}, {"groups": [("volcano", "h", None, None)]}),
    ({}, {"kubecell.io/group": "g", "kubecell.io/group-size": "2"}, {}),
])
def test_what_podgroups_state(labels: dict[str, str], annotations: dict[str, str], expected: dict[str, Any]) -> None:
    assert states(read, make_pod(labels=labels, annotations=annotations), pod_groups=PG) == expected


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


@pytest.mark.parametrize(("labels", "annotations", "pod_groups", "fragments"), [
    ({"scheduling.x-k8s.io/pod-group": "g"}, {}, {("default", "g"): {"minMember": -2}},
     ("its PodGroup default/g has spec.minMember -2",)),
    ({"scheduling.x-k8s.io/pod-group": " "}, {}, PG, ('label scheduling.x-k8s.io/pod-group " "', "is empty")),
    # added with the cut by dialect
    ({}, {"pod-group-name": "g"}, {("default", "g"): {"minMember": True}}, ("has spec.minMember True",)),
    ({}, {"scheduling.k8s.io/group-name": "g"}, {("default", "g"): ["minMember"]}, ("has a spec that is",
                                                                                    "not a mapping")),
    ({}, {"scheduling.k8s.io/group-name": "g" * 254}, {}, ("is 254 characters long",)),
    ({}, {"scheduling.k8s.io/group-name": "g", "volcano.sh/task-spec": " "}, PG,
     ('annotation volcano.sh/task-spec " "', "is empty")),
])
def test_podgroup_refusals(labels: dict[str, str], annotations: dict[str, str],
                           pod_groups: dict[tuple[str, str], Any], fragments: tuple[str, ...]) -> None:
    refused(make_pod(labels=labels, annotations=annotations), *fragments, pod_groups=pod_groups)
