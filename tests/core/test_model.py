"""Validation of the scheduling vocabulary: requests, nodes, the GPU catalog and topology levels."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.model import (
    GPU_MODELS,
    UNKNOWN_GPU_MEMORY_MIB,
    Gpu,
    Node,
    Request,
    TopologyLevel,
    gpu_model_spec,
    make_node,
)

# --------------------------------------------------------------------------------------------- Request


@pytest.mark.parametrize(
    ("kwargs", "is_share", "is_whole", "wants_gpu", "total_milli"),
    [
        pytest.param({"cpu_milli": 4000, "memory_mib": 1024}, False, False, False, 0, id="cpu-only"),
        pytest.param({}, False, False, False, 0, id="empty-request"),
        pytest.param({"gpu_count": 1, "gpu_milli": 1}, True, False, True, 1, id="smallest-share"),
        pytest.param({"gpu_count": 1, "gpu_milli": 500}, True, False, True, 500, id="half-gpu"),
        pytest.param({"gpu_count": 1, "gpu_milli": 999}, True, False, True, 999, id="almost-whole"),
        pytest.param({"gpu_count": 1, "gpu_memory_mib": 4096}, True, False, True, 0, id="memory-only-share"),
        pytest.param(
            {"gpu_count": 1, "gpu_milli": 300, "gpu_memory_mib": 4096}, True, False, True, 300, id="milli+memory"
        ),
        pytest.param({"gpu_count": 1, "gpu_milli": 1000}, False, True, True, 1000, id="one-whole"),
        pytest.param({"gpu_count": 8, "gpu_milli": 1000}, False, True, True, 8000, id="eight-whole"),
    ],
)
def test_valid_request_shapes(
    kwargs: dict[str, Any], is_share: bool, is_whole: bool, wants_gpu: bool, total_milli: int
) -> None:
    request = Request("r", **kwargs)
    assert request.is_share is is_share
    assert request.is_whole is is_whole
    assert request.wants_gpu is wants_gpu
    assert request.total_gpu_milli == total_milli


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        pytest.param({"cpu_milli": -1}, ["must not be negative"], id="negative-cpu"),
        pytest.param({"memory_mib": -5}, ["must not be negative"], id="negative-memory"),
        pytest.param({"gpu_count": 1, "gpu_memory_mib": -1}, ["must not be negative"], id="negative-gpu-memory"),
        pytest.param({"gpu_count": -1}, ["gpu_count", "negative"], id="negative-gpu-count"),
        pytest.param({"gpu_milli": 500}, ["zero GPUs", "gpu_count >= 1"], id="share-without-gpu"),
        pytest.param({"gpu_memory_mib": 1024}, ["zero GPUs"], id="memory-without-gpu"),
        pytest.param({"gpu_count": 1, "gpu_milli": 1001}, ["1001", "out of range", "0..1000"], id="milli-too-big"),
        pytest.param({"gpu_count": 1, "gpu_milli": -1}, ["-1", "out of range"], id="milli-negative"),
        pytest.param(
            {"gpu_count": 2, "gpu_milli": 500},
            ["2 GPUs", "500", "fractional shares for one GPU only"],
            id="multi-gpu-share",
        ),
        pytest.param(
            {"gpu_count": 2, "gpu_memory_mib": 1024}, ["gpu_milli", "one GPU only"], id="multi-gpu-memory-share"
        ),
        pytest.param({"gpu_count": 1}, ["neither a compute share nor GPU memory"], id="gpu-without-amount"),
        pytest.param(
            {"gpu_count": 1, "gpu_milli": 1000, "gpu_memory_mib": 100},
            ["gpu_memory_mib", "exclusive"],
            id="whole-with-memory",
        ),
        pytest.param(
            {"gpu_count": 4, "gpu_milli": 1000, "gpu_memory_mib": 100},
            ["gpu_memory_mib", "exclusive"],
            id="multi-whole-with-memory",
        ),
        pytest.param(
            {"gpu_count": 1, "gpu_milli": 500, "gpu_models": frozenset()}, ["gpu_models", "empty"], id="no-models"
        ),
    ],
)
def test_invalid_requests_name_the_request_and_the_problem(kwargs: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(InvalidInputError) as caught:
        Request("job-7", **kwargs)
    text = str(caught.value)
    assert "request 'job-7'" in text
    for fragment in fragments:
        assert fragment in text
    assert isinstance(caught.value, KubecellError)


def test_request_model_restriction_and_shape() -> None:
    anywhere = Request("a", gpu_count=1, gpu_milli=500)
    only_v100 = Request("b", gpu_count=1, gpu_milli=500, gpu_models=frozenset({"V100M16", "V100M32"}))
    assert anywhere.allows_model("T4")
    assert only_v100.allows_model("V100M32")
    assert not only_v100.allows_model("T4")
    # The shape ignores the name: equal resources give equal shapes (the score cache relies on it).
    assert (
        Request("x", cpu_milli=1, gpu_count=1, gpu_milli=500).shape
        == Request("y", cpu_milli=1, gpu_count=1, gpu_milli=500).shape
    )
    assert anywhere.shape != only_v100.shape
    assert (
        Request("t", gpu_count=2, gpu_milli=1000, topology=TopologyLevel.NVLINK).shape
        != Request("t", gpu_count=2, gpu_milli=1000).shape
    )


# ------------------------------------------------------------------------------------------------ Node


def _gpus(model: str, count: int, memory: int = 16000) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, model, memory) for i in range(count))


def test_valid_node_and_default_groups() -> None:
    node = Node("n1", 64000, 256000, _gpus("V100M32", 4), nvlink_groups=((0, 1), (2, 3)))
    assert node.gpu_model == "V100M32"
    assert node.gpu_count == 4
    assert node.groups_at(TopologyLevel.NVLINK) == ((0, 1), (2, 3))
    # No NUMA information: one group with every GPU.
    assert node.groups_at(TopologyLevel.NUMA) == ((0, 1, 2, 3),)
    assert node.groups_at(TopologyLevel.NODE) == ((0, 1, 2, 3),)
    assert node.groups_at(TopologyLevel.GPU) == ((0,), (1,), (2,), (3,))
    cpu_node = Node("c", 1000, 1000)
    assert cpu_node.gpu_model == ""
    assert cpu_node.groups_at(TopologyLevel.NVLINK) == ()


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        pytest.param({"name": ""}, ["node name is empty"], id="empty-name"),
        pytest.param({"cpu_milli": -1}, ["must not be negative"], id="negative-cpu"),
        pytest.param({"memory_mib": -1}, ["must not be negative"], id="negative-memory"),
        pytest.param(
            {"gpus": (Gpu(0, "T4", 1), Gpu(0, "T4", 1))}, ["GPU indices [0, 0]", "0..1"], id="duplicate-index"
        ),
        pytest.param({"gpus": (Gpu(1, "T4", 1),)}, ["GPU indices [1]"], id="index-gap"),
        pytest.param(
            {"gpus": (Gpu(0, "T4", 1), Gpu(1, "A100", 1))}, ["mixes GPU models", "'A100', 'T4'"], id="mixed-models"
        ),
        pytest.param(
            {"gpus": _gpus("A100", 4), "nvlink_groups": ((0, 1), (1, 2, 3))},
            ["nvlink_groups", "do not partition"],
            id="nvlink-overlap",
        ),
        pytest.param(
            {"gpus": _gpus("A100", 4), "nvlink_groups": ((0, 1), (2,))},
            ["nvlink_groups", "do not partition"],
            id="nvlink-missing-gpu",
        ),
        pytest.param(
            {"gpus": _gpus("A100", 2), "nvlink_groups": ((0, 1, 2),)},
            ["nvlink_groups", "do not partition"],
            id="nvlink-unknown-gpu",
        ),
        pytest.param(
            {"gpus": _gpus("A100", 4), "numa_groups": ((0, 1), (2, 2))},
            ["numa_groups", "do not partition"],
            id="numa-duplicate",
        ),
    ],
)
def test_invalid_nodes(kwargs: dict[str, Any], fragments: list[str]) -> None:
    base: dict[str, Any] = {"name": "node-a", "cpu_milli": 1000, "memory_mib": 1000}
    base.update(kwargs)
    with pytest.raises(InvalidInputError) as caught:
        Node(**base)
    text = str(caught.value)
    for fragment in fragments:
        assert fragment in text


def test_mixed_models_error_says_what_to_do() -> None:
    with pytest.raises(InvalidInputError) as caught:
        Node("box", 1, 1, (Gpu(0, "T4", 1), Gpu(1, "P4", 1)))
    assert caught.value.location == "node 'box'"
    assert caught.value.field == "gpus"
    assert caught.value.accepted is not None
    assert "one GPU model per node" in caught.value.accepted


# ------------------------------------------------------------------------------------------- make_node


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_make_node_takes_memory_from_catalog(model: str) -> None:
    node = make_node("n", cpu_milli=8000, memory_mib=32000, gpu_count=2, gpu_model=model)
    assert [gpu.memory_mib for gpu in node.gpus] == [GPU_MODELS[model].memory_mib] * 2
    assert [gpu.index for gpu in node.gpus] == [0, 1]
    assert node.gpu_model == model


def test_make_node_catalog_values_and_overrides() -> None:
    assert make_node("n", cpu_milli=1, memory_mib=1, gpu_count=1, gpu_model="A100").gpus[0].memory_mib == 40536
    assert make_node("n", cpu_milli=1, memory_mib=1, gpu_count=1, gpu_model="G1").gpus[0].memory_mib == 0
    custom = make_node("n", cpu_milli=1, memory_mib=1, gpu_count=3, gpu_model="MyGPU", gpu_memory_mib=12345)
    assert [gpu.memory_mib for gpu in custom.gpus] == [12345] * 3
    assert custom.gpu_model == "MyGPU"
    unknown = make_node("n", cpu_milli=1, memory_mib=1, gpu_count=1, gpu_model="MyGPU", gpu_memory_mib=0)
    assert unknown.gpus[0].memory_mib == UNKNOWN_GPU_MEMORY_MIB
    grouped = make_node(
        "n",
        cpu_milli=1,
        memory_mib=1,
        gpu_count=4,
        gpu_model="A100",
        nvlink_groups=[[0, 1], [2, 3]],
        rack="r1",
        zone="z1",
        labels={"k": "v"},
    )
    assert grouped.nvlink_groups == ((0, 1), (2, 3))
    assert (grouped.rack, grouped.zone, dict(grouped.labels)) == ("r1", "z1", {"k": "v"})
    cpu_only = make_node("c", cpu_milli=1, memory_mib=1)
    assert cpu_only.gpus == ()


def test_make_node_unknown_model_lists_accepted_models() -> None:
    with pytest.raises(InvalidInputError) as caught:
        make_node("n", cpu_milli=1, memory_mib=1, gpu_count=2, gpu_model="GTX9999", location="nodes.csv:4")
    error = caught.value
    text = str(error)
    assert "GTX9999" in text
    assert text.startswith("nodes.csv:4: field 'model'")
    assert error.accepted is not None
    for model in GPU_MODELS:
        assert model in error.accepted
    assert "give the GPU's memory explicitly" in error.accepted


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        pytest.param({"gpu_count": -1, "gpu_model": "T4"}, "negative", id="negative-count"),
        pytest.param({"gpu_count": 2}, "no GPU model", id="gpus-without-model"),
        pytest.param(
            {"gpu_count": 2, "gpu_model": "A100", "nvlink_groups": [[0], [0, 1]]}, "do not partition", id="groups"
        ),
    ],
)
def test_make_node_invalid(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        make_node("n", cpu_milli=1, memory_mib=1, **kwargs)


def test_gpu_model_spec_lookup() -> None:
    assert gpu_model_spec("H100").memory_mib == 81559
    assert gpu_model_spec("A100").nvlink
    assert not gpu_model_spec("T4").nvlink
    with pytest.raises(InvalidInputError, match="unknown GPU model 'a100'"):
        gpu_model_spec("a100")  # the catalog is case-sensitive, like the trace codes


# --------------------------------------------------------------------------------------- TopologyLevel


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("gpu", TopologyLevel.GPU),
        ("NVLINK", TopologyLevel.NVLINK),
        ("NvLink", TopologyLevel.NVLINK),
        (" numa ", TopologyLevel.NUMA),
        ("node", TopologyLevel.NODE),
        ("rack", TopologyLevel.RACK),
        ("zone", TopologyLevel.ZONE),
        ("cluster\n", TopologyLevel.CLUSTER),
    ],
)
def test_topology_level_parse(text: str, level: TopologyLevel) -> None:
    assert TopologyLevel.parse(text) is level


@pytest.mark.parametrize("text", ["", "socket", "nv-link", "1"])
def test_topology_level_parse_rejects_unknown(text: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        TopologyLevel.parse(text, location="tenants.yaml: vcs.alpha")
    message = str(caught.value)
    assert message.startswith("tenants.yaml: vcs.alpha: unknown topology level")
    assert "accepted: gpu, nvlink, numa, node, rack, zone, cluster" in message


def test_topology_levels_are_ordered_tight_to_wide() -> None:
    ordered = sorted(TopologyLevel)
    assert [level.name for level in ordered] == ["GPU", "NVLINK", "NUMA", "NODE", "RACK", "ZONE", "CLUSTER"]
    assert TopologyLevel.NVLINK < TopologyLevel.NODE
