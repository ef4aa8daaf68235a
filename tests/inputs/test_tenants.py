"""Tenant files: every error carries ``file:line: key.path``, says what is accepted, and never leaks
pydantic's internals (validator names, union branches, Python types)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.cluster import load_cluster
from kubecell.inputs.tenants import load_tenants
from tests.support import RACKED_CLUSTER as CLUSTER

PYDANTIC_INTERNALS = ("constrained-int", "GpuShorthand", "VirtualClusterConfig", "function-after", "Input should",
                      "valid dictionary", "instance of", "[key]", "dict[", "list[", "int_type", "strict")


@pytest.fixture
def forest(tmp_path: Path) -> CellForest:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER, encoding="utf-8")
    return CellForest(load_cluster(path))


def _error(tmp_path: Path, forest: CellForest, text: str) -> tuple[Path, str]:
    path = tmp_path / "tenants.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidInputError) as info:
        load_tenants(path, forest)
    message = str(info.value)
    assert "\n" not in message
    for internal in PYDANTIC_INTERNALS:
        assert internal not in message, message
    return path, message


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("virtualClusters:\n  a:\n    gpus: 8\n    quota: 3\n",
         "4: virtualClusters.a.quota", ["unknown key 'quota'", "borrowLimitGpus"]),
        ("virtualClusters:\n  a:\n    cells: {V100M32x8/node: two}\n",
         "3: virtualClusters.a.cells.V100M32x8/node", ["must be a whole number, got 'two'", "cells >= 0"]),
        ("virtualClusters:\n  a:\n    cells:\n      V100M32x8/node: -1\n",
         "4: virtualClusters.a.cells.V100M32x8/node", ["must be at least 0, got -1"]),
        ("virtualClusters:\n  a:\n    weight: 2\n    gpus: yes\n",
         "4: virtualClusters.a.gpus", ["expected a whole number of GPUs >= 1, or {count: N, chain: NAME}",
                                       "got true", "YAML reads yes"]),
        ("virtualClusters:\n  a:\n    gpus: {count: 0}\n",
         "3: virtualClusters.a.gpus.count", ["must be at least 1, got 0"]),
        ("virtualClusters:\n  a:\n    gpus: 0\n", "3: virtualClusters.a.gpus", ["must be at least 1, got 0"]),
        ("virtualClusters:\n  a:\n    gpus: [8]\n", "3: virtualClusters.a.gpus", ["got a list"]),
        ("virtualClusters:\n  a:\n    gpus: {count: 8, chian: V100M32x8}\n",
         "3: virtualClusters.a.gpus.chian", ["unknown key 'chian'", "count, chain"]),
        ("virtualClusters:\n  a:\n    gpus: {count: 8, chain: A100x8}\n",
         "3: virtualClusters.a.gpus.chain", ["unknown chain 'A100x8'", "V100M32x8"]),
        ("virtualClusters:\n  a:\n    weight: .nan\n    gpus: 8\n",
         "3: virtualClusters.a.weight", ["must be a finite number, got .nan"]),
        ("virtualClusters:\n  a:\n    cells:\n      A100x8/node: 1\n",
         "4: virtualClusters.a.cells.A100x8/node", ["unknown cell type 'A100x8/node'", "V100M32x8/node"]),
        ("cellTypes:\n  dgx: DGX/node\nvirtualClusters:\n  a: {gpus: 8}\n",
         "2: cellTypes.dgx", ["unknown cell type 'DGX/node'"]),
        ("virtualClusters:\n  a:\n    gpus: 24\n  b:\n    gpus: 16\n",
         "1: virtualClusters", ["cannot all be met", "a asks for 3, b asks for 2"]),
        ("virtualClusters:\n  a:\n    pinnedCells: [n-001]\n  b:\n    pinnedCells:\n      - n-002\n      - n-001\n",
         "7: virtualClusters.b.pinnedCells[1]", ["'n-001' is pinned by both 'a' and 'b'"]),
        ("virtualClusters:\n  a:\n    pinnedCells: [n-rack-0]\n  b:\n    pinnedCells: [n-001/4gpu0]\n",
         "5: virtualClusters.b.pinnedCells[0]", ["'n-001/4gpu0' (b) lies inside pinned cell 'n-rack-0' (a)"]),
        ("virtualClusters:\n  a:\n    pinnedCells: [n-009]\n", "3: virtualClusters.a.pinnedCells[0]",
         ["unknown cell 'n-009'"]),
        ("virtualClusters:\n  a: {}\n", "2: virtualClusters.a", ["guarantees nothing"]),
        ("virtualClusters:\n  a:\n", "2: virtualClusters.a", ["must be a mapping"]),
        ("cellTypes: {}\n", "1: virtualClusters", ["required key missing"]),
    ],
    ids=["unknown-key", "bad-count", "negative-count", "gpus-yes", "gpus-count-0", "gpus-0", "gpus-list",
         "shorthand-typo", "unknown-chain", "weight-nan", "unknown-cell-type", "unknown-alias-target", "infeasible",
         "pinned-twice", "pinned-nested", "unknown-pinned-cell", "guarantees-nothing", "empty-vc", "no-vcs"],
)
def test_every_tenant_error_names_file_line_and_key_path(tmp_path: Path, forest: CellForest, text: str, where: str,
                                                         says: list[str]) -> None:
    path, message = _error(tmp_path, forest, text)
    assert message.startswith(f"{path}:{where}: "), message
    for words in says:
        assert words in message, message


def test_the_core_without_a_locator_names_the_source_and_key_path(forest: CellForest) -> None:
    with pytest.raises(InvalidInputError) as info:
        resolve_tenants({"virtualClusters": {"a": {"gpus": True}}}, forest, source="inline")
    assert str(info.value).startswith("inline: virtualClusters.a.gpus: expected a whole number of GPUs")


def test_a_valid_file_loads(tmp_path: Path, forest: CellForest) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("virtualClusters:\n  a: {cells: {V100M32x8/rack: 1}}\n  b: {gpus: 12, weight: 2}\n",
                    encoding="utf-8")
    tenants = load_tenants(path, forest)
    assert tenants.names == ["a", "b"]
    assert tenants.require("b").guaranteed_gpus == 12
