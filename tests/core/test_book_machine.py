"""The allocation book against an oracle: a Hypothesis state machine allocates, releases, fails and heals
GPUs and nodes, snapshots and restores, and checks every free amount and index after each step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kubecell.core.book import AllocationBook
from kubecell.core.errors import AllocationError
from kubecell.core.model import MILLI_PER_GPU, Node, Request, make_node
from tests.core.book_support import assert_same_state, state_of

# --------------------------------------------------------------------- property-based state machine


@dataclass
class OracleGpu:
    capacity: int  # MiB, 0 = unknown (not enforced)
    healthy: bool = True
    holders: dict[str, tuple[int, int, bool]] = field(default_factory=dict)  # name -> (milli, memory, whole)

    @property
    def milli_free(self) -> int:
        return MILLI_PER_GPU - sum(m for m, _, _ in self.holders.values())

    @property
    def memory_used(self) -> int:
        return sum(mem for _, mem, _ in self.holders.values())

    def takes(self, request: Request) -> bool:
        if not self.healthy:
            return False
        if request.is_whole:
            return not self.holders
        if any(w for _, _, w in self.holders.values()):
            return False
        if self.milli_free < max(request.gpu_milli, 1):
            return False
        return self.capacity == 0 or self.capacity - self.memory_used >= request.gpu_memory_mib


@dataclass
class OracleNode:
    node: Node
    cpu_free: int
    mem_free: int
    gpus: list[OracleGpu]
    ok: bool = True


def _copy_oracle(nodes: list[OracleNode]) -> list[OracleNode]:
    return [
        OracleNode(n.node, n.cpu_free, n.mem_free, [OracleGpu(g.capacity, g.healthy, dict(g.holders)) for g in n.gpus],
                   n.ok)
        for n in nodes
    ]


@st.composite
def nodes_strategy(draw: Callable[..., Any]) -> list[Node]:
    count = draw(st.integers(1, 4))
    nodes = []
    for i in range(count):
        gpu_count = draw(st.integers(0, 4))
        model = draw(st.sampled_from(["T4", "A100", "G1"])) if gpu_count else ""
        memory = draw(st.sampled_from([0, 4000, 8000])) if gpu_count else None
        nodes.append(
            make_node(
                f"n{i}",
                cpu_milli=draw(st.sampled_from([0, 4000, 8000, 16000, 16000])),
                memory_mib=draw(st.sampled_from([0, 8000, 32000, 32000])),
                gpu_count=gpu_count,
                gpu_model=model,
                gpu_memory_mib=memory,
            )
        )
    return nodes


@st.composite
def request_strategy(draw: Callable[..., Any], name: str) -> Request:
    cpu = draw(st.sampled_from([0, 0, 500, 1000, 3000]))
    mem = draw(st.sampled_from([0, 0, 1000, 5000]))
    models = draw(st.sampled_from([None, None, None, None, frozenset({"T4"}), frozenset({"A100", "G1"})]))
    kind = draw(st.sampled_from(["cpu", "share", "share", "whole"]))
    if kind == "cpu":
        return Request(name, cpu_milli=cpu, memory_mib=mem, gpu_models=models)
    if kind == "whole":
        count = draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4]))
        return Request(name, cpu_milli=cpu, memory_mib=mem, gpu_count=count, gpu_milli=1000, gpu_models=models)
    milli = draw(st.sampled_from([0, 1, 100, 250, 500, 750, 999]))
    memory = draw(st.sampled_from([0, 500, 3000, 5000]))
    if milli == 0 and memory == 0:
        milli = 300
    return Request(
        name, cpu_milli=cpu, memory_mib=mem, gpu_count=1, gpu_milli=milli, gpu_memory_mib=memory, gpu_models=models
    )


class BookMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book: AllocationBook | None = None
        self.oracle: list[OracleNode] = []
        self.counter = 0
        self.names: set[str] = set()
        self.saved: tuple[Any, list[OracleNode], set[str]] | None = None

    @initialize(nodes=nodes_strategy())
    def build(self, nodes: list[Node]) -> None:
        self.book = AllocationBook(nodes)
        self.oracle = [
            OracleNode(n, n.cpu_milli, n.memory_mib, [OracleGpu(g.memory_mib) for g in n.gpus]) for n in nodes
        ]

    def _expect_fit(self, request: Request, node: int, gpus: tuple[int, ...]) -> bool:
        if request.name in self.names:
            return False
        if not 0 <= node < len(self.oracle):
            return False
        state = self.oracle[node]
        if not state.ok:
            return False
        if len(gpus) != request.gpu_count or len(set(gpus)) != len(gpus):
            return False
        if state.cpu_free < request.cpu_milli or state.mem_free < request.memory_mib:
            return False
        if gpus and not request.allows_model(state.node.gpu_model):
            return False
        return all(0 <= g < len(state.gpus) and state.gpus[g].takes(request) for g in gpus)

    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        assert self.book is not None
        self.counter += 1
        reuse = bool(self.names) and data.draw(st.integers(0, 9), label="reuse-roll") == 0
        name = data.draw(st.sampled_from(sorted(self.names)), label="name") if reuse else f"r{self.counter}"
        request = data.draw(request_strategy(name), label="request")
        if data.draw(st.integers(0, 9), label="bad-node-roll") == 0:
            node = data.draw(st.sampled_from([-1, self.book.size]), label="bad-node")
        else:
            node = data.draw(st.integers(0, self.book.size - 1), label="node")
        known = self.oracle[node].gpus if 0 <= node < len(self.oracle) else []
        mode = data.draw(st.sampled_from(["free", "free", "present", "any"]), label="mode")
        if mode != "any" and not request.wants_gpu:
            gpus: tuple[int, ...] = ()
        elif mode != "any":
            # GPUs that exist, preferring those that could take it, so that many allocations succeed.
            usable = [i for i, g in enumerate(known) if g.takes(request)]
            if mode == "present" or len(usable) < request.gpu_count:
                usable = list(range(len(known)))
            gpus = tuple(data.draw(st.permutations(usable), label="gpus")[: request.gpu_count])
        else:
            size = data.draw(st.integers(0, 3), label="gpu-list-size")
            gpus = tuple(data.draw(st.lists(st.integers(-1, 4), min_size=size, max_size=size), label="gpus"))
        expected = self._expect_fit(request, node, gpus)
        before = state_of(self.book)
        try:
            allocation = self.book.allocate(request, node, gpus)
        except AllocationError:
            assert not expected, f"refused a fitting allocation {request} on {node} {gpus}"
            assert_same_state(before, state_of(self.book))
            return
        assert expected, f"accepted an allocation that does not fit: {request} on {node} {gpus}"
        assert allocation.gpu_indices == gpus
        state = self.oracle[node]
        state.cpu_free -= request.cpu_milli
        state.mem_free -= request.memory_mib
        for g in gpus:
            state.gpus[g].holders[name] = (request.gpu_milli, request.gpu_memory_mib, request.is_whole)
        self.names.add(name)
        changed = self.book.changed_since(before["clock"]).tolist()
        assert changed == [node]

    @precondition(lambda self: self.book is not None and bool(self.book.allocations))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        assert self.book is not None
        name = data.draw(st.sampled_from(sorted(self.book.allocations)))
        allocation = self.book.release(name)
        state = self.oracle[self.book.index[allocation.node]]
        state.cpu_free += allocation.request.cpu_milli
        state.mem_free += allocation.request.memory_mib
        for g in allocation.gpu_indices:
            del state.gpus[g].holders[name]
        self.names.remove(name)

    @rule()
    def release_unknown(self) -> None:
        assert self.book is not None
        before = state_of(self.book)
        with pytest.raises(AllocationError):
            self.book.release("never-allocated")
        assert_same_state(before, state_of(self.book))

    @rule(data=st.data())
    def toggle_health(self, data: st.DataObject) -> None:
        assert self.book is not None
        gpus = [(i, g) for i, n in enumerate(self.oracle) for g in range(len(n.gpus))]
        if not gpus:
            return
        node, gpu = data.draw(st.sampled_from(gpus))
        healthy = data.draw(st.booleans())
        self.book.set_gpu_health(node, gpu, healthy)
        self.oracle[node].gpus[gpu].healthy = healthy

    @rule(data=st.data())
    def toggle_node(self, data: st.DataObject) -> None:
        assert self.book is not None
        node = data.draw(st.integers(0, self.book.size - 1))
        healthy = data.draw(st.booleans())
        self.book.set_node_health(node, healthy)
        self.oracle[node].ok = healthy
        for gpu in self.oracle[node].gpus:
            gpu.healthy = healthy

    @rule()
    def save(self) -> None:
        assert self.book is not None
        self.saved = (self.book.snapshot(), _copy_oracle(self.oracle), set(self.names))

    @precondition(lambda self: self.saved is not None)
    @rule()
    def restore(self) -> None:
        assert self.book is not None
        assert self.saved is not None
        snapshot, oracle, names = self.saved
        clock = self.book.clock
        before = state_of(self.book)
        self.book.restore(snapshot)
        self.oracle = _copy_oracle(oracle)
        self.names = set(names)
        after = state_of(self.book)
        raw = ("cpu_free", "mem_free", "gpu_milli_free", "gpu_mem_free", "gpu_healthy", "node_ok", "affinity")
        differs = np.zeros(self.book.size, np.bool_)
        for key in raw:
            diff = before[key] != after[key]
            differs |= diff if diff.ndim == 1 else diff.any(axis=1)
        assert self.book.changed_since(clock).tolist() == np.flatnonzero(differs).tolist()

    @invariant()
    def consistent(self) -> None:
        if self.book is None:
            return
        book = self.book
        book.check_invariants()
        assert (book.cpu_free >= 0).all()
        assert (book.mem_free >= 0).all()
        assert (book.gpu_milli_free >= 0).all()
        assert (book.gpu_mem_free >= 0).all()
        assert set(book.allocations) == self.names
        assert book.allocated_gpu_milli == sum(MILLI_PER_GPU - g.milli_free for n in self.oracle for g in n.gpus)
        for i, state in enumerate(self.oracle):
            assert bool(book.node_ok[i]) == state.ok
            assert book.cpu_free[i] == state.cpu_free
            assert book.mem_free[i] == state.mem_free
            for j, g in enumerate(state.gpus):
                assert book.gpu_milli_free[i, j] == g.milli_free
                assert book.gpu_avail[i, j] == (g.milli_free if g.healthy and state.ok else 0)
                assert book.gpu_full[i, j] == (g.healthy and state.ok and not g.holders)
                if g.capacity:
                    expected = 0 if any(w for _, _, w in g.holders.values()) else g.capacity - g.memory_used
                    assert book.gpu_mem_free[i, j] == expected
            usable = [g.milli_free if g.healthy and state.ok else 0 for g in state.gpus]
            assert book.full_count[i] == sum(1 for g in state.gpus if g.healthy and state.ok and not g.holders)
            assert book.total_avail[i] == sum(usable)
            assert book.max_avail[i] == max(usable, default=0)


BookMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestBookStateMachine = BookMachine.TestCase
