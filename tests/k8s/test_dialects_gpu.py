"""The GPU resource and label dialects, a table of cases and every refusal per dialect: kubecell's own,
nvidia.com/gpu and HAMi, Aliyun gpushare, KubeShare."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import GPU_MODELS, TopologyLevel
from kubecell.k8s.dialects import DialectOptions, GroupDemand, pod_demand
from tests.k8s.dialect_support import make_pod, refused, shape

# ---------------------------------------------------------------- kubecell's own dialect

@pytest.mark.parametrize(("gpu", "expected"), [
    ({"kubecell.io/gpu-milli": "250"}, (1, 250, 0)),
    ({"kubecell.io/gpu-milli": "1"}, (1, 1, 0)),
    ({"kubecell.io/gpu-milli": "1000"}, (1, 1000, 0)),
    ({"kubecell.io/gpu-milli": "1k"}, (1, 1000, 0)),
    ({"kubecell.io/gpu-memory": "2048"}, (1, 0, 2048)),
    ({"kubecell.io/gpu-milli": "300", "kubecell.io/gpu-memory": "8192"}, (1, 300, 8192)),
    ({"kubecell.io/gpu": "3"}, (3, 1000, 0)),
    ({"kubecell.io/gpu": "1"}, (1, 1000, 0)),
])
def test_kubecell_resources(gpu: dict[str, str], expected: tuple[int, int, int]) -> None:
    demand = pod_demand(make_pod(gpu))
    assert shape(demand.request) == expected
    assert demand.dialects == ("kubecell",)


def test_kubecell_annotations() -> None:
    demand = pod_demand(make_pod({"kubecell.io/gpu": "4"}, annotations={
        "kubecell.io/vc": "team-a", "kubecell.io/topology": "NVLink", "kubecell.io/gpu-models": "A100, V100M32",
        "kubecell.io/isolation": "mps", "kubecell.io/group": "train", "kubecell.io/group-size": "8",
        "kubecell.io/group-min": "6"}))
    assert demand.vc == "team-a"
    assert demand.topology == demand.request.topology == TopologyLevel.NVLINK
    assert demand.request.gpu_models == frozenset({"A100", "V100M32"})
    assert demand.isolation == "mps"
    assert demand.group == GroupDemand("default/train", "kubecell", 8, 6)


def test_group_min_defaults_to_all_or_nothing_and_rack_topology_fits_shares() -> None:
    demand = pod_demand(make_pod({"kubecell.io/gpu-milli": "500"}, annotations={
        "kubecell.io/group": "g", "kubecell.io/group-size": "3", "kubecell.io/topology": "rack"}))
    assert demand.group == GroupDemand("default/g", "kubecell", 3, 3)
    assert demand.request.topology == TopologyLevel.RACK


def test_opportunistic_annotation_and_pod_priority() -> None:
    assert pod_demand(make_pod(priority=7)).priority == 7
    demand = pod_demand(make_pod(priority=7, annotations={"kubecell.io/opportunistic": "true"}))
    assert (demand.priority, demand.opportunistic) == (-1, True)
    assert pod_demand(make_pod(priority=7, annotations={"kubecell.io/opportunistic": "false"})).priority == 7


def test_model_annotation_on_a_cpu_only_pod_restricts_nothing() -> None:
    assert pod_demand(make_pod(annotations={"kubecell.io/gpu-models": "A100"})).request.gpu_models is None


@pytest.mark.parametrize(("gpu", "annotations", "fragments"), [
    ({"kubecell.io/gpu-milli": "0"}, {}, ("kubecell.io/gpu-milli 0:", "no share", "accepted: 1..999")),
    ({"kubecell.io/gpu-milli": "-5"}, {}, ("kubecell.io/gpu-milli -5:", "no share")),
    ({"kubecell.io/gpu-milli": "1500"}, {}, ("kubecell.io/gpu-milli 1500:", "more than one GPU's compute",
                                             "kubecell.io/gpu: N")),
    ({"kubecell.io/gpu-milli": "500m"}, {}, ("kubecell.io/gpu-milli 0.5:", "not a whole number")),
    ({"kubecell.io/gpu-milli": "lots"}, {}, ("container main: kubecell.io/gpu-milli 'lots'", "quantity")),
    ({"kubecell.io/gpu": "2", "kubecell.io/gpu-milli": "500"}, {},
     ("kubecell.io/gpu 2 with kubecell.io/gpu-milli:", "exclusive")),
    ({"kubecell.io/gpu-milli": "1000", "kubecell.io/gpu-memory": "100"}, {},
     ("kubecell.io/gpu-milli 1000 with kubecell.io/gpu-memory 100:", "exclusive")),
    ({"kubecell.io/gpu-memory": "0"}, {}, ("kubecell.io/gpu-memory 0:", "no GPU memory")),
    ({"kubecell.io/gpu-memory": "90000"}, {}, ("kubecell.io/gpu-memory 90000:", "largest GPU's 81559 MiB")),
    ({"kubecell.io/gpu": "65"}, {}, ("kubecell.io/gpu 65:", "more GPUs than one node has")),
    ({"kubecell.io/gpu": "-1"}, {}, ("kubecell.io/gpu -1:", "negative")),
    ({}, {"kubecell.io/topology": "row"}, ('annotation kubecell.io/topology "row":', "nvlink, numa, node, rack, zone")),
    ({"kubecell.io/gpu-milli": "500"}, {"kubecell.io/topology": "nvlink"},
     ('annotation kubecell.io/topology "nvlink":', "a share of one GPU")),
    ({}, {"kubecell.io/isolation": "hami-core"}, ('annotation kubecell.io/isolation "hami-core":', "accounting, mps")),
    ({}, {"kubecell.io/opportunistic": "yes"}, ('annotation kubecell.io/opportunistic "yes":', "true or false")),
    ({}, {"kubecell.io/vc": " "}, ('annotation kubecell.io/vc " ":', "is empty")),
    ({"kubecell.io/gpu": "1"}, {"kubecell.io/gpu-models": "A200"},
     ('annotation kubecell.io/gpu-models "A200":', "matches no GPU model", "A100-80G")),
    ({}, {"kubecell.io/group-size": "4"}, ('annotation kubecell.io/group-size "4":', "without kubecell.io/group")),
    ({}, {"kubecell.io/group": "g"}, ('annotation kubecell.io/group "g":', "without kubecell.io/group-size")),
    ({}, {"kubecell.io/group": "g", "kubecell.io/group-size": "four"},
     ('annotation kubecell.io/group-size "four":', "not a whole number")),
    ({}, {"kubecell.io/group": "g", "kubecell.io/group-size": "0"},
     ('annotation kubecell.io/group-size "0":', "out of range")),
    ({}, {"kubecell.io/group": "g", "kubecell.io/group-size": "2", "kubecell.io/group-min": "3"},
     ('annotation kubecell.io/group-min "3":', "above the group's size 2")),
])
def test_kubecell_refusals(gpu: dict[str, str], annotations: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(gpu, annotations=annotations), *fragments)


def test_memory_limit_follows_the_largest_gpu_given() -> None:
    options = DialectOptions(largest_gpu_memory_mib=40536)
    assert shape(pod_demand(make_pod({"kubecell.io/gpu-memory": "40536"}), options=options).request) == (1, 0, 40536)
    refused(make_pod({"kubecell.io/gpu-memory": "40537"}), "40537", "largest GPU's 40536 MiB", options=options)


def test_negative_pod_priority_other_than_opportunistic_is_refused() -> None:
    assert pod_demand(make_pod(priority=-1)).priority == -1
    refused(make_pod(priority=-5), "spec.priority -5:", "below -1")


# ---------------------------------------------------------------- nvidia.com/gpu and HAMi

@pytest.mark.parametrize(("gpu", "expected"), [
    ({"nvidia.com/gpu": "1"}, (1, 1000, 0)),
    ({"nvidia.com/gpu": "8"}, (8, 1000, 0)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}, (1, 300, 0)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "25", "nvidia.com/gpumem": "2048"}, (1, 250, 2048)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "0", "nvidia.com/gpumem": "2048"}, (1, 0, 2048)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, (1, 500, 0)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25", "nvidia.com/gpucores": "40"}, (1, 400, 0)),
    # gpumem wins over gpumem-percentage, as in HAMi
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpumem-percentage": "90"}, (1, 0, 1024)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}, (1, 1000, 0)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100", "nvidia.com/gpumem": "1024"}, (1, 1000, 0)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "0"}, (1, 1000, 0)),
    ({"nvidia.com/gpu": "3", "nvidia.com/gpucores": "100"}, (3, 1000, 0)),
    # HAMi's webhook gives a container with a share but no count one GPU
    ({"nvidia.com/gpumem": "3000"}, (1, 0, 3000)),
])
def test_nvidia_and_hami_resources(gpu: dict[str, str], expected: tuple[int, int, int]) -> None:
    assert shape(pod_demand(make_pod(gpu)).request) == expected


def test_whole_gpus_of_several_containers_add_up() -> None:
    containers = [{"name": n, "resources": {"limits": {"nvidia.com/gpu": "1"}}} for n in ("a", "b")]
    assert shape(pod_demand(make_pod(containers=containers)).request) == (2, 1000, 0)


def test_hami_gpu_type_annotations_match_as_hami_does() -> None:
    use = pod_demand(make_pod({"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gputype": "a100"}))
    assert use.request.gpu_models == frozenset({"A100", "A100-80G"})
    assert use.dialects == ("nvidia", "hami")
    avoid = pod_demand(make_pod({"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": "V100,T4"}))
    assert avoid.request.gpu_models == frozenset(GPU_MODELS) - {"V100M16", "V100M32", "T4"}
    both = pod_demand(make_pod({"nvidia.com/gpu": "1"}, annotations={
        "nvidia.com/use-gputype": "A100", "nvidia.com/nouse-gputype": "80G"}))
    assert both.request.gpu_models == frozenset({"A100"})


@pytest.mark.parametrize(("gpu", "annotations", "fragments"), [
    ({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096"}, {},
     ("nvidia.com/gpu 2 with nvidia.com/gpumem 4096:", "a share of each of 2 GPUs", "nvidia.com/gpu: 2 without one")),
    ({"nvidia.com/gpu": "2", "nvidia.com/gpucores": "50"}, {}, ("nvidia.com/gpucores 50:", "each of 2 GPUs")),
    ({"nvidia.com/gpu": "0", "nvidia.com/gpucores": "50"}, {}, ("nvidia.com/gpu 0 with", "share of zero GPUs")),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}, {}, ("nvidia.com/gpucores 150:", "outside 0..100")),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}, {},
     ("nvidia.com/gpumem-percentage 0:", "outside 1..100")),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}, {}, ("nvidia.com/gpumem 0:", "no GPU memory")),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100000"}, {}, ("nvidia.com/gpumem 100000:", "largest GPU's")),
    ({"nvidia.com/gpu": "-2"}, {}, ("nvidia.com/gpu -2:", "negative")),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/use-gputype": "B300"},
     ('annotation nvidia.com/use-gputype "B300":', "matches no GPU model")),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/nouse-gputype": "A,V,T,P,K,M,G,L,H,R"},
     ("annotation nvidia.com/nouse-gputype", "excludes every GPU model")),
])
def test_hami_refusals(gpu: dict[str, str], annotations: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(gpu, annotations=annotations), *fragments)


def test_hami_shares_in_two_containers_are_refused() -> None:
    containers = [{"name": n, "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}
                  for n in ("a", "b")]
    refused(make_pod(containers=containers), "HAMi resources in containers a, b", "one share of one GPU")


# ---------------------------------------------------------------- Aliyun gpushare

@pytest.mark.parametrize(("gpu", "unit", "expected"), [
    ({"aliyun.com/gpu-mem": "1"}, "GiB", (1, 0, 1024)),
    ({"aliyun.com/gpu-mem": "16", "aliyun.com/gpu-count": "1"}, "GiB", (1, 0, 16384)),
    ({"aliyun.com/gpu-mem": "1500"}, "MiB", (1, 0, 1500)),
])
def test_aliyun_gpu_mem(gpu: dict[str, str], unit: Any, expected: tuple[int, int, int]) -> None:
    request = pod_demand(make_pod(gpu), options=DialectOptions(aliyun_memory_unit=unit)).request
    assert shape(request) == expected


def test_aliyun_memory_is_the_pods_total() -> None:
    containers = [{"name": n, "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}} for n in ("a", "b")]
    assert shape(pod_demand(make_pod(containers=containers)).request) == (1, 0, 4096)


def test_aliyun_zero_is_refused_with_the_exact_message() -> None:
    assert refused(make_pod({"aliyun.com/gpu-mem": "0"})) == (
        "pod default/p1: aliyun.com/gpu-mem 0: a share of no GPU memory is no share "
        "(accepted: a positive amount in GiB; none for a pod without GPUs)")


@pytest.mark.parametrize(("gpu", "fragments"), [
    ({"aliyun.com/gpu-mem": "80"}, ("aliyun.com/gpu-mem 80:", "81920 MiB", "largest GPU's 81559 MiB")),
    ({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-count": "2"},
     ("aliyun.com/gpu-mem 4 with aliyun.com/gpu-count 2:", "each of 2 GPUs")),
    ({"aliyun.com/gpu-count": "1"}, ("aliyun.com/gpu-count 1:", "without aliyun.com/gpu-mem")),
    ({"aliyun.com/gpu-mem": "-1"}, ("aliyun.com/gpu-mem -1:", "no share")),
    ({"aliyun.com/gpu-mem": "2.5"}, ("aliyun.com/gpu-mem 2.5:", "not a whole number")),
])
def test_aliyun_refusals(gpu: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(gpu), *fragments)


# ---------------------------------------------------------------- Alnair

@pytest.mark.parametrize(("gpu", "expected"), [
    ({"alnair/vgpu-memory": "2"}, (1, 0, 2048)),               # the seed's unit: 1 GiB
    ({"alnair/vgpu-compute": "50"}, (1, 500, 0)),               # percent of one GPU's compute
    ({"alnair/vgpu-memory": "2", "alnair/vgpu-compute": "50"}, (1, 500, 2048)),  # the seed's example pod
    ({"alnair/vgpu-compute": "1"}, (1, 10, 0)),
    ({"alnair/vgpu-compute": "99", "alnair/vgpu-memory": "80"}, (1, 990, 81920)),
])
def test_alnair_vgpu_resources_are_a_share_of_one_gpu(gpu: dict[str, str], expected: tuple[int, int, int]) -> None:
    demand = pod_demand(make_pod(gpu), options=DialectOptions(largest_gpu_memory_mib=81920))
    assert shape(demand.request) == expected
    assert demand.dialects == ("alnair",)


def test_alnair_amounts_are_the_pods_total() -> None:
    containers = [{"name": n, "resources": {"limits": {"alnair/vgpu-memory": "1", "alnair/vgpu-compute": "20"}}}
                  for n in ("a", "b")]
    assert shape(pod_demand(make_pod(containers=containers)).request) == (1, 400, 2048)


def test_alnair_and_kubecells_own_resources_must_agree() -> None:
    agreed = pod_demand(make_pod({"alnair/vgpu-compute": "25", "kubecell.io/gpu-milli": "250"}))
    assert agreed.dialects == ("kubecell", "alnair")
    refused(make_pod({"alnair/vgpu-compute": "25", "kubecell.io/gpu-milli": "500"}),
            "kubecell asks for 500 milli of one GPU but alnair asks for 250 milli of one GPU")


@pytest.mark.parametrize(("gpu", "fragments"), [
    ({"alnair/vgpu-compute": "100"}, ("alnair/vgpu-compute 100:", "below 100", "whole GPUs")),
    ({"alnair/vgpu-compute": "0"}, ("alnair/vgpu-compute 0:", "1..99")),
    ({"alnair/vgpu-compute": "12.5"}, ("alnair/vgpu-compute 12.5:", "not a whole number")),
    ({"alnair/vgpu-memory": "0"}, ("alnair/vgpu-memory 0:", "no share")),
    ({"alnair/vgpu-memory": "80"}, ("alnair/vgpu-memory 80:", "81920 MiB", "largest GPU's 81559 MiB")),
    ({"alnair/vgpu-memory": "1.5"}, ("alnair/vgpu-memory 1.5:", "not a whole number")),
    ({"alnair/vgpu-memory": "9" * 5000}, ("alnair/vgpu-memory",)),
])
def test_alnair_refusals(gpu: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(gpu), *fragments)


# ---------------------------------------------------------------- KubeShare

@pytest.mark.parametrize(("labels", "expected"), [
    ({"sharedgpu/gpu_request": "0.25"}, (1, 250, 0)),
    ({"sharedgpu/gpu_request": "0.3333"}, (1, 334, 0)),  # finer than a milli-GPU: rounded up
    ({"sharedgpu/gpu_limit": "0.4"}, (1, 400, 0)),  # no request: the limit is reserved
    ({"sharedgpu/gpu_request": "1.0", "sharedgpu/gpu_limit": "1.0"}, (1, 1000, 0)),
    ({"sharedgpu/gpu_request": "1", "sharedgpu/gpu_mem": "1024"}, (1, 1000, 0)),
    ({"sharedgpu/gpu_request": "3"}, (3, 1000, 0)),
    ({"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_mem": "1048577"}, (1, 500, 2)),  # bytes round up to MiB
    ({"sharedgpu/gpu_request": "0", "sharedgpu/gpu_limit": "1", "sharedgpu/gpu_mem": str(2**30)}, (1, 0, 1024)),
])
def test_kubeshare_labels(labels: dict[str, str], expected: tuple[int, int, int]) -> None:
    demand = pod_demand(make_pod(labels=labels))
    assert shape(demand.request) == expected
    assert demand.dialects == ("kubeshare",)


def test_kubeshare_model_priority_and_group() -> None:
    demand = pod_demand(make_pod(labels={
        "sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_model": "NVIDIA-A100-SXM4-80GB", "sharedgpu/priority": "50",
        "sharedgpu/group_name": "g", "sharedgpu/group_headcount": "5", "sharedgpu/group_threshold": "0.5"}))
    assert demand.request.gpu_models == frozenset({"A100-80G"})
    assert demand.priority == 50
    assert demand.group == GroupDemand("default/g", "kubeshare", 5, 3)  # floor(0.5 x 5 + 0.5) = 3


@pytest.mark.parametrize(("headcount", "threshold", "minimum"), [("5", "0.2", 1), ("4", "0.5", 2), ("3", "1", 3),
                                                                  ("7", "0.5", 4), ("10", "0.05", 1)])
def test_kubeshare_threshold_is_a_share_of_the_headcount_rounded_half_up(
        headcount: str, threshold: str, minimum: int) -> None:
    labels = {"sharedgpu/group_name": "g", "sharedgpu/group_headcount": headcount,
              "sharedgpu/group_threshold": threshold}
    group = pod_demand(make_pod(labels=labels)).group
    assert group is not None
    assert (group.size, group.minimum) == (int(headcount), minimum)


def test_kubeshare_priority_zero_is_opportunistic() -> None:
    assert pod_demand(make_pod(labels={"sharedgpu/gpu_request": "0.5", "sharedgpu/priority": "0"})).priority == -1


def test_kubeshare_model_names_a_gpu_the_catalog_does_not_know() -> None:
    pod = make_pod(labels={"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_model": "NVIDIA-GeForce-GTX-1080"})
    refused(pod, 'label sharedgpu/gpu_model "NVIDIA-GeForce-GTX-1080":', "matches no GPU model")
    options = DialectOptions(known_models=frozenset({"NVIDIA GeForce GTX 1080", "T4"}))
    assert pod_demand(pod, options=options).request.gpu_models == frozenset({"NVIDIA GeForce GTX 1080"})


@pytest.mark.parametrize(("labels", "fragments"), [
    ({"sharedgpu/gpu_request": "half"}, ('label sharedgpu/gpu_request "half":', "not a number")),
    ({"sharedgpu/gpu_request": "-0.5"}, ('label sharedgpu/gpu_request "-0.5":', "negative")),
    ({"sharedgpu/gpu_request": "nan"}, ('label sharedgpu/gpu_request "nan":', "not a number")),
    ({"sharedgpu/gpu_request": "0.8", "sharedgpu/gpu_limit": "0.5"}, ("sharedgpu/gpu_limit", "above the limit")),
    ({"sharedgpu/gpu_request": "1.5"}, ('label sharedgpu/gpu_request "1.5":', "not a whole number of GPUs")),
    ({"sharedgpu/gpu_request": "2", "sharedgpu/gpu_limit": "3"}, ("sharedgpu/gpu_request", "whole number")),
    ({"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_limit": "1.5"}, ('label sharedgpu/gpu_limit "1.5":',
                                                                       "above 1")),
    ({"sharedgpu/gpu_request": "0"}, ('label sharedgpu/gpu_request "0":', "nothing of a GPU")),
    ({"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_mem": "12.5"}, ('label sharedgpu/gpu_mem "12.5":', "bytes")),
    ({"sharedgpu/gpu_mem": "0"}, ('label sharedgpu/gpu_mem "0":', "no GPU memory")),
    ({"sharedgpu/gpu_request": "0.5", "sharedgpu/priority": "200"}, ('label sharedgpu/priority "200":', "1..100")),
    ({"sharedgpu/gpu_request": "0.5", "sharedgpu/priority": "--1"}, ('label sharedgpu/priority "--1":', "1..100")),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "4"},
     ('label sharedgpu/group_name "g":', "without sharedgpu/group_threshold")),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "4", "sharedgpu/group_threshold": "0"},
     ('label sharedgpu/group_threshold "0":', "(0, 1]")),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "4", "sharedgpu/group_threshold": "1.5"},
     ('label sharedgpu/group_threshold "1.5":', "not a fraction")),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "5", "sharedgpu/group_threshold": "0.05"},
     ('label sharedgpu/group_threshold "0.05":', "rounds to no pod", "at least 0.1")),
    ({"sharedgpu/group_headcount": "4"}, ('label sharedgpu/group_headcount "4":', "without sharedgpu/group_name")),
    ({"sharedgpu/pod_group_name": "g"}, ('label sharedgpu/pod_group_name "g":', "reads sharedgpu/group_name")),
])
def test_kubeshare_refusals(labels: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(labels=labels), *fragments)
