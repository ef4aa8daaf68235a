"""Aliyun gpushare's dialect (``kubecell.kube.dialects.aliyun``): ``aliyun.com/gpu-mem`` is memory of one GPU,
in GiB unless the device plugin counts MiB."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube.dialects import DialectOptions, pod_demand
from kubecell.kube.dialects.aliyun import read
from tests.kube.dialect_support import make_pod, refused, shape, states


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


@pytest.mark.parametrize(("pod", "options", "expected"), [
    (make_pod(), DialectOptions(), {}),
    (make_pod({"aliyun.com/gpu-mem": "4"}), DialectOptions(), {"ask": ("aliyun", (1, 0, 4096))}),
    (make_pod({"aliyun.com/gpu-mem": "4"}), DialectOptions(aliyun_memory_unit="MiB"), {"ask": ("aliyun", (1, 0, 4))}),
    (make_pod({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-count": "0"}), DialectOptions(),
     {"ask": ("aliyun", (1, 0, 4096))}),
    (make_pod({"aliyun.com/gpu-count": "0"}), DialectOptions(), {}),
    (make_pod({"nvidia.com/gpu": "1"}), DialectOptions(), {}),
])
def test_what_aliyun_states(pod: dict[str, Any], options: DialectOptions, expected: dict[str, Any]) -> None:
    assert states(read, pod, options=options) == expected


@pytest.mark.parametrize(("gpu", "fragments"), [
    ({"aliyun.com/gpu-mem": "80"}, ("aliyun.com/gpu-mem 80:", "81920 MiB", "largest GPU's 81559 MiB")),
    ({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-count": "2"},
     ("aliyun.com/gpu-mem 4 with aliyun.com/gpu-count 2:", "each of 2 GPUs")),
    ({"aliyun.com/gpu-count": "1"}, ("aliyun.com/gpu-count 1:", "without aliyun.com/gpu-mem")),
    ({"aliyun.com/gpu-mem": "-1"}, ("aliyun.com/gpu-mem -1:", "no share")),
    ({"aliyun.com/gpu-mem": "2.5"}, ("aliyun.com/gpu-mem 2.5:", "not a whole number")),
    # added with the cut by dialect
    ({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-count": "-1"}, ("aliyun.com/gpu-count -1:", "negative")),
    ({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-count": "1.5"}, ("aliyun.com/gpu-count 1.5:", "not a whole number")),
])
def test_aliyun_refusals(gpu: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(gpu), *fragments)
