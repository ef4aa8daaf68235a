"""The allocation book under change: unhealthy GPUs and failed nodes keep what they run and take nothing new,
and snapshots restore exactly, the version clock reporting the rows that changed."""

from __future__ import annotations

import numpy as np
import pytest

from kubecell.core.book import AllocationBook
from kubecell.core.errors import AllocationError
from kubecell.core.model import Gpu, Node, Request
from tests.core.book_support import STATE_FIELDS, assert_same_state, share, small_cluster, state_of, whole

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
