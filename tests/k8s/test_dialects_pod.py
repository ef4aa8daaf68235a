"""Pods in every dialect read into one PodDemand: the headline property that one request written in any
dialect is the same core Request, the pod's CPU and memory totals, and dialects side by side in one pod."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import Request
from kubecell.k8s.dialects import DialectOptions, pod_demand
from tests.k8s.dialect_support import HIVED, make_pod, refused, shape

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
