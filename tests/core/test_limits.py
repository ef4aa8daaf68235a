"""The book's limits (``kubecell.core.limits``): nodes, requests and gangs beyond them are rejected with the
range, and amounts at the limits are stored and summed exactly (no int64 overflow anywhere)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kubecell.core.book import UNENFORCED_GPU_MEMORY_MIB, AllocationBook
from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import (
    MAX_CPU_MILLI,
    MAX_GANG_MEMBERS,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_MIB,
)
from kubecell.core.model import Gpu, Node, Request, make_node

INT64_MAX = int(np.iinfo(np.int64).max)


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"cpu_milli": MAX_CPU_MILLI + 1}, "cpu_milli",
         f"CPU capacity (milli-CPU) {MAX_CPU_MILLI + 1} is out of range"),
        ({"memory_mib": 10**23}, "memory_mib", f"host memory (MiB) {10**23} is out of range"),
        ({"gpu_count": 1, "gpu_model": "X", "gpu_memory_mib": MAX_GPU_MEMORY_MIB + 1}, "gpu_memory_mib",
         f"GPU memory (MiB per GPU) {MAX_GPU_MEMORY_MIB + 1} is out of range"),
        ({"gpu_count": MAX_GPUS_PER_NODE + 1, "gpu_model": "A100"}, "gpu",
         f"GPU count {MAX_GPUS_PER_NODE + 1} is out of range"),
    ],
)
def test_make_node_rejects_amounts_beyond_the_book(kwargs: dict[str, Any], field: str, message: str) -> None:
    arguments = {"cpu_milli": 1000, "memory_mib": 1024, **kwargs}
    with pytest.raises(InvalidInputError) as info:
        make_node("n", location="cluster.yaml:7", **arguments)
    error = info.value
    assert (error.location, error.field, error.message) == ("cluster.yaml:7", field, message)
    assert error.accepted is not None
    assert error.accepted.startswith("0..")


def test_nodes_built_directly_are_checked_too() -> None:
    with pytest.raises(InvalidInputError, match=r"node 'n': field 'memory_mib': .* \(accepted: 0\.\.1099511627776\)"):
        Node("n", cpu_milli=0, memory_mib=MAX_MEMORY_MIB + 1)
    with pytest.raises(InvalidInputError, match="field 'gpu_memory_mib'"):
        Node("n", cpu_milli=0, memory_mib=0, gpus=(Gpu(0, "X", MAX_GPU_MEMORY_MIB + 1),))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cpu_milli": 10**23}, "cpu_milli"),
        ({"memory_mib": MAX_MEMORY_MIB + 1}, "memory_mib"),
        ({"gpu_count": 1, "gpu_memory_mib": MAX_GPU_MEMORY_MIB + 1}, "gpu_memory_mib"),
        ({"gpu_count": MAX_GPUS_PER_NODE + 1, "gpu_milli": 1000}, "gpu_count"),
    ],
)
def test_requests_beyond_the_book(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        Request("r", **kwargs)
    assert info.value.field == field
    assert "out of range" in info.value.message


def test_gangs_beyond_the_book() -> None:
    member = Request("m", cpu_milli=1000, gpu_count=1, gpu_milli=1000)
    with pytest.raises(InvalidInputError) as info:
        JobSpec("j", "a", member, members=MAX_GANG_MEMBERS + 1)
    assert str(info.value) == (f"job 'j': field 'members': headcount {MAX_GANG_MEMBERS + 1} is out of range "
                               f"(accepted: 1..{MAX_GANG_MEMBERS})")
    assert JobSpec("j", "a", member, members=MAX_GANG_MEMBERS).members == MAX_GANG_MEMBERS


def test_the_limits_leave_room_for_every_sum() -> None:
    largest = max(MAX_CPU_MILLI, MAX_MEMORY_MIB, MAX_GPU_MEMORY_MIB)
    assert MAX_GANG_MEMBERS * largest <= (INT64_MAX + 1) // 2  # a gang's total: at most half of int64
    assert UNENFORCED_GPU_MEMORY_MIB >= MAX_GPU_MEMORY_MIB  # any GPU-memory request fits an unknown-memory GPU


def test_a_book_at_the_limits_stores_and_sums_exactly() -> None:
    nodes = [make_node(f"n{i}", cpu_milli=MAX_CPU_MILLI, memory_mib=MAX_MEMORY_MIB, gpu_count=2, gpu_model="G1")
             for i in range(3)]
    book = AllocationBook(nodes)
    assert int(book.cpu_capacity.sum()) == 3 * MAX_CPU_MILLI
    share = Request("share", cpu_milli=MAX_CPU_MILLI, memory_mib=MAX_MEMORY_MIB, gpu_count=1, gpu_milli=500,
                    gpu_memory_mib=MAX_GPU_MEMORY_MIB)
    allocation = book.allocate(share, 1, [0])
    assert allocation.gpu_memory_mib == MAX_GPU_MEMORY_MIB
    assert (int(book.cpu_free[1]), int(book.mem_free[1]), int(book.gpu_mem_free[1, 0])) == (0, 0, 0)
    book.check_invariants()
    book.release("share")
    assert int(book.cpu_free.sum()) == 3 * MAX_CPU_MILLI
    book.check_invariants()


NOT_WHOLE: Any = 1.5
"""Typed Any: the point is a caller that passes a float where the signature says int (a loader, a plugin)."""


@pytest.mark.parametrize(("make", "field"), [
    (lambda: Request("j", gpu_count=1, gpu_milli=NOT_WHOLE), "gpu_milli"),
    (lambda: Request("j", gpu_count=NOT_WHOLE - 0.5, gpu_milli=1000), "gpu_count"),
    (lambda: Request("j", gpu_count=True, gpu_milli=1000), "gpu_count"),
    (lambda: JobSpec(name="j", vc="a", member=Request("j", gpu_count=1, gpu_milli=1000), members=NOT_WHOLE + 1),
     "members"),
    (lambda: JobSpec(name="j", vc="a", member=Request("j", gpu_count=1, gpu_milli=1000), members=3,
                     min_members=NOT_WHOLE), "min_members"),
], ids=["milli 1.5", "count 1.0", "count True", "members 2.5", "min 1.5"])
def test_amounts_that_are_not_whole_numbers_are_refused_at_once(make: Any, field: str) -> None:
    """Before, these passed the range checks and crashed the next cycle with an IndexError or a TypeError,
    leaving a waiting job with no reason."""
    with pytest.raises(InvalidInputError) as info:
        make()
    assert info.value.field == field


def test_numpy_integers_are_whole_numbers() -> None:
    count: Any = np.int32(1)
    milli: Any = np.int64(500)
    assert Request("j", cpu_milli=1000, gpu_count=count, gpu_milli=milli).gpu_milli == 500
