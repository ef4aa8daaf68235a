"""Compact, stable placement of sized jobs."""

from __future__ import annotations

from kubecell.core.elastic.placement import NodePool, place
from kubecell.core.elastic.types import ClusterNode

NODES = [ClusterNode(f"n{i}", "a100", 8) for i in range(3)] + [ClusterNode("t", "t4", 4)]


def test_big_jobs_take_whole_nodes_and_small_ones_best_fit() -> None:
    result = place({"big": ("a100", 12), "small": ("a100", 2), "tiny": ("a100", 4), "t": ("t4", 3)}, {}, NODES, {})
    assert sorted(set(result["big"])) == ["n0", "n1"]
    assert result["big"].count("n0") == 8
    assert set(result["tiny"]) == {"n1"}  # best fit: the 4 left on n1
    assert set(result["small"]) == {"n2"}
    assert result["t"] == ("t", "t", "t")


def test_kept_jobs_keep_their_nodes() -> None:
    keep = {"a": ("n2", "n2")}
    result = place({"a": ("a100", 2), "b": ("a100", 8)}, keep, NODES, {})
    assert result["a"] == ("n2", "n2")
    assert set(result["b"]) == {"n0"}


def test_queued_jobs_get_nothing() -> None:
    assert place({"q": ("", 0)}, {}, NODES, {}) == {"q": ()}


def test_spread_when_no_node_holds_the_rest() -> None:
    pool = NodePool([ClusterNode("x", "a", 4), ClusterNode("y", "a", 4)])
    assert pool.pin(("x", "x", "x", "y", "y", "y"))
    assert sorted(pool.take(2)) == ["x", "y"]
    assert not pool.pin(("x",))
