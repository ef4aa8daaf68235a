"""KubeShare's dialect (``kubecell.kube.dialects.kubeshare``): its labels for a share, a model, a priority and a
gang, what its reader states, and every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube.dialects import DialectOptions, GroupDemand, pod_demand
from kubecell.kube.dialects.kubeshare import read
from tests.kube.dialect_support import make_pod, refused, shape, states


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


@pytest.mark.parametrize(("labels", "expected"), [
    ({}, {}),
    ({"sharedgpu/gpu_request": "0.5"}, {"ask": ("kubeshare", (1, 500, 0))}),
    ({"sharedgpu/gpu_mem": str(2**31)}, {"ask": ("kubeshare", (1, 0, 2048))}),
    ({"sharedgpu/gpu_model": "Tesla-T4"}, {"models": [frozenset({"T4"})]}),
    ({"sharedgpu/gpu_model": " "}, {}),  # blank: no filter
    ({"sharedgpu/priority": "7"}, {"priority": 7}),
    ({"sharedgpu/priority": "-1"}, {"priority": -1}),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "4", "sharedgpu/group_threshold": "0.5"},
     {"groups": [("kubeshare", "g", 4, 2)]}),
])
def test_what_kubeshare_states(labels: dict[str, str], expected: dict[str, Any]) -> None:
    assert states(read, make_pod(labels=labels)) == expected


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
    # added with the cut by dialect
    ({"sharedgpu/gpu_request": "65", "sharedgpu/gpu_limit": "65"},
     ('label sharedgpu/gpu_request "65":', "more GPUs than one node has")),
    ({"sharedgpu/gpu_mem": str(100 * 2**30)}, ("label sharedgpu/gpu_mem", "more than the largest GPU's 81559 MiB")),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "x", "sharedgpu/group_threshold": "1"},
     ('label sharedgpu/group_headcount "x":', "not a whole number (digits 0-9)")),
    ({"sharedgpu/group_name": "g", "sharedgpu/group_headcount": "4", "sharedgpu/group_threshold": "half"},
     ('label sharedgpu/group_threshold "half":', "not a number", "(0, 1]")),
    ({"sharedgpu/group_name": " ", "sharedgpu/group_headcount": "4", "sharedgpu/group_threshold": "1"},
     ('label sharedgpu/group_name " ":', "is empty")),
])
def test_kubeshare_refusals(labels: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(labels=labels), *fragments)
