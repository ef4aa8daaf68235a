"""NVIDIA's device plugin dialect (``kubecell.kube.dialects.nvidia``): ``nvidia.com/gpu: N`` is N whole GPUs,
unless a HAMi share makes it HAMi's vGPU count."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube.dialects import pod_demand
from kubecell.kube.dialects.nvidia import read
from tests.kube.dialect_support import make_pod, refused, shape, states


@pytest.mark.parametrize(("gpu", "expected"), [
    ({"nvidia.com/gpu": "1"}, (1, 1000, 0)),
    ({"nvidia.com/gpu": "8"}, (8, 1000, 0)),
    ({"nvidia.com/gpu": "64"}, (64, 1000, 0)),
    ({"nvidia.com/gpu": "0"}, (0, 0, 0)),  # no GPU
    ({"nvidia.com/gpu": "2.0"}, (2, 1000, 0)),  # a quantity with a fraction of zero is a whole number
])
def test_nvidia_resources(gpu: dict[str, str], expected: tuple[int, int, int]) -> None:
    demand = pod_demand(make_pod(gpu))
    assert shape(demand.request) == expected
    assert demand.dialects == (("nvidia",) if expected[0] else ())


def test_whole_gpus_of_several_containers_add_up() -> None:
    containers = [{"name": n, "resources": {"limits": {"nvidia.com/gpu": "1"}}} for n in ("a", "b")]
    assert shape(pod_demand(make_pod(containers=containers)).request) == (2, 1000, 0)


def test_a_request_without_a_limit_counts_too() -> None:
    containers = [{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "3"}}}]
    assert shape(pod_demand(make_pod(containers=containers)).request) == (3, 1000, 0)


@pytest.mark.parametrize(("pod", "expected"), [
    (make_pod(), {}),
    (make_pod({"nvidia.com/gpu": "4"}), {"ask": ("nvidia", (4, 1000, 0))}),
    (make_pod({"nvidia.com/gpu": "0"}), {}),
    # a HAMi share makes nvidia.com/gpu HAMi's: plain NVIDIA stands aside
    (make_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}), {}),
    (make_pod({"kubecell.io/gpu": "2"}), {}),
])
def test_what_nvidia_states(pod: dict[str, Any], expected: dict[str, Any]) -> None:
    assert states(read, pod) == expected


@pytest.mark.parametrize(("gpu", "fragments"), [
    ({"nvidia.com/gpu": "-2"}, ("nvidia.com/gpu -2:", "negative")),
    ({"nvidia.com/gpu": "65"}, ("nvidia.com/gpu 65:", "more GPUs than one node has", "use a group of pods")),
    ({"nvidia.com/gpu": "1.5"}, ("nvidia.com/gpu 1.5:", "not a whole number", "extended resources")),
    ({"nvidia.com/gpu": "500m"}, ("nvidia.com/gpu 0.5:", "not a whole number")),
    ({"nvidia.com/gpu": "one"}, ("container main: nvidia.com/gpu 'one'", "not a Kubernetes quantity")),
])
def test_nvidia_refusals(gpu: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(gpu), *fragments)
