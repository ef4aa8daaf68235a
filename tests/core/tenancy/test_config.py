"""Tenant configuration: ``resolve_tenants`` turns a parsed YAML document into validated virtual clusters,
or raises one ``InvalidInputError`` that names where, what and what would be accepted."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kubecell.core.errors import InvalidInputError
from kubecell.core.tenancy.config import expand_gpus, resolve_tenants
from kubecell.core.topology import CellForest
from tests.core.support import make_nodes

CHAIN = "V100M32x8"


@pytest.fixture
def flat() -> CellForest:
    """Four 8-GPU nodes without racks: levels gpu, 2gpu, 4gpu, node."""
    return CellForest(make_nodes(4))


@pytest.fixture
def racked() -> CellForest:
    """Four 8-GPU nodes in two racks of two: levels gpu, 2gpu, 4gpu, node, rack."""
    return CellForest(make_nodes(4, racks_of=2))


def resolve(forest: CellForest, vcs: Any, **top: Any) -> Any:
    return resolve_tenants({"virtualClusters": vcs, **top}, forest, source="t.yaml")


def rejected(forest: CellForest, raw: Any) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as info:
        resolve_tenants(raw, forest, source="t.yaml")
    return info.value


# ============================================================================ a valid configuration
def test_documented_example_resolves_every_field(racked: CellForest) -> None:
    doc = yaml.safe_load(f"""
cellTypes:
  dgx: {CHAIN}/node
virtualClusters:
  vision:
    cells: {{dgx: 1, {CHAIN}/rack: 1}}
    weight: 2
    borrowLimitGpus: 2.5
    minRuntimeMinutes: 10
  speech:
    gpus: 4
    pinnedCells: [n3/4gpu1]
""")
    tenants = resolve_tenants(doc, racked)
    assert tenants.names == ["vision", "speech"]
    vision, speech = tenants.require("vision"), tenants.require("speech")
    assert (vision.index, speech.index) == (0, 1)
    assert dict(vision.demand) == {(CHAIN, 3): 1, (CHAIN, 4): 1}
    assert vision.guaranteed_gpus == 8 + 16
    assert vision.guaranteed_milli == 24_000
    assert vision.weight == 2.0
    assert vision.borrow_limit_milli == 2500
    assert vision.min_runtime_seconds == 600.0
    assert vision.pinned == ()
    assert dict(speech.demand) == {(CHAIN, 2): 1}
    assert speech.pinned == ("n3/4gpu1",)
    assert speech.guaranteed_gpus == 4 + 4  # the shorthand plus the pinned cell
    assert speech.weight == 1.0
    assert speech.borrow_limit_milli is None  # default: no limit
    assert speech.min_runtime_seconds == 0.0


def test_alias_and_type_name_add_up(flat: CellForest) -> None:
    tenants = resolve(flat, {"a": {"cells": {"dgx": 1, f"{CHAIN}/node": 2}}}, cellTypes={"dgx": f"{CHAIN}/node"})
    assert dict(tenants.require("a").demand) == {(CHAIN, 3): 3}


def test_zero_counts_are_dropped_from_the_demand(flat: CellForest) -> None:
    tenants = resolve(flat, {"a": {"cells": {f"{CHAIN}/node": 1, f"{CHAIN}/gpu": 0}}})
    assert dict(tenants.require("a").demand) == {(CHAIN, 3): 1}


def test_require_unknown_vc_lists_the_known_ones(flat: CellForest) -> None:
    tenants = resolve(flat, {"a": {"gpus": 8}, "b": {"gpus": 8}})
    assert tenants.get("zzz") is None
    with pytest.raises(InvalidInputError) as info:
        tenants.require("zzz")
    assert "zzz" in str(info.value)
    assert info.value.accepted == "a, b"


# ============================================================================ gpus: N shorthand
@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (8, {"node": 1}),
        (12, {"node": 1, "4gpu": 1}),
        (13, {"node": 1, "4gpu": 1, "gpu": 1}),
        (7, {"4gpu": 1, "2gpu": 1, "gpu": 1}),
        (1, {"gpu": 1}),
        (32, {"node": 4}),
    ],
)
def test_gpus_shorthand_expands_to_nodes_then_largest_sub_node_cells(
        racked: CellForest, count: int, expected: dict[str, int]) -> None:
    chain = racked.chains[CHAIN]
    want = {(CHAIN, chain.level_of(kind)): n for kind, n in expected.items()}
    assert expand_gpus(racked, count, CHAIN) == want
    vc = resolve(racked, {"a": {"gpus": count}}).require("a")
    assert dict(vc.demand) == want
    assert vc.guaranteed_gpus == count


def test_gpus_shorthand_never_uses_racks(racked: CellForest) -> None:
    # 32 GPUs is two whole racks' worth, but the shorthand means whole nodes: it must not pin racks.
    chain = racked.chains[CHAIN]
    assert chain.kinds[-1] == "rack"
    assert set(expand_gpus(racked, 32, CHAIN)) == {(CHAIN, chain.node_level)}


def test_gpus_shorthand_on_a_six_gpu_chain() -> None:
    forest = CellForest(make_nodes(2, gpus=6))
    chain = forest.chains["V100M32x6"]
    assert chain.kinds == ("gpu", "3gpu", "node")
    assert expand_gpus(forest, 10, "V100M32x6") == {("V100M32x6", 2): 1, ("V100M32x6", 1): 1, ("V100M32x6", 0): 1}


def test_gpus_shorthand_adds_to_explicit_cells(flat: CellForest) -> None:
    vc = resolve(flat, {"a": {"gpus": 12, "cells": {f"{CHAIN}/4gpu": 1}}}).require("a")
    assert dict(vc.demand) == {(CHAIN, 3): 1, (CHAIN, 2): 2}
    assert vc.guaranteed_gpus == 16


def test_gpus_shorthand_needs_a_chain_on_a_mixed_cluster() -> None:
    forest = CellForest([*make_nodes(2), *make_nodes(2, gpus=4, model="A100", prefix="m")])
    error = rejected(forest, {"virtualClusters": {"a": {"gpus": 8}}})
    assert "ambiguous" in error.message
    assert error.location is not None
    assert "virtualClusters.a.gpus" in error.location
    assert error.accepted is not None
    assert "A100x4" in error.accepted
    assert CHAIN in error.accepted
    vc = resolve(forest, {"a": {"gpus": {"count": 6, "chain": "A100x4"}}}).require("a")
    assert dict(vc.demand) == {("A100x4", 2): 1, ("A100x4", 1): 1}


def test_gpus_shorthand_unknown_chain_lists_the_chains(flat: CellForest) -> None:
    error = rejected(flat, {"virtualClusters": {"a": {"gpus": {"count": 8, "chain": "A100x8"}}}})
    assert "A100x8" in error.message
    assert error.accepted == CHAIN


@pytest.mark.parametrize("count", [0, -3])
def test_gpus_shorthand_below_one_is_a_clear_error(flat: CellForest, count: int) -> None:
    error = rejected(flat, {"virtualClusters": {"a": {"gpus": count}}})
    assert "gpus" in str(error)


@pytest.mark.parametrize("vc", [{"gpus": True}, {"cells": {f"{CHAIN}/node": True}}], ids=["gpus", "cells"])
def test_boolean_counts_are_rejected(flat: CellForest, vc: dict[str, Any]) -> None:
    rejected(flat, {"virtualClusters": {"a": vc}})


# ============================================================================ unsatisfiable guarantees
@pytest.mark.parametrize(
    ("kind", "count", "available"),
    [("rack", 3, 2), ("node", 5, 4), ("4gpu", 9, 8), ("2gpu", 17, 16), ("gpu", 33, 32)],
)
def test_unsatisfiable_guarantee_at_each_level_names_vc_type_and_shortfall(
        racked: CellForest, kind: str, count: int, available: int) -> None:
    error = rejected(racked, {"virtualClusters": {"big": {"cells": {f"{CHAIN}/{kind}": count}}}})
    text = str(error)
    assert "cannot all be met" in text
    assert f"cell type {CHAIN}/{kind}" in text
    assert f"big asks for {count}" in text
    assert f"only {available} such cells" in text
    assert f"short by {count - available}" in text


def test_shortfall_names_every_vc_asking_at_that_level(racked: CellForest) -> None:
    error = rejected(racked, {"virtualClusters": {
        "r": {"cells": {f"{CHAIN}/rack": 1}},
        "a": {"cells": {f"{CHAIN}/node": 2}},
        "b": {"cells": {f"{CHAIN}/node": 1}},
    }})
    text = str(error)
    # One rack goes to r; the other rack yields two nodes for three asked.
    assert f"cell type {CHAIN}/node: a asks for 2, b asks for 1; only 2 such cells" in text
    assert "short by 1" in text
    assert text.count("cell type ") == 1  # the rack level fits, and the levels below are not blamed


def test_larger_cells_are_served_first_and_leave_the_rest(racked: CellForest) -> None:
    # Two racks hold everything: a rack, a node, a 4-GPU cell, and twelve single GPUs (16+8+4+... = 32).
    tenants = resolve(racked, {
        "r": {"cells": {f"{CHAIN}/rack": 1}},
        "n": {"cells": {f"{CHAIN}/node": 1, f"{CHAIN}/4gpu": 1}},
        "g": {"cells": {f"{CHAIN}/gpu": 4}},
    })
    assert sum(vc.guaranteed_gpus for vc in tenants.vcs) == 32
    error = rejected(racked, {"virtualClusters": {
        "r": {"cells": {f"{CHAIN}/rack": 1}},
        "n": {"cells": {f"{CHAIN}/node": 1, f"{CHAIN}/4gpu": 1}},
        "g": {"cells": {f"{CHAIN}/gpu": 5}},
    }})
    assert f"{CHAIN}/gpu: g asks for 5; only 4" in str(error)


def test_free_gpus_do_not_make_a_free_node(flat: CellForest) -> None:
    # One GPU of every node is pinned: 28 GPUs are free, but no whole node is (HiveD's initCellNums check).
    pins = [f"n{i}/gpu0" for i in range(4)]
    error = rejected(flat, {"virtualClusters": {"p": {"pinnedCells": pins}, "a": {"cells": {f"{CHAIN}/node": 1}}}})
    assert f"cell type {CHAIN}/node: a asks for 1; only 0 such cells" in str(error)
    ok = resolve(flat, {"p": {"pinnedCells": pins}, "a": {"cells": {f"{CHAIN}/4gpu": 4}}})
    assert ok.require("a").guaranteed_gpus == 16


def test_pinned_racks_leave_no_whole_rack(racked: CellForest) -> None:
    # One node of each rack is pinned: 16 free GPUs remain, but no whole rack.
    error = rejected(racked, {"virtualClusters": {"p": {"pinnedCells": ["n0", "n2"]},
                                                  "a": {"cells": {f"{CHAIN}/rack": 1}}}})
    assert f"cell type {CHAIN}/rack: a asks for 1; only 0" in str(error)
    ok = resolve(racked, {"p": {"pinnedCells": ["n0", "n2"]}, "a": {"cells": {f"{CHAIN}/node": 2}}})
    assert ok.require("p").guaranteed_gpus == 16


# ============================================================================ unknown cell types
def test_unknown_cell_type_lists_the_accepted_types(racked: CellForest) -> None:
    error = rejected(racked, {"virtualClusters": {"a": {"cells": {"A100x8/node": 1}}}})
    assert "A100x8/node" in error.message
    assert error.location is not None
    assert "virtualClusters.a" in error.location
    assert error.accepted is not None
    assert error.accepted.split(", ") == racked.type_names()


@pytest.mark.parametrize("bad", [f"{CHAIN}/rack", f"{CHAIN}/nod", f"{CHAIN}", "node", f"{CHAIN}/8gpu"])
def test_kinds_the_chain_lacks_are_unknown(flat: CellForest, bad: str) -> None:
    error = rejected(flat, {"virtualClusters": {"a": {"cells": {bad: 1}}}})
    assert repr(bad) in error.message
    assert error.accepted is not None
    assert f"{CHAIN}/node" in error.accepted


def test_unknown_alias_target_is_rejected_where_it_is_declared(flat: CellForest) -> None:
    error = rejected(flat, {"cellTypes": {"dgx": "DGX/node"}, "virtualClusters": {"a": {"gpus": 8}}})
    assert error.location is not None
    assert "cellTypes.dgx" in error.location
    assert error.accepted is not None
    assert f"{CHAIN}/node" in error.accepted


def test_cluster_without_gpus_says_so() -> None:
    forest = CellForest(make_nodes(2, gpus=0, model=""))
    error = rejected(forest, {"virtualClusters": {"a": {"cells": {f"{CHAIN}/node": 1}}}})
    assert error.accepted is not None
    assert "no GPU nodes" in error.accepted


# ============================================================================ pinned cells
def test_pinned_cells_count_towards_the_guarantee(racked: CellForest) -> None:
    vc = resolve(racked, {"a": {"pinnedCells": ["rack1", "n0/2gpu3"]}}).require("a")
    assert vc.pinned == ("rack1", "n0/2gpu3")
    assert dict(vc.demand) == {}
    assert vc.guaranteed_gpus == 16 + 2


def test_unknown_pinned_cell(racked: CellForest) -> None:
    error = rejected(racked, {"virtualClusters": {"a": {"pinnedCells": ["n9"]}}})
    assert "unknown cell 'n9'" in error.message
    assert error.location is not None
    assert "virtualClusters.a.pinnedCells" in error.location
    assert error.accepted is not None
    assert "n0" in error.accepted


def test_cell_pinned_by_two_vcs(flat: CellForest) -> None:
    error = rejected(flat, {"virtualClusters": {"a": {"pinnedCells": ["n1"]}, "b": {"pinnedCells": ["n1"]}}})
    assert "'n1'" in error.message
    assert "'a'" in error.message
    assert "'b'" in error.message
    assert error.location is not None
    assert "virtualClusters.b" in error.location


def test_cell_pinned_twice_by_one_vc(flat: CellForest) -> None:
    error = rejected(flat, {"virtualClusters": {"a": {"pinnedCells": ["n1", "n1"]}}})
    assert "'n1'" in error.message


@pytest.mark.parametrize(("outer", "inner"), [("rack0", "n1"), ("n0", "n0/gpu3"), ("n2/4gpu1", "n2/2gpu2")])
def test_nested_pinned_cells(racked: CellForest, outer: str, inner: str) -> None:
    for vcs in ({"a": {"pinnedCells": [outer]}, "b": {"pinnedCells": [inner]}},
                {"a": {"pinnedCells": [inner, outer]}}):
        error = rejected(racked, {"virtualClusters": vcs})
        assert f"{inner!r}" in error.message
        assert f"{outer!r}" in error.message
        assert "lies inside" in error.message


def test_pinned_cells_are_taken_before_the_preassigned_demand(flat: CellForest) -> None:
    error = rejected(flat, {"virtualClusters": {"p": {"pinnedCells": ["n0"]}, "a": {"gpus": 32}}})
    assert f"{CHAIN}/node: a asks for 4; only 3" in str(error)


# ============================================================================ weights, limits, runtime
@pytest.mark.parametrize("weight", [0, -1, "heavy", None, float("nan")])
def test_bad_weights(flat: CellForest, weight: Any) -> None:
    error = rejected(flat, {"virtualClusters": {"a": {"gpus": 8, "weight": weight}}})
    assert "virtualClusters.a.weight" in str(error)


@pytest.mark.parametrize("limit", [-1, "lots", float("nan")])
def test_bad_borrow_limits(flat: CellForest, limit: Any) -> None:
    error = rejected(flat, {"virtualClusters": {"a": {"gpus": 8, "borrowLimitGpus": limit}}})
    assert "virtualClusters.a.borrowLimitGpus" in str(error)


@pytest.mark.parametrize(("limit", "milli"), [(0, 0), (64, 64_000), (0.5, 500), (None, None)])
def test_borrow_limit_in_milli_gpus(flat: CellForest, limit: float | None, milli: int | None) -> None:
    assert resolve(flat, {"a": {"gpus": 8, "borrowLimitGpus": limit}}).require("a").borrow_limit_milli == milli


def test_infinite_borrow_limit_is_handled(flat: CellForest) -> None:
    raw = yaml.safe_load("virtualClusters: {a: {gpus: 8, borrowLimitGpus: .inf}}")
    try:
        vc = resolve_tenants(raw, flat).require("a")
        outcome = "unlimited" if vc.borrow_limit_milli is None else f"limit {vc.borrow_limit_milli}"
    except InvalidInputError as error:
        outcome = "rejected" if "borrowLimitGpus" in str(error) else f"unclear: {error}"
    assert outcome in ("unlimited", "rejected")  # either reading is fine; a crash is not


@pytest.mark.parametrize("minutes", [-1, "soon"])
def test_bad_min_runtime(flat: CellForest, minutes: Any) -> None:
    error = rejected(flat, {"virtualClusters": {"a": {"gpus": 8, "minRuntimeMinutes": minutes}}})
    assert "virtualClusters.a.minRuntimeMinutes" in str(error)


# ============================================================================ malformed documents
@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (None, "virtualClusters"),
        ([{"a": {"gpus": 8}}], "virtualClusters"),
        ("virtualClusters", "virtualClusters"),
        ({}, "virtualClusters"),
        ({"virtualClusters": None}, "virtualClusters"),
        ({"virtualClusters": ["a", "b"]}, "virtualClusters"),
        ({"virtualClusters": {"a": None}}, "virtualClusters.a"),
        ({"virtualClusters": {"a": 8}}, "virtualClusters.a"),
        ({"virtualClusters": {"a": {"cells": [f"{CHAIN}/node"]}}}, "virtualClusters.a.cells"),
        ({"virtualClusters": {"a": {"cells": {f"{CHAIN}/node": 1.5}}}}, "virtualClusters.a.cells"),
        ({"virtualClusters": {"a": {"cells": {f"{CHAIN}/node": "two"}}}}, "virtualClusters.a.cells"),
        ({"virtualClusters": {"a": {"gpus": 8.5}}}, "virtualClusters.a.gpus"),
        ({"virtualClusters": {"a": {"gpus": [8]}}}, "virtualClusters.a.gpus"),
        ({"virtualClusters": {"a": {"gpus": {"count": 8, "chian": CHAIN}}}}, "chian"),
        ({"virtualClusters": {"a": {"pinnedCells": "n0"}}}, "virtualClusters.a.pinnedCells"),
        ({"virtualClusters": {"a": {"pinnedCells": [0]}}}, "virtualClusters.a.pinnedCells"),
        ({"virtualClusters": {1: {"gpus": 8}}}, "virtualClusters.1"),
        ({"cellTypes": ["dgx"], "virtualClusters": {"a": {"gpus": 8}}}, "cellTypes"),
        ({"cellTypes": {"dgx": 3}, "virtualClusters": {"a": {"gpus": 8}}}, "cellTypes.dgx"),
        ({"virtualClusters": {"a": {"cells": {f"{CHAIN}/node": -1}}}}, "virtualClusters.a.cells"),
    ],
)
def test_malformed_documents_give_one_clear_error(flat: CellForest, raw: Any, where: str) -> None:
    error = rejected(flat, raw)  # an InvalidInputError, never a pydantic or Python error from deep inside
    text = str(error)
    assert text.startswith("t.yaml")  # the source the caller named
    assert where in text
    assert "\n" not in text  # one line, as the CLI prints it


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"virtualClusters": {"a": {"gpus": 8}}, "vcs": {}}, "vcs"),
        ({"virtualClusters": {"a": {"gpus": 8, "quota": 3}}}, "virtualClusters.a.quota"),
        ({"virtualClusters": {"a": {"gpus": 8, "pinned": ["n0"]}}}, "virtualClusters.a.pinned"),
    ],
)
def test_unknown_keys_are_named_and_the_known_ones_listed(flat: CellForest, raw: Any, key: str) -> None:
    error = rejected(flat, raw)
    assert key in str(error)
    assert f"unknown key {key.split('.')[-1]!r}" in error.message
    assert error.accepted is not None
    for known in ("virtualClusters", "cells", "gpus", "pinnedCells", "weight", "borrowLimitGpus",
                  "minRuntimeMinutes"):
        assert known in error.accepted


@pytest.mark.parametrize("vc", [{}, {"cells": {}}, {"cells": {f"{CHAIN}/node": 0}}, {"pinnedCells": []}])
def test_a_vc_that_guarantees_nothing(flat: CellForest, vc: dict[str, Any]) -> None:
    error = rejected(flat, {"virtualClusters": {"idle": vc}})
    assert "guarantees nothing" in error.message
    assert error.location is not None
    assert error.location.endswith("virtualClusters.idle")


@pytest.mark.parametrize(("key", "value"), [
    ("weight", ".inf"), ("weight", ".nan"), ("weight", "true"),
    ("minRuntimeMinutes", ".inf"), ("minRuntimeMinutes", "'30'"),
    ("borrowLimitGpus", ".nan"), ("borrowLimitGpus", "yes"),
])
def test_numbers_must_be_finite_and_not_booleans_or_text(flat: CellForest, key: str, value: str) -> None:
    raw = yaml.safe_load(f"virtualClusters: {{a: {{gpus: 8, {key}: {value}}}}}")
    error = rejected(flat, raw)
    assert key in str(error)


def test_pinning_every_node_pins_them_all() -> None:
    """The whole-cluster default pins every root cell (its cost on 5,000 nodes: ``python bench/tenancy.py``)."""
    forest = CellForest(make_nodes(500))
    tenants = resolve_tenants({"virtualClusters": {"default": {"pinnedCells": [r.id for r in forest.roots]}}}, forest)
    assert tenants.require("default").guaranteed_gpus == 4_000


def test_a_pin_inside_several_pins_names_the_first_listed() -> None:
    forest = CellForest(make_nodes(2, racks_of=2))
    error = rejected(forest, {"virtualClusters": {"a": {"pinnedCells": ["n0/gpu1", "n0", "rack0"]}}})
    assert "'n0/gpu1' (a) lies inside pinned cell 'n0' (a)" in error.message
    assert "virtualClusters.a.pinnedCells[0]" in (error.location or "")
