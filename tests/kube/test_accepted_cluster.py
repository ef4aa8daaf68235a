"""The accepted-cluster snapshot (``kubecell.kube.accepted``) as plain data: what it keeps, what it
refuses to read, and which nodes become ghosts."""

from __future__ import annotations

import json

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import make_node
from kubecell.kube.accepted import GHOST_SUFFIX, decode, encode, ghosts


def nodes(count: int, *, gpus: int = 8, model: str = "A100") -> list:  # type: ignore[type-arg]
    return [make_node(f"n{i}", cpu_milli=64_000, memory_mib=262_144, gpu_count=gpus, gpu_model=model,
                      nvlink_groups=[[0, 1, 2, 3], [4, 5, 6, 7]] if gpus == 8 else [], rack=f"r{i // 2}")
            for i in range(count)]


def test_a_snapshot_reads_back_the_same_gpu_nodes_and_shares_shapes() -> None:
    cluster = [*nodes(4), make_node("cpu-only", cpu_milli=8000, memory_mib=16_384)]
    text = encode(cluster)
    assert len(json.loads(text)["shapes"]) == 1, "identical nodes share one shape"
    back = decode(text)
    assert [n.name for n in back] == ["n0", "n1", "n2", "n3"], "CPU-only nodes hold no cells and are not kept"
    assert [(n.gpus, n.nvlink_groups, n.rack) for n in back] == [(n.gpus, n.nvlink_groups, n.rack) for n in cluster[:4]]


SCHEMA = '{"schema": "kubecell.io/accepted-cluster/v1"'


@pytest.mark.parametrize("text", ["", "{", "[]", '{"schema": "other"}', SCHEMA + "}",
                                  SCHEMA + ', "shapes": [], "nodes": [["a", 3, "", ""]]}',
                                  SCHEMA + ', "shapes": [{"cpuMilli": "x"}], "nodes": [["a", 0, "", ""]]}', "9" * 5000])
def test_a_snapshot_kubecell_did_not_write_is_refused_with_the_configmap_named(text: str) -> None:
    with pytest.raises(InvalidInputError, match="kubecell-accepted-cluster"):
        decode(text)


def test_ghosts_are_the_nodes_gone_or_changed() -> None:
    accepted = nodes(3)
    smaller = make_node("n1", cpu_milli=64_000, memory_mib=262_144, gpu_count=7, gpu_model="A100", rack="r0")
    lost = ghosts(accepted, [accepted[0], smaller])
    assert [n.name for n in lost] == [f"n1{GHOST_SUFFIX}", "n2"]
    assert lost[0].gpu_count == 8, "a ghost keeps the shape the tenants were accepted on"
    assert ghosts(accepted, accepted) == []
