"""HAMi's dialect (``kubecell.kube.dialects.hami``): vGPU shares as container resources beside
``nvidia.com/gpu``, GPU type annotations matched as HAMi matches them, and every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import GPU_MODELS
from kubecell.kube.dialects import pod_demand
from kubecell.kube.dialects.hami import read
from tests.kube.dialect_support import make_pod, refused, shape, states


@pytest.mark.parametrize(("gpu", "expected"), [
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
def test_hami_resources(gpu: dict[str, str], expected: tuple[int, int, int]) -> None:
    assert shape(pod_demand(make_pod(gpu)).request) == expected


def test_hami_gpu_type_annotations_match_as_hami_does() -> None:
    use = pod_demand(make_pod({"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gputype": "a100"}))
    assert use.request.gpu_models == frozenset({"A100", "A100-80G"})
    assert use.dialects == ("nvidia", "hami")
    avoid = pod_demand(make_pod({"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": "V100,T4"}))
    assert avoid.request.gpu_models == frozenset(GPU_MODELS) - {"V100M16", "V100M32", "T4"}
    both = pod_demand(make_pod({"nvidia.com/gpu": "1"}, annotations={
        "nvidia.com/use-gputype": "A100", "nvidia.com/nouse-gputype": "80G"}))
    assert both.request.gpu_models == frozenset({"A100"})


def test_hami_share_in_one_container_beside_a_container_without_gpus() -> None:
    containers = [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"}}},
                  {"name": "sidecar", "resources": {"requests": {"cpu": "100m"}}}]
    demand = pod_demand(make_pod(containers=containers))
    assert shape(demand.request) == (1, 0, 2048)
    assert demand.dialects == ("hami",)


@pytest.mark.parametrize(("pod", "expected"), [
    (make_pod(), {}),
    (make_pod({"nvidia.com/gpu": "2"}), {}),  # plain nvidia.com/gpu is NVIDIA's
    (make_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}), {"ask": ("hami", (1, 500, 0))}),
    (make_pod({"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"}), {"ask": ("hami", (2, 1000, 0))}),
    (make_pod({"nvidia.com/gpu": "0", "nvidia.com/gpucores": "0"}), {}),  # a share of nothing on no GPU
    (make_pod(annotations={"nvidia.com/use-gputype": "T4"}), {"models": [frozenset({"T4"})]}),
    (make_pod(annotations={"nvidia.com/use-gputype": " "}), {}),  # blank: no filter
    (make_pod(annotations={"nvidia.com/use-gputype": "a100", "nvidia.com/nouse-gputype": "80G"}),
     {"models": [frozenset({"A100", "A100-80G"}), frozenset(GPU_MODELS) - {"A100-80G"}]}),
    # a model's own name selects that model alone
    (make_pod(annotations={"nvidia.com/use-gputype": "A100"}), {"models": [frozenset({"A100"})]}),
])
def test_what_hami_states(pod: dict[str, Any], expected: dict[str, Any]) -> None:
    assert states(read, pod) == expected


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
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/use-gputype": "B300"},
     ('annotation nvidia.com/use-gputype "B300":', "matches no GPU model")),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/nouse-gputype": "A,V,T,P,K,M,G,L,H,R"},
     ("annotation nvidia.com/nouse-gputype", "excludes every GPU model")),
    # added with the cut by dialect
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "12.5"}, {}, ("nvidia.com/gpucores 12.5:", "not a whole number")),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1.5"}, {}, ("nvidia.com/gpumem 1.5:", "not a whole number")),
    ({"nvidia.com/gpu": "65", "nvidia.com/gpucores": "50"}, {}, ("nvidia.com/gpu 65:", "more GPUs than one node")),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/use-gputype": "T4," * 400},
     ("annotation nvidia.com/use-gputype", "is 1200 characters long")),
])
def test_hami_refusals(gpu: dict[str, str], annotations: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(gpu, annotations=annotations), *fragments)


def test_hami_shares_in_two_containers_are_refused() -> None:
    containers = [{"name": n, "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}
                  for n in ("a", "b")]
    refused(make_pod(containers=containers), "HAMi resources in containers a, b", "one share of one GPU")
