"""Dialects side by side (``kubecell.kube.dialects.pod``): one request written in any dialect is the same core
Request, and where a pod carries several dialects they must agree: the same GPU ask, overlapping model
filters, one group with the same numbers, one VC, one priority. Also: the entry point's tables name every
dialect that states an aspect."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import Request
from kubecell.kube.dialects import DialectOptions, GroupDemand, pod, pod_demand
from kubecell.kube.dialects.statement import Statement
from tests.kube.dialect_support import HIVED, make_pod, refused, shape

# ---------------------------------------------------------------- the headline property

HALF_GPU = {
    "kubecell milli": make_pod({"kubecell.io/gpu-milli": "500"}),
    "HAMi cores": make_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}),
    "KubeShare request": make_pod(labels={"sharedgpu/gpu_request": "0.5"}),
    "KubeShare request and limit": make_pod(labels={"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_limit": "1.0"}),
}
TWO_WHOLE_GPUS = {
    "kubecell": make_pod({"kubecell.io/gpu": "2"}),
    "nvidia": make_pod({"nvidia.com/gpu": "2"}),
    "HAMi all cores": make_pod({"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"}),
    "HAMi all memory": make_pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100"}),
    "HiveD": make_pod(annotations={HIVED: "virtualCluster: vc1\nleafCellNumber: 2\n"}),
    "HiveD old keys": make_pod(annotations={HIVED: "virtualCluster: vc1\ngpuNumber: 2\n"}),
    "KubeShare": make_pod(labels={"sharedgpu/gpu_request": "2", "sharedgpu/gpu_limit": "2"}),
}
FOUR_GIB = {
    "kubecell MiB": make_pod({"kubecell.io/gpu-memory": "4096"}),
    "kubecell Gi quantity": make_pod({"kubecell.io/gpu-memory": "4Ki"}),
    "Aliyun GiB": make_pod({"aliyun.com/gpu-mem": "4"}),
    "HAMi gpumem": make_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
    "KubeShare bytes": make_pod(labels={"sharedgpu/gpu_mem": str(4 * 2**30)}),
}


@pytest.mark.parametrize(("cases", "expected"), [
    (HALF_GPU, Request("default/p1", 2000, 4096, 1, 500, 0)),
    (TWO_WHOLE_GPUS, Request("default/p1", 2000, 4096, 2, 1000, 0)),
    (FOUR_GIB, Request("default/p1", 2000, 4096, 1, 0, 4096)),
], ids=["half a GPU", "two whole GPUs", "a 4 GiB memory share"])
def test_the_same_request_in_every_dialect_is_the_same_core_request(
        cases: dict[str, dict[str, Any]], expected: Request) -> None:
    got = {dialect: pod_demand(pod).request for dialect, pod in cases.items()}
    assert got == dict.fromkeys(cases, expected)


def test_aliyun_in_mib_units_is_the_same_memory_share() -> None:
    options = DialectOptions(aliyun_memory_unit="MiB")
    assert pod_demand(make_pod({"aliyun.com/gpu-mem": "4096"}), options=options).request == \
        pod_demand(FOUR_GIB["kubecell MiB"]).request


def test_each_pod_reports_the_dialect_it_came_from() -> None:
    assert pod_demand(HALF_GPU["HAMi cores"]).dialects == ("hami",)
    assert pod_demand(TWO_WHOLE_GPUS["nvidia"]).dialects == ("nvidia",)
    assert pod_demand(TWO_WHOLE_GPUS["HiveD"]).dialects == ("hived",)
    assert pod_demand(FOUR_GIB["Aliyun GiB"]).dialects == ("aliyun",)
    assert pod_demand(FOUR_GIB["KubeShare bytes"]).dialects == ("kubeshare",)
    assert pod_demand(make_pod({"kubecell.io/gpu": "2", "nvidia.com/gpu": "2"})).dialects == ("kubecell", "nvidia")


def test_zero_gpu_counts_mean_no_gpu() -> None:
    assert shape(pod_demand(make_pod({"nvidia.com/gpu": "0", "kubecell.io/gpu": 0})).request) == (0, 0, 0)


# ---------------------------------------------------------------- GPU asks must agree

def test_agreeing_dialects_are_accepted_and_disagreeing_ones_refused() -> None:
    both = pod_demand(make_pod({"kubecell.io/gpu-memory": "4096", "aliyun.com/gpu-mem": "4"}))
    assert shape(both.request) == (1, 0, 4096)
    assert both.dialects == ("kubecell", "aliyun")
    refused(make_pod({"kubecell.io/gpu-milli": "500", "aliyun.com/gpu-mem": "4"}),
            "kubecell.io/gpu-milli 500 and aliyun.com/gpu-mem 4:",
            "kubecell asks for 500 milli of one GPU but aliyun asks for 4096 MiB of one GPU")
    refused(make_pod({"kubecell.io/gpu": "2", "nvidia.com/gpu": "1"}), "kubecell.io/gpu 2 and nvidia.com/gpu 1")
    refused(make_pod({"kubecell.io/gpu-milli": "500"}, labels={"sharedgpu/gpu_request": "0.25"}),
            "500 milli of one GPU but kubeshare asks for 250 milli")


def test_alnair_and_kubecells_own_resources_must_agree() -> None:
    agreed = pod_demand(make_pod({"alnair/vgpu-compute": "25", "kubecell.io/gpu-milli": "250"}))
    assert agreed.dialects == ("kubecell", "alnair")
    refused(make_pod({"alnair/vgpu-compute": "25", "kubecell.io/gpu-milli": "500"}),
            "kubecell asks for 500 milli of one GPU but alnair asks for 250 milli of one GPU")


def test_hived_and_resources_must_agree() -> None:
    two = {HIVED: "virtualCluster: a\nleafCellNumber: 2\n"}
    agreed = pod_demand(make_pod({"nvidia.com/gpu": "2"}, annotations=two))
    assert agreed.dialects == ("nvidia", "hived")
    refused(make_pod({"kubecell.io/gpu": "4"}, annotations=two),
            f"kubecell.io/gpu 4 and annotation {HIVED}: leafCellNumber 2",
            "kubecell asks for 4 whole GPUs but hived asks for 2 whole GPUs")


@pytest.mark.parametrize(("gpu", "labels", "annotations", "text"), [
    # the first dialect of the ask order is named first, and its field is the error's
    ({"aliyun.com/gpu-mem": "4", "alnair/vgpu-memory": "2"}, {}, {},
     "pod default/p1: aliyun.com/gpu-mem 4 and alnair/vgpu-memory 2: aliyun asks for 4096 MiB of one GPU but alnair "
     "asks for 2048 MiB of one GPU (accepted: one GPU ask, or the same ask in every dialect on the pod)"),
    ({"nvidia.com/gpu": "1"}, {"sharedgpu/gpu_request": "2", "sharedgpu/gpu_limit": "2"}, {},
     'pod default/p1: nvidia.com/gpu 1 and label sharedgpu/gpu_request "2" with label sharedgpu/gpu_limit "2": '
     "nvidia asks for 1 whole GPU but kubeshare asks for 2 whole GPUs (accepted: one GPU ask, or the same ask in "
     "every dialect on the pod)"),
    ({}, {"sharedgpu/gpu_request": "1"}, {HIVED: "virtualCluster: a\nleafCellNumber: 2\n"},
     f'pod default/p1: label sharedgpu/gpu_request "1" and annotation {HIVED}: leafCellNumber 2: kubeshare asks for '
     "1 whole GPU but hived asks for 2 whole GPUs (accepted: one GPU ask, or the same ask in every dialect on the "
     "pod)"),
])
def test_disagreeing_asks_are_told_in_full(gpu: dict[str, str], labels: dict[str, str],
                                           annotations: dict[str, str], text: str) -> None:
    assert refused(make_pod(gpu, labels=labels, annotations=annotations)) == text


# ---------------------------------------------------------------- model filters intersect

def test_model_filters_of_several_dialects_intersect() -> None:
    demand = pod_demand(make_pod({"nvidia.com/gpu": "1"}, annotations={
        "kubecell.io/gpu-models": "A100,T4", "nvidia.com/use-gputype": "A100"}))
    assert demand.request.gpu_models == frozenset({"A100"})
    refused(make_pod({"nvidia.com/gpu": "1"}, annotations={
        "kubecell.io/gpu-models": "T4", "nvidia.com/use-gputype": "A100"}),
        'annotation kubecell.io/gpu-models "T4" and annotation nvidia.com/use-gputype "A100"', "no GPU model in common")


def test_model_filters_of_kubeshare_and_hived_intersect() -> None:
    demand = pod_demand(make_pod(labels={"sharedgpu/gpu_model": "NVIDIA-A100-SXM4-80GB"},
                                 annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\nleafCellType: a100\n"}))
    assert demand.request.gpu_models == frozenset({"A100-80G"})
    assert demand.dialects == ("kubeshare", "hived")
    refused(make_pod(labels={"sharedgpu/gpu_model": "Tesla-T4"},
                     annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\nleafCellType: A100\n"}),
            "kubeshare and hived allow no GPU model in common")


# ---------------------------------------------------------------- groups must agree

PG = {("default", "g"): {"minMember": 4}}


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


def test_a_gang_is_credited_to_the_first_source_that_claims_it() -> None:
    hived_and_kubeshare = make_pod(
        labels={"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "3", "sharedgpu/group_threshold": "1"},
        annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\naffinityGroup: {name: g, members: "
                            "[{podNumber: 3, leafCellNumber: 1}]}\n"})
    demand = pod_demand(hived_and_kubeshare)
    assert demand.group == GroupDemand("default/g", "hived", 3, 3)
    assert demand.dialects == ("kubeshare", "hived")
    waiting = pod_demand(make_pod(annotations={"pod-group-name": "g", "scheduling.k8s.io/group-name": "g"}))
    assert waiting.group == GroupDemand("default/g", "volcano", None, None, "PodGroup default/g")
    assert waiting.dialects == ("volcano", "kai")


@pytest.mark.parametrize(("labels", "annotations", "pod_groups", "fragments"), [
    ({"scheduling.x-k8s.io/pod-group": "g"}, {"kubecell.io/group": "h", "kubecell.io/group-size": "2"}, PG,
     ('annotation kubecell.io/group "h" and label scheduling.x-k8s.io/pod-group "g"', "name different groups")),
    ({}, {"scheduling.k8s.io/group-name": "g", "pod-group-name": "h"}, PG,
     ("volcano and kai name different groups",)),
    ({"scheduling.x-k8s.io/pod-group": "g"}, {"kubecell.io/group": "g", "kubecell.io/group-size": "3"}, PG,
     ("the minimum 4 (coscheduling) is above the headcount 3 (kubecell)",)),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "4", "sharedgpu/group_threshold": "1"},
     {HIVED: "virtualCluster: a\nleafCellNumber: 1\naffinityGroup: {name: g, members: [{podNumber: 3, "
             "leafCellNumber: 1}]}\n"}, {},
     ("hived states a headcount of 3 but kubeshare of 4",)),
    # added with the cut by dialect
    ({"kai.scheduler/subgroup-name": "w"},
     {"pod-group-name": "g", HIVED: "virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: g, members: "
                                    "[{podNumber: 1, leafCellNumber: 2}, {podNumber: 1, leafCellNumber: 8}]}\n"},
     {("default", "g"): {"minMember": 2, "subGroups": [{"name": "w", "minMember": 1}]}},
     ("hived puts the pod in member group '2gpu' but kai in 'w'",)),
])
def test_group_refusals(labels: dict[str, str], annotations: dict[str, str],
                        pod_groups: dict[tuple[str, str], dict[str, Any]], fragments: tuple[str, ...]) -> None:
    refused(make_pod(labels=labels, annotations=annotations), *fragments, pod_groups=pod_groups)


# ---------------------------------------------------------------- VCs and priorities must agree

def test_hived_vc_and_priority_must_agree_with_kubecells() -> None:
    same = make_pod(annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\npriority: -1\n",
                                 "kubecell.io/vc": "a", "kubecell.io/opportunistic": "true"})
    assert (pod_demand(same).vc, pod_demand(same).priority) == ("a", -1)
    refused(make_pod(annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\n", "kubecell.io/vc": "b"}),
            'annotation kubecell.io/vc "b"', "name different virtual clusters")
    refused(make_pod(annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\npriority: 5\n",
                                  "kubecell.io/opportunistic": "true"}),
            "kubecell states priority -1 but hived states 5")


def test_the_vc_disagreement_is_told_in_full() -> None:
    text = refused(make_pod(annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\n", "kubecell.io/vc": " b "}))
    assert text == (f'pod default/p1: annotation kubecell.io/vc "b" and {HIVED}: virtualCluster "a": name different '
                    "virtual clusters (accepted: one virtual cluster, named the same in both)")


def test_priorities_stated_by_two_dialects_must_agree() -> None:
    refused(make_pod(labels={"sharedgpu/gpu_request": "1", "sharedgpu/priority": "0"},
                     annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\npriority: 3\n"}),
            "hived states priority 3 but kubeshare states -1")


def test_a_stated_priority_wins_over_the_pods_own() -> None:
    demand = pod_demand(make_pod(labels={"sharedgpu/gpu_request": "1", "sharedgpu/priority": "9"}, priority=40))
    assert demand.priority == 9
    agreed = pod_demand(make_pod(labels={"sharedgpu/gpu_request": "1", "sharedgpu/priority": "0"},
                                 annotations={"kubecell.io/opportunistic": "true"}, priority=40))
    assert (agreed.priority, agreed.dialects) == (-1, ("kubecell", "kubeshare"))


@pytest.mark.parametrize(("priority", "fragments"), [
    (True, ("spec.priority True:", "not a whole number")),
    ("7", ("spec.priority '7':", "not a whole number")),
    (2**31, ("spec.priority 2147483648:", "beyond the API's int32")),
])
def test_the_pods_own_priority_must_be_an_int32(priority: object, fragments: tuple[str, ...]) -> None:
    refused(make_pod(priority=priority), *fragments)


def test_negative_pod_priority_other_than_opportunistic_is_refused() -> None:
    assert pod_demand(make_pod(priority=-1)).priority == -1
    refused(make_pod(priority=-5), "spec.priority -5:", "below -1")


# ---------------------------------------------------------------- the entry point's tables

ASPECTS = {"ask": pod.ASKS, "models": pod.MODEL_FILTERS, "groups": pod.GROUPS, "vc": pod.VCS,
           "priority": pod.PRIORITIES}


def test_every_dialect_is_asked_each_aspect_it_states_and_only_those() -> None:
    """A dialect module that states an aspect (overrides its ``Statement`` method) must be in that aspect's
    table in ``pod``, or what it states would never be read; one that does not state it must not be there."""
    statements: dict[str, type[Statement]] = {}
    for read in pod.READERS:
        cls = next(c for c in Statement.__subclasses__() if c.__module__ == read.__module__)
        statements[cls.dialect] = cls
    assert len(statements) == len(pod.READERS), "one statement class per dialect module"
    for aspect, order in ASPECTS.items():
        stating = {name for name, cls in statements.items() if getattr(cls, aspect) is not getattr(Statement, aspect)}
        assert set(order) == stating, aspect
        assert len(order) == len(set(order)), aspect
