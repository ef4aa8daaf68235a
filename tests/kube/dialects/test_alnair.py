"""Alnair's dialect (``kubecell.kube.dialects.alnair``): ``alnair/vgpu-memory`` (GiB of one GPU) and
``alnair/vgpu-compute`` (percent of one GPU, below 100), the pod's totals, and every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube.dialects import DialectOptions, pod_demand
from kubecell.kube.dialects.alnair import read
from tests.kube.dialect_support import make_pod, refused, shape, states


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


@pytest.mark.parametrize(("pod", "expected"), [
    (make_pod(), {}),
    (make_pod({"alnair/vgpu-compute": "30"}), {"ask": ("alnair", (1, 300, 0))}),
    (make_pod({"alnair/vgpu-memory": "3"}), {"ask": ("alnair", (1, 0, 3072))}),
    (make_pod({"kubecell.io/gpu-milli": "300"}), {}),
])
def test_what_alnair_states(pod: dict[str, Any], expected: dict[str, Any]) -> None:
    assert states(read, pod) == expected


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
