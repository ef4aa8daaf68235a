"""Pods in every dialect read into one PodDemand: a table of cases per dialect, every refusal, and the
headline property that one request written in any dialect is the same core Request."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import GPU_MODELS, Request, TopologyLevel
from kubecell.k8s.dialects import DemandError, DialectOptions, GroupDemand, pod_demand

HIVED = "hivedscheduler.microsoft.com/pod-scheduling-spec"
CPU = {"cpu": "2", "memory": "4Gi"}


def make_pod(gpu: dict[str, Any] | None = None, *, annotations: dict[str, str] | None = None,
             labels: dict[str, str] | None = None, namespace: str = "default", name: str = "p1",
             containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    """A Pod as the API server returns it: one container with CPU/memory requests and ``gpu`` limits."""
    if containers is None:
        containers = [{"name": "main", "resources": {"requests": dict(CPU), "limits": dict(gpu or {})}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": "u-1",
                         "annotations": annotations or {}, "labels": labels or {}},
            "spec": {"schedulerName": "kubecell", "containers": containers, **spec},
            "status": {"phase": "Pending"}}


def shape(request: Request) -> tuple[int, int, int]:
    return (request.gpu_count, request.gpu_milli, request.gpu_memory_mib)


def refused(pod: dict[str, Any], *fragments: str, **kwargs: Any) -> str:
    """The DemandError text for ``pod``; it must name the pod and contain every fragment."""
    with pytest.raises(DemandError) as caught:
        pod_demand(pod, **kwargs)
    text = str(caught.value)
    meta = pod["metadata"]
    assert text.startswith(f"pod {meta['namespace']}/{meta['name']}: "), text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    return text


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


# ---------------------------------------------------------------- CPU, memory and the pod's totals

def test_pod_without_gpu_ask_is_a_cpu_only_request() -> None:
    demand = pod_demand(make_pod())
    assert demand.request == Request("default/p1", cpu_milli=2000, memory_mib=4096)
    assert (demand.group, demand.vc, demand.priority, demand.isolation, demand.dialects) == \
        (None, None, 0, "accounting", ())


def test_zero_gpu_counts_mean_no_gpu() -> None:
    assert shape(pod_demand(make_pod({"nvidia.com/gpu": "0", "kubecell.io/gpu": 0})).request) == (0, 0, 0)


@pytest.mark.parametrize(("containers", "extra", "cpu", "memory"), [
    # limits stand in for requests that were not given
    ([{"name": "a", "resources": {"limits": {"cpu": "1500m", "memory": "1G"}}}], {}, 1500, 954),
    # containers add up; fractions of a MiB round up
    ([{"name": "a", "resources": {"requests": {"cpu": "0.5", "memory": "100Mi"}}},
      {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "1000000"}}}], {}, 750, 101),
    # an init container bigger than the sum of containers sets the pod's request
    ([{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
     {"initContainers": [{"name": "i", "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}}]}, 3000, 1024),
    # a sidecar (restartable init container) runs beside the containers: it adds up
    ([{"name": "a", "resources": {"requests": {"cpu": "1"}}}],
     {"initContainers": [{"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}]},
     1500, 0),
    # pod-level resources replace the containers' CPU and memory; overhead comes on top
    ([{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
     {"resources": {"requests": {"cpu": "4"}}, "overhead": {"cpu": "100m", "memory": "64Mi"}}, 4100, 1088),
    # exponent notation
    ([{"name": "a", "resources": {"requests": {"cpu": "2e-1", "memory": "1e9"}}}], {}, 200, 954),
])
def test_cpu_and_memory_are_added_up_as_kube_scheduler_does(
        containers: list[dict[str, Any]], extra: dict[str, Any], cpu: int, memory: int) -> None:
    request = pod_demand(make_pod(containers=containers, **extra)).request
    assert (request.cpu_milli, request.memory_mib) == (cpu, memory)


def test_gpu_shares_of_several_containers_add_up_on_one_gpu() -> None:
    containers = [{"name": "a", "resources": {"limits": {"kubecell.io/gpu-milli": "300"}}},
                  {"name": "b", "resources": {"limits": {"kubecell.io/gpu-milli": "200"}}}]
    assert shape(pod_demand(make_pod(containers=containers)).request) == (1, 500, 0)


def test_an_init_container_gpu_ask_counts_as_kube_scheduler_counts_it() -> None:
    init = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
    assert shape(pod_demand(make_pod({"nvidia.com/gpu": "1"}, initContainers=init)).request) == (2, 1000, 0)


def test_host_amounts_beyond_the_allocation_book_are_refused() -> None:
    containers = [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "2Ei"}}}]
    refused(make_pod(containers=containers), "cpu 1 memory 2305843009213693952:",
            "host memory request (MiB) 2199023255552 is out of range", "0..1099511627776")


def test_a_malformed_quantity_names_the_container_and_resource() -> None:
    containers = [{"name": "trainer", "resources": {"requests": {"cpu": "two"}}}]
    assert refused(make_pod(containers=containers), "container trainer: cpu 'two'", "not a Kubernetes quantity")


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
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup:\n  name: g\n  members:\n"
     "  - {podNumber: 2, leafCellNumber: 2}\n  - {podNumber: 1, leafCellNumber: 8}\n",
     ("different GPU counts (2 pods x 2 GPUs, 1 pod x 8 GPUs)", "identical members")),
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: g, members: [{podNumber: 0, leafCellNumber: 2}]}\n",
     ("affinityGroup.members[0].podNumber: 0 is out of range",)),
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: g, members: [{pods: 1, leafCellNumber: 2}]}\n",
     ("affinityGroup.members[0].pods: unknown key", "podNumber")),
])
def test_malformed_hived_specs_are_refused(text: str, fragments: tuple[str, ...]) -> None:
    refused(hived(text), f"annotation {HIVED}", *fragments)


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


# ---------------------------------------------------------------- dialects side by side

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


def test_model_filters_of_several_dialects_intersect() -> None:
    demand = pod_demand(make_pod({"nvidia.com/gpu": "1"}, annotations={
        "kubecell.io/gpu-models": "A100,T4", "nvidia.com/use-gputype": "A100"}))
    assert demand.request.gpu_models == frozenset({"A100"})
    refused(make_pod({"nvidia.com/gpu": "1"}, annotations={
        "kubecell.io/gpu-models": "T4", "nvidia.com/use-gputype": "A100"}),
        'annotation kubecell.io/gpu-models "T4" and annotation nvidia.com/use-gputype "A100"', "no GPU model in common")


def test_priorities_stated_by_two_dialects_must_agree() -> None:
    refused(make_pod(labels={"sharedgpu/gpu_request": "1", "sharedgpu/priority": "0"},
                     annotations={HIVED: "virtualCluster: a\nleafCellNumber: 1\npriority: 3\n"}),
            "hived states priority 3 but kubeshare states -1")


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
