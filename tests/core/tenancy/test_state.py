"""Runtime tenancy: binding cells to virtual clusters, the incremental free-cell sets, safe splits, pinned
cells and HiveD's doomed bad cells."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node
from kubecell.core.tenancy.feasibility import shortfalls_from_counts
from kubecell.core.tenancy.state import TenancyState
from kubecell.core.topology import Cell, CellForest
from tests.core.support import count_free, make_nodes, tenants

V = "V100M32x8"
GPU, GPU2, GPU4, NODE, RACK = 0, 1, 2, 3, 4


def build(nodes: list[Node], vcs: dict[str, Any]) -> tuple[CellForest, AllocationBook, TenancyState]:
    forest = CellForest(nodes)
    book = AllocationBook(nodes)
    return forest, book, TenancyState(forest, tenants(forest, vcs), book)


def all_cells(forest: CellForest) -> list[Cell]:
    return sorted((c for root in forest.roots for c in root.walk()), key=lambda c: c.id)


def assert_consistent(forest: CellForest, state: TenancyState) -> None:
    """The incrementally maintained free sets, flags and owner matrix equal a from-scratch computation."""
    blocked = set(state.binding) | state.bad
    expected = count_free(forest, blocked)
    assert state.free_counts() == expected
    free = {c for c in all_cells(forest) if c not in blocked and not any(a in blocked for a in c.ancestors())
            and not any(d in blocked for d in c.walk())}
    for type_name in forest.type_names():
        assert set(state.free_cells_of_type(type_name)) == {c for c in free if c.type_name == type_name}
        cells, flags, _, _, parent_free = state.type_arrays(type_name)
        assert [bool(f) for f in flags] == [c in free for c in cells]
        assert [bool(f) for f in parent_free] == [c.parent is not None and c.parent in free for c in cells]
    for cell in all_cells(forest):
        assert state.is_free(cell) == (cell in free)
    owner = np.full_like(state.owner, -1)
    for cell, vc in state.binding.items():
        for node, gpu in cell.gpus:
            assert owner[node, gpu] == -1, "two bound cells overlap"
            owner[node, gpu] = state.vc_index[vc]
    assert (state.owner == owner).all()


def remaining_fits(forest: CellForest, state: TenancyState) -> bool:
    demand = {vc: state.remaining(vc) for vc in state.unbound}
    return not shortfalls_from_counts(forest, demand, state.free_counts())


# ============================================================================ binding and unbinding
def test_fresh_state_binds_nothing_and_everything_is_free() -> None:
    forest, _, state = build(make_nodes(4, racks_of=2), {"a": {"gpus": 16}, "b": {"cells": {f"{V}/rack": 1}}})
    assert state.binding == {}
    assert (state.owner == -1).all()
    assert state.unbound == {"a": Counter({(V, NODE): 2}), "b": Counter({(V, RACK): 1})}
    assert state.remaining("a") == Counter({(V, NODE): 2})
    assert state.free_counts() == {(V, GPU): 32, (V, GPU2): 16, (V, GPU4): 8, (V, NODE): 4, (V, RACK): 2}
    assert_consistent(forest, state)


def test_bind_blocks_the_cell_its_subtree_and_ancestors_and_unbind_restores_everything() -> None:
    forest, _, state = build(make_nodes(4, racks_of=2), {"a": {"cells": {f"{V}/4gpu": 2}}})
    before = (state.free_counts(), Counter(state.unbound["a"]))
    cell = forest.by_id["n1/4gpu1"]
    state.bind("a", cell)
    assert state.binding == {cell: "a"}
    assert state.unbound["a"] == Counter({(V, GPU4): 1})
    assert state.bound_cells("a") == [cell]
    for blocked in ("n1/4gpu1", "n1/2gpu3", "n1/gpu7", "n1", "rack0"):
        assert not state.is_free(forest.by_id[blocked]), blocked
    for free in ("n1/4gpu0", "n1/2gpu0", "n0", "rack1"):
        assert state.is_free(forest.by_id[free]), free
    assert int((state.owner == state.vc_index["a"]).sum()) == 4
    assert set(cell.gpus) == {(int(n), int(g)) for n, g in np.argwhere(state.owner == 0)}
    assert state.cell_bound_above(forest.by_id["n1/gpu6"]) is cell
    assert state.cell_bound_above(forest.by_id["n1/gpu0"]) is None
    assert state.cells_touching([next(iter(cell.gpus)), (0, 0)]) == {cell}
    assert_consistent(forest, state)
    state.unbind(cell)
    assert (state.free_counts(), state.unbound["a"]) == before
    assert (state.owner == -1).all()
    assert_consistent(forest, state)


def test_version_moves_on_every_change() -> None:
    forest, _, state = build(make_nodes(2), {"a": {"gpus": 8}})
    v0 = state.version
    state.bind("a", forest.by_id["n0"])
    v1 = state.version
    state.unbind(forest.by_id["n0"])
    assert v0 < v1 < state.version


def test_cannot_bind_a_type_the_vc_has_no_unbound_cell_of() -> None:
    forest, _, state = build(make_nodes(2), {"a": {"cells": {f"{V}/node": 1}}})
    assert not state.can_bind("a", forest.by_id["n0/4gpu0"])
    state.bind("a", forest.by_id["n0"])
    assert not state.can_bind("a", forest.by_id["n1"])  # its one node cell is bound already
    with pytest.raises(ValueError, match="cannot bind n1 to a"):
        state.bind("a", forest.by_id["n1"])
    assert_consistent(forest, state)


def test_cannot_bind_a_cell_that_is_not_free() -> None:
    forest, _, state = build(make_nodes(2), {"a": {"cells": {f"{V}/node": 1}}, "b": {"cells": {f"{V}/4gpu": 2}}})
    state.bind("b", forest.by_id["n0/4gpu0"])
    assert not state.can_bind("a", forest.by_id["n0"])  # it contains b's cell
    assert not state.can_bind("b", forest.by_id["n0/4gpu0"])  # already bound
    state.bind("a", forest.by_id["n1"])
    assert not state.can_bind("b", forest.by_id["n1/4gpu0"])  # inside a's cell
    assert state.can_bind("b", forest.by_id["n0/4gpu1"])


def test_unknown_vc_is_an_error() -> None:
    _, _, state = build(make_nodes(2), {"a": {"gpus": 8}})
    with pytest.raises(InvalidInputError, match="unknown virtual cluster 'zzz'"):
        state.vc_for("zzz")
    assert state.vc_for("a").name == "a"


# ============================================================================ safe splits
def test_a_split_that_would_break_another_guarantee_is_refused() -> None:
    # a needs a whole node; b two 4-GPU cells. Once b holds half of n0, splitting n1 as well would leave
    # no whole node for a, so b must take the other half of n0 (buddy order).
    forest, _, state = build(make_nodes(2), {"a": {"cells": {f"{V}/node": 1}}, "b": {"cells": {f"{V}/4gpu": 2}}})
    assert state.can_bind("b", forest.by_id["n0/4gpu0"])
    state.bind("b", forest.by_id["n0/4gpu0"])
    assert not state.can_bind("b", forest.by_id["n1/4gpu0"])
    assert not state.can_bind("b", forest.by_id["n1/4gpu1"])
    with pytest.raises(ValueError, match="cannot bind"):
        state.bind("b", forest.by_id["n1/4gpu0"])
    assert state.can_bind("b", forest.by_id["n0/4gpu1"])
    assert remaining_fits(forest, state)
    assert_consistent(forest, state)


def test_safe_split_across_racks() -> None:
    # hived_safe_split: a needs two whole racks of three, b two nodes. b's second node must share the
    # rack of its first one.
    forest, _, state = build(make_nodes(6, racks_of=2),
                             {"a": {"cells": {f"{V}/rack": 2}}, "b": {"cells": {f"{V}/node": 2}}})
    state.bind("b", forest.by_id["n0"])
    assert not state.can_bind("b", forest.by_id["n2"])
    assert not state.can_bind("b", forest.by_id["n5"])
    assert state.can_bind("b", forest.by_id["n1"])
    state.bind("b", forest.by_id["n1"])
    assert state.can_bind("a", forest.by_id["rack1"])
    assert state.can_bind("a", forest.by_id["rack2"])


def test_own_guarantee_counts_too() -> None:
    # A VC may not strand its own larger cells either: a holds one node and two 4-GPU cells on two nodes.
    forest, _, state = build(make_nodes(2), {"a": {"cells": {f"{V}/node": 1, f"{V}/4gpu": 2}}})
    state.bind("a", forest.by_id["n1/4gpu1"])
    assert not state.can_bind("a", forest.by_id["n0/4gpu0"])
    assert state.can_bind("a", forest.by_id["n1/4gpu0"])


# ============================================================================ pinned cells
def test_pinned_cells_are_bound_for_good() -> None:
    forest, _, state = build(make_nodes(4, racks_of=2), {"p": {"pinnedCells": ["n3"]}, "a": {"gpus": 16}})
    pinned = forest.by_id["n3"]
    assert state.binding == {pinned: "p"}
    assert state.pinned == {pinned: "p"}
    assert state.remaining("p") == Counter()
    assert not state.is_free(forest.by_id["rack1"])
    state.unbind(pinned)  # a no-op for pinned cells
    assert state.binding == {pinned: "p"}
    assert_consistent(forest, state)


def test_reconfigure_drops_every_binding_and_pins_the_new_cells() -> None:
    forest, _, state = build(make_nodes(4), {"p": {"pinnedCells": ["n3"]}, "a": {"gpus": 16}})
    state.bind("a", forest.by_id["n0"])
    state.reconfigure(tenants(forest, {"q": {"pinnedCells": ["n1/4gpu0"]}, "a": {"gpus": 8}}))
    assert state.binding == {forest.by_id["n1/4gpu0"]: "q"}
    assert state.pinned == {forest.by_id["n1/4gpu0"]: "q"}
    assert state.unbound == {"q": Counter(), "a": Counter({(V, NODE): 1})}
    assert state.vc_index == {"q": 0, "a": 1}
    assert_consistent(forest, state)


# ============================================================================ bad hardware, doomed cells
def mark_bad(book: AllocationBook, state: TenancyState, node: int, gpus: range | list[int] | None = None,
             healthy: bool = False) -> None:
    for gpu in gpus if gpus is not None else range(int(book.gpu_count[node])):
        book.set_gpu_health(node, gpu, healthy)
    state.refresh_health()


def test_bad_cells_with_spare_capacity_doom_nothing() -> None:
    forest, book, state = build(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 8}})
    mark_bad(book, state, 0)
    assert state.bad == {forest.by_id[f"n0/gpu{g}"] for g in range(8)}
    assert state.doomed == {}
    assert state.doomed_gpus("a") == state.doomed_gpus("b") == 0
    assert not state.is_free(forest.by_id["n0"])
    assert not state.can_bind("a", forest.by_id["n0"])  # a bad cell is never bound while healthy ones remain
    assert forest.by_id["n0"] not in state.bindable("a")
    assert {c.id for c in state.bindable("a")} == {"n1", "n2", "n3"}
    assert_consistent(forest, state)


def test_doomed_only_when_unavoidable_and_lifted_on_recovery() -> None:
    forest, book, state = build(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}})
    mark_bad(book, state, 0, [3])  # one bad GPU spoils the whole node cell
    assert sum(state.doomed_gpus(vc) for vc in ("a", "b")) == 8  # exactly the shortfall: one node
    assert state.doomed == {"a": Counter({(V, NODE): 1})}  # ties go to the first VC by name
    assert state.remaining("a") == Counter({(V, NODE): 1})
    assert remaining_fits(forest, state)
    assert not state.can_bind("a", forest.by_id["n0"])
    mark_bad(book, state, 0, [3], healthy=True)
    assert state.doomed == {}
    assert state.bad == set()
    assert state.remaining("a") == Counter({(V, NODE): 2})
    assert state.can_bind("a", forest.by_id["n0"])
    assert_consistent(forest, state)


def test_doom_goes_to_the_vc_asking_for_the_most_cells_of_that_type() -> None:
    _, book, state = build(make_nodes(4), {"a": {"gpus": 8}, "b": {"gpus": 24}})
    mark_bad(book, state, 2)
    assert state.doomed == {"b": Counter({(V, NODE): 1})}
    mark_bad(book, state, 3)
    assert state.doomed == {"b": Counter({(V, NODE): 2})}


def test_bound_cells_are_not_doomed_only_the_unbound_guarantee() -> None:
    forest, book, state = build(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}})
    state.bind("a", forest.by_id["n0"])
    state.bind("a", forest.by_id["n1"])
    mark_bad(book, state, 0)  # a's bound node fails: a keeps it; b still has two healthy nodes
    assert state.doomed == {}
    mark_bad(book, state, 2)
    assert state.doomed == {"b": Counter({(V, NODE): 1})}
    assert state.binding == {forest.by_id["n0"]: "a", forest.by_id["n1"]: "a"}
    state.unbind(forest.by_id["n0"])  # the bad node goes back to the pool but stays blocked
    assert not state.is_free(forest.by_id["n0"])
    assert_consistent(forest, state)


def test_unbinding_a_bad_bound_cell_recomputes_doomed_cells() -> None:
    forest, book, state = build(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}})
    state.bind("a", forest.by_id["n0"])
    mark_bad(book, state, 0)
    assert state.doomed == {}  # a keeps its bound (bad) node; b's two nodes are healthy and free
    state.unbind(forest.by_id["n0"])  # a's job there stopped: the cell goes back to the pool
    assert sum(state.doomed_gpus(vc) for vc in ("a", "b")) == 8
    assert remaining_fits(forest, state)


def test_the_vc_whose_bound_cell_failed_bears_the_doom_not_a_bystander() -> None:
    # b asks for more nodes than a, so the old rule charged b; but it was a's node that failed.
    forest, book, state = build(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}})
    state.bind("a", forest.by_id["n0"])
    state.bind("a", forest.by_id["n1"])
    mark_bad(book, state, 0)
    state.unbind(forest.by_id["n0"])  # a's job there stopped: its guarantee needs a node again
    assert state.doomed == {"a": Counter({(V, NODE): 1})}
    assert state.remaining("b") == Counter({(V, NODE): 2})  # b can still bind both of its nodes
    assert remaining_fits(forest, state)
    mark_bad(book, state, 0, healthy=True)
    assert state.doomed == {}
    # A free cell that fails belonged to nobody: the old rule decides (the VC asking for most).
    mark_bad(book, state, 3)
    assert state.doomed == {"b": Counter({(V, NODE): 1})}


def test_releasing_a_healthy_cell_lifts_the_doom_its_split_caused() -> None:
    # b's 4-GPU cell splits n1, then n0 fails: a's node cannot be met. Releasing b's (healthy) cell makes
    # n1 whole again, so a's doom must go; a stale charge would keep a off n1 until n0 is repaired.
    forest, book, state = build(make_nodes(2), {"a": {"gpus": 8}, "b": {"cells": {f"{V}/4gpu": 1}}})
    state.bind("b", forest.by_id["n1/4gpu0"])
    mark_bad(book, state, 0, [3])
    assert state.doomed == {"a": Counter({(V, NODE): 1})}
    state.unbind(forest.by_id["n1/4gpu0"])
    assert state.doomed == {}
    assert state.can_bind("a", forest.by_id["n1"])
    assert_consistent(forest, state)


def test_doom_at_a_lower_level_after_a_partial_failure() -> None:
    # Two nodes; a wants a node, b two 4-GPU cells. A bad GPU on n1 leaves one free node and one free
    # 4-GPU cell: b is short one 4-GPU cell, not a node, and a is not charged anything.
    _, book, state = build(make_nodes(2), {"a": {"cells": {f"{V}/node": 1}}, "b": {"cells": {f"{V}/4gpu": 2}}})
    mark_bad(book, state, 1, [0])
    assert state.doomed == {"b": Counter({(V, GPU4): 1})}
    assert state.doomed_gpus("b") == 4


# ============================================================================ property: random operations
@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[Node], dict[str, Any], list[tuple[str, int, int]]]:
    count = draw(st.integers(1, 4))
    gpus = draw(st.sampled_from([2, 4, 8]))
    racks_of = draw(st.sampled_from([0, 1, 2]))
    if racks_of and count % racks_of:
        racks_of = 0
    nodes = make_nodes(count, gpus=gpus, racks_of=racks_of)
    types = CellForest(nodes).type_names()
    vcs: dict[str, Any] = {}
    for vc in ("a", "b", "c")[:draw(st.integers(1, 3))]:
        cells = draw(st.dictionaries(st.sampled_from(types), st.integers(0, 2), min_size=1, max_size=3))
        vcs[vc] = {"cells": cells}
    ops = draw(st.lists(st.tuples(st.sampled_from(["bind", "bind", "unbind", "health"]),
                                  st.integers(0, 10_000), st.integers(0, 10_000)), max_size=25))
    return nodes, vcs, ops


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(scenario())
def test_random_operations_keep_free_sets_consistent_and_every_guarantee_feasible(
        case: tuple[list[Node], dict[str, Any], list[tuple[str, int, int]]]) -> None:
    nodes, vcs, ops = case
    forest = CellForest(nodes)
    try:
        config = tenants(forest, vcs)
    except InvalidInputError:
        return  # an unsatisfiable or empty configuration: covered by the config tests
    book = AllocationBook(nodes)
    state = TenancyState(forest, config, book)
    cells = all_cells(forest)
    assert remaining_fits(forest, state)
    for op, x, y in ops:
        if op == "bind":
            vc, cell = config.names[x % len(config.names)], cells[y % len(cells)]
            before = state.free_counts()
            fitted = remaining_fits(forest, state)
            if state.can_bind(vc, cell):
                state.bind(vc, cell)
                # the safe-split rule: no binding makes any VC's remaining guarantee infeasible (a state
                # that is already infeasible is test_unbinding_a_bad_bound_cell_recomputes_doomed_cells's bug)
                assert remaining_fits(forest, state) or not fitted, f"binding {cell} to {vc} broke a guarantee"
            else:
                with pytest.raises(ValueError, match="cannot bind"):
                    state.bind(vc, cell)
                assert state.free_counts() == before  # a refused bind changes nothing
        elif op == "unbind" and state.binding:
            bound = sorted(state.binding, key=lambda c: c.id)
            state.unbind(bound[x % len(bound)])
        elif op == "health":
            node, gpu = x % len(nodes), y % int(book.gpu_count[0])
            book.set_gpu_health(node, gpu, not bool(book.gpu_healthy[node, gpu]))
            state.refresh_health()
        # after every operation (not only health changes), doomed cells absorb exactly what the
        # healthy free cells cannot provide
        unbound = {vc: +c for vc, c in state.unbound.items()}
        problems = shortfalls_from_counts(forest, unbound, state.free_counts())
        doomed = Counter[tuple[str, int]]()
        for per_vc in state.doomed.values():
            doomed.update(per_vc)
        assert doomed == Counter({(p.chain.name, p.level): p.needed - p.available for p in problems}), op
        for vc, per_vc in state.doomed.items():
            assert all(n <= state.unbound[vc][key] for key, n in per_vc.items())
        assert remaining_fits(forest, state)
        assert_consistent(forest, state)
