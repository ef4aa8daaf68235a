"""Why a job waits, node by node: kube-scheduler's "0/5000 nodes are available: ..." in kubecell's words.

Every node that cannot take one member is counted once, under the first check it fails (node constraints,
region, health, GPU model, CPU, memory, GPUs, reservations); the counts are exact on small clusters of
known shapes, and the capacity behind them is exactly ``member_capacity``'s (the first part of the
sentence, "the roomiest node takes N member(s) now", must not move).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from kubecell.core.book import AllocationBook, BoolArray
from kubecell.core.engine.explain import FITS, NODE_REASONS, node_breakdown, node_reasons
from kubecell.core.engine.job import JobPhase, JobSpec
from kubecell.core.engine.placement import member_capacity
from kubecell.core.model import MILLI_PER_GPU, Node, Request, TopologyLevel, make_node
from kubecell.core.placement.filters import feasible_mask
from tests.core.support import CPU_MILLI, MEMORY_MIB, engine, make_nodes, whole

REASON = {text.split(" {")[0]: code for code, text in enumerate(NODE_REASONS)}


def node(name: str, gpus: int = 8, model: str = "V100M32", **kwargs: Any) -> Node:
    return make_node(name, cpu_milli=CPU_MILLI, memory_mib=MEMORY_MIB, gpu_count=gpus, gpu_model=model if gpus else "",
                     **kwargs)


def take(book: AllocationBook, name: str, where: str, *, gpus: tuple[int, ...] = (), **request: Any) -> None:
    book.allocate(Request(name, **request), book.index[where], gpus)


def breakdown(book: AllocationBook, member: Request, **masks: Any) -> str:
    cap, first = node_reasons(book, member, **masks)
    assert ((cap > 0) == (first == FITS)).all()
    return node_breakdown(first, scope="a's bound cells")


EIGHT = Request("m", cpu_milli=4000, memory_mib=1000, gpu_count=8, gpu_milli=MILLI_PER_GPU,
                gpu_models=frozenset({"V100M32"}))


# ============================================================================ one reason each, exact counts
def mixed_cluster() -> AllocationBook:
    """n0 failed, n1 A100s, n2 without CPU, n3 without memory, n4-n6 GPUs taken, n7 free."""
    book = AllocationBook([node("n0"), node("n1", model="A100"), *(node(f"n{i}") for i in range(2, 8))])
    book.set_node_health(0, False)
    take(book, "cpu", "n2", cpu_milli=CPU_MILLI - 1000)
    take(book, "memory", "n3", memory_mib=MEMORY_MIB - 10)
    for i in (4, 5, 6):
        take(book, f"gpus{i}", f"n{i}", gpus=(0, 1, 2, 3, 4, 5, 6), gpu_count=7, gpu_milli=MILLI_PER_GPU)
    return book


def test_each_node_is_counted_under_its_first_failing_check_most_frequent_first() -> None:
    book = mixed_cluster()
    assert breakdown(book, EIGHT) == ("1/8 nodes fit one member: 3 insufficient GPUs, 1 failed (unhealthy), "
                                      "1 no GPU of the requested model, 1 insufficient CPU, 1 insufficient memory")


def test_node_constraints_come_first_and_the_free_node_excluded_leaves_none() -> None:
    book = mixed_cluster()
    allowed = np.array([True] * 7 + [False])
    assert breakdown(book, EIGHT, allowed=allowed) == (
        "0/8 nodes fit one member: 3 insufficient GPUs, 1 not allowed by the job's node constraints, "
        "1 failed (unhealthy), 1 no GPU of the requested model, 1 insufficient CPU, 1 insufficient memory")
    nowhere = np.zeros(8, np.bool_)
    assert breakdown(book, EIGHT, allowed=nowhere) == (
        "0/8 nodes fit one member: 8 not allowed by the job's node constraints")


def test_a_node_failing_several_checks_counts_once_under_the_first() -> None:
    book = mixed_cluster()
    take(book, "both", "n7", cpu_milli=CPU_MILLI, memory_mib=MEMORY_MIB)  # CPU and memory gone: CPU first
    book.set_node_health(1, False)  # failed and of the wrong model: failed first
    cap, first = node_reasons(book, EIGHT)
    assert first[7] == REASON["insufficient CPU"]
    assert first[1] == REASON["failed (unhealthy)"]
    assert node_breakdown(first) == ("0/8 nodes fit one member: 3 insufficient GPUs, 2 failed (unhealthy), "
                                     "2 insufficient CPU, 1 insufficient memory")
    assert cap.max() == 0


def test_region_masks_count_as_outside_the_region() -> None:
    book = AllocationBook([node(f"n{i}") for i in range(4)])
    gpus = np.zeros((4, 8), np.bool_)
    gpus[0] = True
    gpus[1, :4] = True  # half of n1: not enough for 8 GPUs
    scope = np.array([True, True, True, False])
    assert breakdown(book, EIGHT, gpus=gpus, scope=scope) == (
        "1/4 nodes fit one member: 2 outside a's bound cells, 1 insufficient GPUs")
    cpu_only = Request("c", cpu_milli=1000)  # a GPU mask says nothing about a job without GPUs
    assert breakdown(book, cpu_only, gpus=gpus, scope=scope) == "3/4 nodes fit one member: 1 outside a's bound cells"


def test_reserved_counts_only_nodes_that_would_otherwise_fit() -> None:
    book = AllocationBook([node(f"n{i}") for i in range(4)])
    take(book, "full", "n0", gpus=tuple(range(8)), gpu_count=8, gpu_milli=MILLI_PER_GPU)
    blocked = np.array([True, True, False, False])
    cap, first = node_reasons(book, EIGHT, blocked=blocked)
    assert cap.tolist() == [0, 0, 1, 1]
    assert node_breakdown(first) == "2/4 nodes fit one member: 1 insufficient GPUs, 1 reserved for a starving job"


# ============================================================================ GPU reasons by request shape
def test_shares_say_whether_compute_or_gpu_memory_is_missing() -> None:
    book = AllocationBook([node(f"n{i}", gpus=1) for i in range(4)])
    take(book, "compute", "n0", gpus=(0,), gpu_count=1, gpu_milli=600)
    take(book, "memory", "n1", gpus=(0,), gpu_count=1, gpu_milli=100, gpu_memory_mib=30_000)
    book.set_gpu_health(2, 0, False)
    share = Request("s", gpu_count=1, gpu_milli=500, gpu_memory_mib=8000)
    assert breakdown(book, share) == ("1/4 nodes fit one member: 1 no GPU with enough free share, "
                                      "1 no GPU with enough free memory, 1 too few healthy GPUs")


def test_a_node_that_would_fit_but_for_its_unhealthy_gpus_says_so() -> None:
    """An XID took GPUs out of service: the operator must read that, not "insufficient GPUs"."""
    book = AllocationBook([node(f"n{i}") for i in range(3)])
    book.set_gpu_health(0, 3, False)  # n0: 7 healthy GPUs left
    take(book, "busy", "n1", gpus=(0,), gpu_count=1, gpu_milli=MILLI_PER_GPU)  # n1: 7 free, all healthy
    assert breakdown(book, EIGHT) == ("1/3 nodes fit one member: 1 insufficient GPUs, 1 too few healthy GPUs")
    seven = replace(EIGHT, gpu_count=7)
    assert breakdown(book, seven) == "3/3 nodes fit one member"


def test_nvlink_members_say_when_free_gpus_are_split_across_groups() -> None:
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    book = AllocationBook([node(f"n{i}", nvlink_groups=groups) for i in range(3)])
    take(book, "split", "n0", gpus=(0, 1, 4, 5), gpu_count=4, gpu_milli=MILLI_PER_GPU)  # 4 free, 2 + 2
    take(book, "most", "n1", gpus=(0, 1, 2, 3, 4, 5), gpu_count=6, gpu_milli=MILLI_PER_GPU)  # 2 free
    four = Request("q", gpu_count=4, gpu_milli=MILLI_PER_GPU, topology=TopologyLevel.NVLINK)
    cap, first = node_reasons(book, four)
    assert cap.tolist() == [0, 0, 2]
    assert node_breakdown(first, level=TopologyLevel.NVLINK) == (
        "1/3 nodes fit one member: 1 insufficient GPUs, 1 insufficient GPUs within one nvlink domain")


def test_gpu_requests_on_nodes_without_gpus_are_insufficient_gpus() -> None:
    book = AllocationBook([node("cpu0", gpus=0), node("g0")])
    one = Request("g", gpu_count=1, gpu_milli=MILLI_PER_GPU)
    assert breakdown(book, one) == "1/2 nodes fit one member: 1 insufficient GPUs"


# ============================================================================ the capacity is member_capacity's
MEMBERS: list[dict[str, Any]] = [
    {"cpu_milli": 1000, "gpu_count": 1, "gpu_milli": 250},
    {"cpu_milli": 2000, "memory_mib": 4096, "gpu_count": 1, "gpu_milli": 500, "gpu_memory_mib": 4000},
    {"gpu_count": 1, "gpu_milli": 0, "gpu_memory_mib": 16000},
    {"cpu_milli": 4000, "gpu_count": 1, "gpu_milli": 1000},
    {"cpu_milli": 8000, "gpu_count": 2, "gpu_milli": 1000, "gpu_models": frozenset({"T4"})},
    {"cpu_milli": 8000, "gpu_count": 2, "gpu_milli": 1000, "topology": TopologyLevel.NVLINK},
    {"cpu_milli": 3000, "memory_mib": 100_000},
]


@pytest.mark.parametrize("seed", range(12))
def test_capacity_and_fits_agree_with_member_capacity_and_the_filter(seed: int) -> None:
    rng = np.random.default_rng(seed)
    nodes = []
    for i in range(12):
        gpus = int(rng.choice([0, 2, 4, 8]))
        groups = [list(range(gpus // 2)), list(range(gpus // 2, gpus))] if gpus >= 4 else []
        nodes.append(make_node(f"n{i}", cpu_milli=int(rng.choice([16000, 64000])),
                               memory_mib=int(rng.choice([1 << 17, 1 << 20])), gpu_count=gpus,
                               gpu_model=str(rng.choice(["T4", "A100"])) if gpus else "", nvlink_groups=groups))
    book = AllocationBook(nodes)
    for i in range(40):
        request = Request(f"fill{i}", **MEMBERS[int(rng.integers(len(MEMBERS)))])
        where = np.flatnonzero(feasible_mask(book, request))
        if where.size:
            at = int(where[int(rng.integers(where.size))])
            free = np.flatnonzero(book.gpu_fits(at, request))[: request.gpu_count]
            book.allocate(request, at, [int(g) for g in free] if request.wants_gpu else [])
    book.set_node_health(int(rng.integers(12)), False)
    book.set_gpu_health(int(np.flatnonzero(book.gpu_count)[0]), 0, False)
    for member in (Request("m", **fields) for fields in MEMBERS):
        allowed = rng.random(12) < 0.8
        gpu_mask = rng.random((12, book.max_gpus)) < 0.7
        scope = rng.random(12) < 0.9
        blocked = rng.random(12) < 0.2
        cases: list[dict[str, BoolArray]] = [
            {}, {"allowed": allowed}, {"gpus": gpu_mask, "scope": scope, "blocked": blocked},
            {"allowed": allowed, "gpus": gpu_mask, "scope": scope, "blocked": blocked}]
        for masks in cases:
            cap, first = node_reasons(book, member, **masks)
            nodes_mask = np.ones(12, np.bool_)
            for key in ("allowed", "scope"):
                if key in masks:
                    nodes_mask &= masks[key]
            if "blocked" in masks:
                nodes_mask &= ~masks["blocked"]
            expected = member_capacity(book, member, masks.get("gpus"), nodes_mask)
            assert cap.tolist() == expected.tolist(), (member, masks.keys())
            assert ((first == FITS) == (cap > 0)).all()
            filtered = feasible_mask(book, member, masks.get("gpus"), nodes_mask)
            if member.topology is None:  # the filter checks one member, as the breakdown does
                assert ((cap > 0) == filtered).all(), (member, masks.keys())


# ============================================================================ through the engine
def test_a_waiting_job_ends_its_reason_with_the_breakdown_and_keeps_the_roomiest_part() -> None:
    nodes = [node("n0"), node("n1", model="A100"), *(node(f"n{i}") for i in range(2, 6))]
    eng = engine(nodes, {"a": {"gpus": {"count": 40, "chain": "V100M32x8"}}}, "quota")
    eng.set_node_health("n0", False, 0)
    member = Request("cpu-hog", cpu_milli=CPU_MILLI - 1000)
    eng.submit(JobSpec(name="cpu-hog", vc="a", member=member, nodes=frozenset({"n2"})), 0)
    for i in (3, 4):
        eng.submit(replace(whole(f"full{i}", "a", 8), nodes=frozenset({f"n{i}"})), 0)
    eng.schedule(0)
    spec = JobSpec(name="job", vc="a", member=replace(EIGHT, name="job"),
                   nodes=frozenset({"n0", "n1", "n2", "n3", "n4"}))
    eng.submit(spec, 1)
    eng.schedule(1)
    job = eng.jobs["job"]
    assert job.phase == JobPhase.PENDING
    assert job.wait_reason.endswith(
        "needs 1 member(s) of 8 GPU within its quota; the roomiest node takes 0 member(s) now; 0/6 nodes fit one "
        "member: 2 insufficient GPUs, 1 not allowed by the job's node constraints, 1 failed (unhealthy), "
        "1 no GPU of the requested model, 1 insufficient CPU"), job.wait_reason


def test_the_breakdown_counts_a_whole_gangs_nodes_even_when_some_fit() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}})
    eng.submit(whole("blocker", "a", 8), 0)
    eng.schedule(0)
    eng.submit(whole("gang", "a", 8, members=4), 1)
    eng.schedule(1)
    assert "the roomiest node takes 1 member(s) now; 3/4 nodes fit one member: 1 insufficient GPUs" \
        in eng.jobs["gang"].wait_reason, eng.jobs["gang"].wait_reason
