"""What every resource dialect shares (``kubecell.kube.dialects.resources``): a pod's CPU, memory and GPU
amounts added up as kube-scheduler adds them, quantities, and the checks of amounts written as text."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request
from kubecell.kube.dialects import pod_demand
from kubecell.kube.dialects.demand import PodMeta
from kubecell.kube.dialects.resources import count_text
from tests.kube.dialect_support import make_pod, refused, shape


def test_pod_without_gpu_ask_is_a_cpu_only_request() -> None:
    demand = pod_demand(make_pod())
    assert demand.request == Request("default/p1", cpu_milli=2000, memory_mib=4096)
    assert (demand.group, demand.vc, demand.priority, demand.isolation, demand.dialects) == \
        (None, None, 0, "accounting", ())


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


@pytest.mark.parametrize(("extra", "fragments"), [
    ({"initContainers": [{"name": "setup", "resources": {"limits": {"memory": "lots"}}}]},
     ("init container setup: memory 'lots'",)),
    ({"resources": {"requests": {"cpu": True}}}, ("pod-level (pod): cpu True", "boolean")),
    ({"overhead": {"memory": "1e999999"}}, ("overhead (overhead): memory '1e999999'", "beyond the largest amount")),
])
def test_malformed_amounts_outside_the_containers_are_named_too(extra: dict[str, Any],
                                                                fragments: tuple[str, ...]) -> None:
    refused(make_pod(**extra), *fragments)


@pytest.mark.parametrize(("text", "low", "expected"), [
    ("4", 1, 4), (" 007 ", 1, 7), ("0", 0, 0), ("4194304", 1, 2**22),
    ("0", 1, "is out of range"), ("4194305", 1, "is out of range"), ("9" * 30, 1, "is out of range"),
    ("-1", 1, "not a whole number"), ("1.0", 1, "not a whole number"), ("١٢", 1, "not a whole number"),
    ("²", 1, "not a whole number"), ("1" * 65, 1, "65 characters long"),
])
def test_counts_written_as_text(text: str, low: int, expected: int | str) -> None:
    pod = PodMeta.of(make_pod())
    if isinstance(expected, int):
        assert count_text(pod, text, "annotation n", "n", low) == expected
        return
    with pytest.raises(InvalidInputError) as caught:
        count_text(pod, text, "annotation n", "n", low)
    assert expected in str(caught.value)
    assert str(caught.value).startswith("pod default/p1: annotation n: ")
