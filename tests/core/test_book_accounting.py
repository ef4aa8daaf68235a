"""The allocation book's accounting: its layout, exact allocate/release round trips, refused allocations
that change nothing, GPUs of unknown memory, and the invariant check that catches drift."""

from __future__ import annotations

import numpy as np
import pytest

from kubecell.core.book import UNENFORCED_GPU_MEMORY_MIB, AllocationBook, affinity_class
from kubecell.core.errors import AllocationError, InvalidInputError
from kubecell.core.model import Request, make_node
from tests.core.book_support import STATE_FIELDS, assert_same_state, share, small_cluster, state_of, whole

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
