"""Builders shared by the allocation book tests (``test_book_*.py``): a small heterogeneous cluster,
share and whole-GPU requests, and a copy of everything an allocation may change, to compare before and after."""

from __future__ import annotations

from typing import Any

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.model import MILLI_PER_GPU, Request, make_node

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
