"""HiveD's per-level cell accounting: ``shortfalls`` (from the cells) and ``shortfalls_from_counts`` (from
free-cell counts, O(levels)) must agree, and both must say "fits" exactly when disjoint free cells exist."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.model import Node
from kubecell.core.tenancy.feasibility import Shortfall, free_cells, shortfalls, shortfalls_from_counts
from kubecell.core.topology import Cell, CellForest
from tests.core.support import brute_force_fits, count_free, make_nodes

V = "V100M32x8"
GPU, GPU2, GPU4, NODE, RACK = 0, 1, 2, 3, 4


def both(forest: CellForest, demand: Mapping[str, Mapping[tuple[str, int], int]],
         blocked: list[Cell]) -> list[Shortfall]:
    """``shortfalls`` after checking that the count-based variant says exactly the same."""
    direct = shortfalls(forest, demand, blocked)
    counted = shortfalls_from_counts(forest, demand, count_free(forest, blocked))
    assert direct == counted
    return direct


def total(demand: Mapping[str, Mapping[tuple[str, int], int]]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for cells in demand.values():
        for key, n in cells.items():
            out[key] = out.get(key, 0) + n
    return out


# ============================================================================ free cells
def test_free_cells_exclude_blocked_cells_their_subtree_and_ancestors() -> None:
    forest = CellForest(make_nodes(4, racks_of=2))
    blocked = forest.by_id["n0/2gpu1"]
    free = free_cells(forest, [blocked])
    dirty = {blocked, *blocked.walk(), *blocked.ancestors()}
    assert {c.id for c in dirty} >= {"rack0", "n0", "n0/4gpu0", "n0/2gpu1", "n0/gpu2", "n0/gpu3"}
    everything = {c for root in forest.roots for c in root.walk()}
    assert free == everything - dirty
    assert forest.by_id["n0/2gpu0"] in free  # the sibling stays free
    assert forest.by_id["n1"] in free  # and so does the rest of the rack


def test_nothing_blocked_means_every_cell_is_free() -> None:
    forest = CellForest(make_nodes(2))
    assert len(free_cells(forest, [])) == 2 * (1 + 2 + 4 + 8)


# ============================================================================ hand-made forests
def test_a_fitting_demand_has_no_shortfall() -> None:
    forest = CellForest(make_nodes(4, racks_of=2))
    demand = {"a": {(V, RACK): 1}, "b": {(V, NODE): 1, (V, GPU4): 1}, "c": {(V, GPU): 4}}
    assert both(forest, demand, []) == []


def test_shortfall_fields_and_description() -> None:
    forest = CellForest(make_nodes(4, racks_of=2))
    demand = {"b": {(V, NODE): 1}, "a": {(V, RACK): 1, (V, NODE): 2}}
    (problem,) = both(forest, demand, [])
    assert problem.chain is forest.chains[V]
    assert (problem.level, problem.needed, problem.available) == (NODE, 3, 2)
    assert problem.askers == (("a", 2), ("b", 1))  # sorted by VC name
    assert problem.type_name == f"{V}/node"
    assert problem.describe() == (f"cell type {V}/node: a asks for 2, b asks for 1; only 2 such cells can be "
                                  "provided once larger guaranteed cells are taken (short by 1)")


def test_a_bad_gpu_removes_its_node_and_rack_but_not_its_siblings() -> None:
    forest = CellForest(make_nodes(4, racks_of=2))
    bad = [forest.by_id["n1/gpu5"]]
    # Racks: only rack1 is whole. Nodes: n0 (fragment of rack0) plus rack1's two when it is not asked for.
    assert both(forest, {"a": {(V, RACK): 1}}, bad) == []
    assert [p.available for p in both(forest, {"a": {(V, RACK): 2}}, bad)] == [1]
    assert both(forest, {"a": {(V, NODE): 3}}, bad) == []
    assert [(p.level, p.available) for p in both(forest, {"a": {(V, NODE): 4}}, bad)] == [(NODE, 3)]
    # Seven healthy GPUs remain on n1, but they form at most one 4-GPU cell and one 2-GPU cell.
    assert both(forest, {"a": {(V, NODE): 3, (V, GPU4): 1, (V, GPU2): 1, (V, GPU): 1}}, bad) == []
    problems = both(forest, {"a": {(V, NODE): 3, (V, GPU4): 2}}, bad)
    assert [(p.level, p.needed, p.available) for p in problems] == [(GPU4, 2, 1)]


def test_shortfall_at_a_level_does_not_leak_carry_to_lower_levels() -> None:
    forest = CellForest(make_nodes(2))
    # Three nodes asked, two exist: the shortfall is at the node level; nothing is left over for the
    # 4-GPU cell, which is a second shortfall, reported with its own (zero) availability.
    problems = both(forest, {"a": {(V, NODE): 3}, "b": {(V, GPU4): 1}}, [])
    assert [(p.level, p.needed, p.available) for p in problems] == [(NODE, 3, 2), (GPU4, 1, 0)]


def test_chains_are_independent() -> None:
    forest = CellForest([*make_nodes(2), *make_nodes(2, gpus=4, model="A100", prefix="m")])
    a100 = "A100x4"
    assert forest.chains[a100].kinds == ("gpu", "2gpu", "node")
    blocked = [forest.by_id["m0/gpu0"]]
    demand = {"a": {(V, NODE): 2}, "b": {(a100, 2): 1, (a100, 1): 1, (a100, 0): 1}}
    assert both(forest, demand, blocked) == []
    demand["b"] = {(a100, 2): 2}
    problems = both(forest, demand, blocked)
    assert [(p.chain.name, p.level, p.available) for p in problems] == [(a100, 2, 1)]


def test_zero_demand_and_empty_demand_fit_even_when_everything_is_blocked() -> None:
    forest = CellForest(make_nodes(2))
    assert both(forest, {}, list(forest.roots)) == []
    assert both(forest, {"a": {(V, NODE): 0}}, list(forest.roots)) == []
    assert [p.available for p in both(forest, {"a": {(V, GPU): 1}}, list(forest.roots))] == [0]


def test_count_based_check_uses_only_counts() -> None:
    # free(L) - fanout(L + 1) x free(L + 1) cells of level L have a non-free parent: with one free node of
    # two, the other node's free 4-GPU cell is such a fragment and serves the 4-GPU demand.
    forest = CellForest(make_nodes(2))
    counts = {(V, NODE): 1, (V, GPU4): 3, (V, GPU2): 6, (V, GPU): 12}
    assert shortfalls_from_counts(forest, {"a": {(V, NODE): 1, (V, GPU4): 1}}, counts) == []
    problems = shortfalls_from_counts(forest, {"a": {(V, NODE): 1, (V, GPU4): 2}}, counts)
    assert [(p.level, p.available) for p in problems] == [(GPU4, 1)]


# ============================================================================ property: random small cases
@st.composite
def small_case(draw: st.DrawFn) -> tuple[CellForest, list[Cell], dict[str, dict[tuple[str, int], int]]]:
    count = draw(st.integers(1, 4))
    gpus = draw(st.sampled_from([1, 2, 4, 6, 8]))
    racks_of = draw(st.sampled_from([0, 1, 2]))
    if racks_of and count % racks_of:
        racks_of = 0
    nodes: list[Node] = make_nodes(count, gpus=gpus, racks_of=racks_of)
    if draw(st.booleans()):
        nodes += make_nodes(2, gpus=4, model="A100", prefix="m", rack_prefix="arack",
                            racks_of=draw(st.sampled_from([0, 1, 2])))
    forest = CellForest(nodes)
    cells = sorted((c for root in forest.roots for c in root.walk()), key=lambda c: c.id)
    blocked = draw(st.lists(st.sampled_from(cells), max_size=3, unique=True))
    keys = sorted((chain.name, level) for chain in forest.chains.values() for level in range(len(chain.kinds)))
    demand: dict[str, dict[tuple[str, int], int]] = {}
    for vc in draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True)):
        demand[vc] = draw(st.dictionaries(st.sampled_from(keys), st.integers(0, 3), max_size=3))
    return forest, blocked, demand


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_case())
def test_both_checks_agree_and_match_an_exhaustive_search(
        case: tuple[CellForest, list[Cell], dict[str, dict[tuple[str, int], int]]]) -> None:
    forest, blocked, demand = case
    problems = both(forest, demand, blocked)
    assert (not problems) == brute_force_fits(forest, blocked, total(demand))
    wanted = total(demand)
    for problem in problems:
        key = (problem.chain.name, problem.level)
        assert problem.needed == wanted[key] > problem.available >= 0
        assert sum(n for _, n in problem.askers) == problem.needed
        assert all(demand[vc][key] == n > 0 for vc, n in problem.askers)


@settings(max_examples=60, deadline=None)
@given(small_case(), st.data())
def test_more_demand_or_more_blocking_never_removes_a_shortfall(
        case: tuple[CellForest, list[Cell], dict[str, dict[tuple[str, int], int]]], data: st.DataObject) -> None:
    forest, blocked, demand = case
    if not both(forest, demand, blocked):
        return
    cells = sorted((c for root in forest.roots for c in root.walk()), key=lambda c: c.id)
    more_blocked = [*blocked, data.draw(st.sampled_from(cells))]
    assert both(forest, demand, more_blocked)
    key = data.draw(st.sampled_from(sorted({k for cells_ in demand.values() for k in cells_})
                                    or [(next(iter(forest.chains)), 0)]))
    bigger = {vc: dict(cells_) for vc, cells_ in demand.items()}
    bigger["z"] = {key: 1}
    assert both(forest, bigger, blocked)
