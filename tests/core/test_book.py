"""The allocation book: exact accounting, all-or-nothing changes, snapshots and versions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kubecell.core.book import UNENFORCED_GPU_MEMORY_MIB, AllocationBook, affinity_class
from kubecell.core.errors import AllocationError, InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Gpu, Node, Request, make_node

STATE_FIELDS = (
    "cpu_free",
    "mem_free",
    "gpu_milli_free",
    "gpu_mem_free",
    "gpu_healthy",
    "node_ok",
    "affinity",
    "gpu_avail",
    "gpu_full",
    "full_count",
    "max_avail",
    "total_avail",
    "version",
)


def state_of(book: AllocationBook) -> dict[str, Any]:
    """Everything an allocation may change, copied."""
    state: dict[str, Any] = {name: getattr(book, name).copy() for name in STATE_FIELDS}
    state["clock"] = book.clock
    state["allocations"] = dict(book.allocations)
    return state


def assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(after[key], value, err_msg=key)
        else:
            assert after[key] == value, key


def small_cluster() -> AllocationBook:
    return AllocationBook(
        [
            make_node("a", cpu_milli=8000, memory_mib=16000, gpu_count=2, gpu_model="T4", gpu_memory_mib=16000),
            make_node("b", cpu_milli=4000, memory_mib=8000, gpu_count=4, gpu_model="A100", gpu_memory_mib=40000),
            make_node("c", cpu_milli=2000, memory_mib=4000),
        ]
    )


def share(name: str, milli: int = 0, memory: int = 0, cpu: int = 0, mem: int = 0, **kw: Any) -> Request:
    return Request(name, cpu_milli=cpu, memory_mib=mem, gpu_count=1, gpu_milli=milli, gpu_memory_mib=memory, **kw)


def whole(name: str, count: int = 1, cpu: int = 0, mem: int = 0, **kw: Any) -> Request:
    return Request(name, cpu_milli=cpu, memory_mib=mem, gpu_count=count, gpu_milli=MILLI_PER_GPU, **kw)


# ------------------------------------------------------------------------------- construction / lookup


def test_duplicate_node_names_rejected() -> None:
    nodes = [make_node(n, cpu_milli=1, memory_mib=1) for n in ("x", "y", "x")]
    with pytest.raises(InvalidInputError) as caught:
        AllocationBook(nodes)
    assert "duplicate node name 'x'" in str(caught.value)
    assert "#2" in str(caught.value)


def test_layout_of_a_heterogeneous_cluster() -> None:
    book = small_cluster()
    assert book.size == 3
    assert book.max_gpus == 4
    assert book.node("b") == 1
    np.testing.assert_array_equal(book.gpu_present[0], [True, True, False, False])
    np.testing.assert_array_equal(book.gpu_present[2], [False] * 4)
    assert book.model_names == ("", "A100", "T4")
    assert [book.model_names[m] for m in book.model_id] == ["T4", "A100", ""]
    assert book.total_gpu_milli == 6000
    assert book.allocated_gpu_milli == 0
    np.testing.assert_array_equal(book.full_count, [2, 4, 0])
    np.testing.assert_array_equal(book.total_avail, [2000, 4000, 0])
    with pytest.raises(InvalidInputError, match="unknown node 'zz'"):
        book.node("zz")


# ----------------------------------------------------------------------------------- round trip


def test_allocate_and_release_round_trip() -> None:
    book = small_cluster()
    initial = state_of(book)

    a1 = book.allocate(share("s1", milli=300, memory=4000, cpu=1000, mem=2000), 0, [1])
    assert (a1.node, a1.gpu_indices, a1.gpu_milli, a1.gpu_memory_mib) == ("a", (1,), 300, 4000)
    a2 = book.allocate(whole("w2", 2, cpu=500, mem=100), 1, [0, 3])
    # A whole GPU takes all of that GPU's memory, and the record says how much.
    assert (a2.gpu_indices, a2.gpu_milli, a2.gpu_memory_mib) == ((0, 3), 1000, 40000)
    book.allocate(Request("cpu3", cpu_milli=1500, memory_mib=1000), 2)
    book.allocate(share("s4", milli=700, memory=12000), 0, [1])

    assert book.cpu_free.tolist() == [7000, 3500, 500]
    assert book.mem_free.tolist() == [14000, 7900, 3000]
    assert book.gpu_milli_free[0].tolist() == [1000, 0, 0, 0]
    assert book.gpu_mem_free[0].tolist() == [16000, 0, 0, 0]
    assert book.gpu_milli_free[1].tolist() == [0, 1000, 1000, 0]
    assert book.gpu_mem_free[1].tolist() == [0, 40000, 40000, 0]
    assert book.full_count.tolist() == [1, 2, 0]
    assert book.max_avail.tolist() == [1000, 1000, 0]
    assert book.total_avail.tolist() == [1000, 2000, 0]
    assert book.allocated_gpu_milli == 3000
    assert book.affinity[0, 0] == 2
    assert book.affinity[1, 2] == 1
    assert book.affinity[2].sum() == 0  # CPU-only requests have no GPU kind
    book.check_invariants()

    for name in ("w2", "s1", "cpu3", "s4"):
        released = book.release(name)
        assert released.name == name
        book.check_invariants()
    after = state_of(book)
    for key in STATE_FIELDS:
        if key != "version":
            np.testing.assert_array_equal(after[key], initial[key], err_msg=key)
    assert after["allocations"] == {}


def test_release_unknown_allocation() -> None:
    book = small_cluster()
    with pytest.raises(AllocationError, match="no allocation named 'ghost'"):
        book.release("ghost")
    book.allocate(share("s", milli=100), 0, [0])
    book.release("s")
    with pytest.raises(AllocationError):
        book.release("s")


def test_affinity_classes() -> None:
    assert affinity_class(Request("c", cpu_milli=1)) == -1
    assert affinity_class(share("s", milli=10)) == 0
    assert affinity_class(share("m", memory=10)) == 0
    assert affinity_class(whole("w1", 1)) == 1
    assert affinity_class(whole("w4", 4)) == 4
    assert affinity_class(whole("w8", 8)) == 8
    assert affinity_class(whole("w16", 16)) == 8


# --------------------------------------------------------------------------- refused allocations


def _setup_busy(book: AllocationBook) -> None:
    book.allocate(share("busy-share", milli=600, memory=10000, cpu=6000, mem=12000), 0, [0])
    book.allocate(whole("busy-whole"), 0, [1])
    book.allocate(share("busy-mem", memory=1000), 1, [2])


REFUSED: list[tuple[str, Request, int, tuple[int, ...], str]] = [
    ("cpu", Request("x", cpu_milli=2001), 0, (), "CPU/memory oversubscribed"),
    ("host-memory", Request("x", memory_mib=4001), 0, (), "CPU/memory oversubscribed"),
    ("cpu-on-gpu-request", share("x", milli=100, cpu=4001), 1, (0,), "CPU/memory oversubscribed"),
    ("milli", share("x", milli=401), 0, (0,), "cannot take it"),
    ("gpu-memory", share("x", milli=100, memory=6001), 0, (0,), "cannot take it"),
    ("memory-only-share", share("x", memory=6001), 0, (0,), "cannot take it"),
    ("share-on-whole-gpu", share("x", milli=1), 0, (1,), "cannot take it"),
    ("memory-share-on-whole-gpu", share("x", memory=1), 0, (1,), "cannot take it"),
    ("whole-on-shared-gpu", whole("x"), 0, (0,), "cannot take it"),
    ("whole-on-whole-gpu", whole("x"), 0, (1,), "cannot take it"),
    ("whole-on-memory-shared-gpu", whole("x"), 1, (2,), "cannot take it"),
    ("one-of-two-whole-taken", whole("x", 2), 1, (1, 2), "cannot take it"),
    ("missing-gpu", share("x", milli=100), 0, (2,), "GPU 2 does not exist"),
    ("gpu-beyond-any-node", share("x", milli=100), 1, (4,), "GPU 4 does not exist"),
    ("negative-gpu", share("x", milli=100), 1, (-1,), "GPU -1 does not exist"),
    ("cpu-node-gpu", share("x", milli=100), 2, (0,), "does not exist"),
    ("too-few-gpus", whole("x", 2), 1, (0,), "needs 2 distinct GPUs"),
    ("too-many-gpus", share("x", milli=100), 1, (0, 1), "needs 1 distinct GPUs"),
    ("repeated-gpu", whole("x", 2), 1, (0, 0), "needs 2 distinct GPUs"),
    ("gpus-for-cpu-request", Request("x", cpu_milli=1), 1, (0,), "needs 0 distinct GPUs"),
    ("no-gpus-for-gpu-request", share("x", milli=1), 1, (), "needs 1 distinct GPUs"),
    ("model", share("x", milli=100, gpu_models=frozenset({"T4"})), 1, (0,), "GPU model A100 not allowed"),
    ("node-range", Request("x"), 3, (), "out of range"),
    ("negative-node", Request("x"), -1, (), "out of range"),
    ("duplicate-name", Request("busy-share"), 2, (), "already exists"),
]


@pytest.mark.parametrize(
    ("request_", "node", "gpus", "fragment"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED]
)
def test_refused_allocation_changes_nothing(request_: Request, node: int, gpus: tuple[int, ...], fragment: str) -> None:
    book = small_cluster()
    _setup_busy(book)
    before = state_of(book)
    with pytest.raises(AllocationError, match=fragment):
        book.allocate(request_, node, gpus)
    assert_same_state(before, state_of(book))
    book.check_invariants()


def test_exact_fit_is_accepted() -> None:
    book = small_cluster()
    _setup_busy(book)
    book.allocate(share("rest", milli=400, memory=6000, cpu=2000, mem=4000), 0, [0])
    assert book.gpu_milli_free[0, 0] == 0
    assert book.gpu_mem_free[0, 0] == 0
    assert book.cpu_free[0] == 0
    assert book.mem_free[0] == 0
    book.check_invariants()
    with pytest.raises(AllocationError):
        book.allocate(share("more", milli=1), 0, [0])


def test_whole_gpu_becomes_available_again_after_shares_leave() -> None:
    book = small_cluster()
    book.allocate(share("s1", milli=200), 0, [0])
    book.allocate(share("s2", memory=100), 0, [0])
    with pytest.raises(AllocationError):
        book.allocate(whole("w"), 0, [0])
    book.release("s1")
    with pytest.raises(AllocationError):  # the memory-only share still holds the GPU
        book.allocate(whole("w"), 0, [0])
    book.release("s2")
    book.allocate(whole("w"), 0, [0])
    book.check_invariants()


# ------------------------------------------------------------------------------------------ health


def test_unhealthy_gpu_keeps_running_work_but_takes_no_new_work() -> None:
    book = small_cluster()
    book.allocate(share("running", milli=300), 1, [1])
    clock = book.clock
    book.set_gpu_health(1, 1, False)
    assert book.changed_since(clock).tolist() == [1]
    assert "running" in book.allocations
    assert book.gpu_avail[1, 1] == 0
    assert not book.gpu_full[1, 1]
    assert book.full_count[1] == 3
    assert book.total_avail[1] == 3000
    assert book.gpu_milli_free[1, 1] == 700  # the raw accounting is untouched
    book.check_invariants()
    before = state_of(book)
    for request_ in (share("new", milli=100), share("newmem", memory=1), whole("neww")):
        with pytest.raises(AllocationError, match="healthy=False"):
            book.allocate(request_, 1, [1])
        assert_same_state(before, state_of(book))
    with pytest.raises(AllocationError):
        book.allocate(whole("pair", 2), 1, [0, 1])
    book.release("running")
    book.check_invariants()
    with pytest.raises(AllocationError):
        book.allocate(whole("neww"), 1, [1])
    book.set_gpu_health(1, 1, True)
    book.allocate(whole("neww"), 1, [1])
    book.check_invariants()


def test_set_health_of_missing_gpu() -> None:
    book = small_cluster()
    with pytest.raises(AllocationError, match="has no GPU 3"):
        book.set_gpu_health(0, 3, False)


def test_unhealthy_at_construction() -> None:
    node = Node("n", 1000, 1000, (Gpu(0, "T4", 100), Gpu(1, "T4", 100, healthy=False)))
    book = AllocationBook([node])
    assert book.full_count.tolist() == [1]
    assert book.gpu_avail[0].tolist() == [1000, 0]
    with pytest.raises(AllocationError):
        book.allocate(share("s", milli=1), 0, [1])


# --------------------------------------------------------------------------------------- snapshots


def test_snapshot_restore_round_trip_and_versions() -> None:
    book = small_cluster()
    book.allocate(share("keep", milli=250, memory=1000, cpu=100), 0, [0])
    before = state_of(book)
    snap = book.snapshot()
    clock = book.clock

    book.allocate(share("tmp1", milli=500), 0, [1])
    book.allocate(Request("tmp2", cpu_milli=1000), 2)
    book.release("keep")
    book.set_gpu_health(0, 1, False)
    assert set(book.changed_since(clock).tolist()) == {0, 2}
    mid_clock = book.clock

    # The snapshot is a copy: later changes did not leak into it.
    assert snap.cpu_free.tolist() == before["cpu_free"].tolist()
    assert set(snap.allocations) == {"keep"}

    book.restore(snap)
    after = state_of(book)
    for key in STATE_FIELDS:
        if key != "version":
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    assert after["allocations"] == before["allocations"]
    # Restoring moves the clock forward and reports exactly the rows that changed.
    assert book.clock > mid_clock
    assert book.changed_since(mid_clock).tolist() == [0, 2]
    assert book.version[1] == before["version"][1]
    book.check_invariants()
    book.release("keep")
    book.check_invariants()


def test_restore_of_current_state_reports_nothing() -> None:
    book = small_cluster()
    book.allocate(share("s", milli=100), 1, [0])
    snap = book.snapshot()
    clock = book.clock
    book.restore(snap)
    assert book.changed_since(clock).size == 0


def test_changed_since_tracks_each_change() -> None:
    book = small_cluster()
    c0 = book.clock
    book.allocate(share("s", milli=100), 1, [0])
    c1 = book.clock
    book.allocate(Request("c", cpu_milli=100), 2)
    assert book.changed_since(c0).tolist() == [1, 2]
    assert book.changed_since(c1).tolist() == [2]
    assert book.changed_since(book.clock).size == 0
    book.release("s")
    assert book.changed_since(c1).tolist() == [1, 2]


# ------------------------------------------------------------------------------ unknown GPU memory


def test_unknown_gpu_memory_is_not_enforced() -> None:
    book = AllocationBook([make_node("g", cpu_milli=1000, memory_mib=1000, gpu_count=2, gpu_model="G2")])
    assert not book.memory_enforced[0].any()
    assert book.gpu_mem_capacity[0].tolist() == [UNENFORCED_GPU_MEMORY_MIB] * 2
    # Far more memory than any real GPU has, several times over: accepted.
    for i in range(5):
        book.allocate(share(f"m{i}", memory=10**9), 0, [0])
    book.allocate(share("both", milli=900, memory=10**9), 0, [0])
    book.check_invariants()
    assert book.full_count[0] == 1  # GPU 0 is no longer fully free
    with pytest.raises(AllocationError):
        book.allocate(whole("w"), 0, [0])
    w = book.allocate(whole("w"), 0, [1])
    assert w.gpu_memory_mib == UNENFORCED_GPU_MEMORY_MIB
    book.check_invariants()
    with pytest.raises(AllocationError):
        book.allocate(share("late", memory=1), 0, [1])
    for name in [*(f"m{i}" for i in range(5)), "both", "w"]:
        book.release(name)
    assert book.gpu_mem_free[0].tolist() == [UNENFORCED_GPU_MEMORY_MIB] * 2
    assert book.full_count[0] == 2


def test_failed_node_takes_no_work_of_any_kind_and_keeps_what_it_runs() -> None:
    book = small_cluster()
    book.allocate(share("s", milli=100), 0, [0])
    book.set_node_health(0, False)
    assert set(book.allocations) == {"s"}
    assert book.total_avail[0] == 0
    assert book.full_count[0] == 0
    cpu_only = Request("cpu", cpu_milli=100)
    with pytest.raises(AllocationError, match="failed"):
        book.allocate(cpu_only, 0)
    snapshot = book.snapshot()
    book.set_node_health(0, True)
    assert book.gpu_healthy[0, :2].all()
    assert book.total_avail[0] == 1900
    book.allocate(cpu_only, 0)
    book.restore(snapshot)
    assert not book.node_ok[0]
    assert "cpu" not in book.allocations
    book.check_invariants()


def test_check_invariants_detects_drift() -> None:
    book = small_cluster()
    book.allocate(share("s", milli=100), 0, [0])
    book.check_invariants()
    book.gpu_milli_free[0, 0] += 1
    with pytest.raises(AllocationError, match="GPU free amounts drifted"):
        book.check_invariants()
    book.gpu_milli_free[0, 0] -= 1
    book.cpu_free[1] -= 1
    with pytest.raises(AllocationError, match="CPU/memory free amounts drifted"):
        book.check_invariants()
    book.cpu_free[1] += 1
    book._allocated_milli += 1
    with pytest.raises(AllocationError, match="allocated milli-GPU total drifted"):
        book.check_invariants()


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
