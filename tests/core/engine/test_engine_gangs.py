"""Gangs through the engine's public API: a gang is all or nothing (placement and commit alike), a threshold
gang starts at its minimum and grows to its headcount, and random workloads never leave a gang half placed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.book import AllocationBook
from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobClass, JobPhase
from kubecell.core.engine.placement import GangPlacer
from kubecell.core.errors import AllocationError
from kubecell.core.model import Request, TopologyLevel
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.policies.utilization import Binpack
from tests.core.support import (
    GENERIC_REASONS,
    allocations_by_job,
    check_engine,
    engine,
    make_nodes,
    nodes_of,
    pending_reason,
    whole,
)


# ============================================================================ gangs: all or nothing
def fragmented() -> Engine:
    """Four 8-GPU nodes, each running one 6-GPU job of VC a: 8 GPUs free in total, two per node."""
    eng = engine(make_nodes(4), {"a": {"gpus": 32}})
    for i in range(4):
        eng.submit(whole(f"h{i}", "a", 6), 0)
    eng.schedule(0)
    assert len({node for i in range(4) for node in nodes_of(eng, eng.jobs[f"h{i}"])}) == 4
    return eng


def test_gang_that_cannot_fully_fit_binds_no_member() -> None:
    eng = fragmented()
    before = allocations_by_job(eng)
    eng.submit(whole("gang", "a", 4, members=2), 1)
    result = eng.schedule(1)
    assert result.started == []
    assert "needs 2 member(s) of 4 GPU" in pending_reason(eng, "gang")
    assert allocations_by_job(eng) == {**before, "gang": frozenset()}
    assert not any(name.startswith("gang/") for name in eng.book.allocations)
    check_engine(eng)


def test_waiting_gang_does_not_block_a_smaller_gang_behind_it() -> None:
    eng = fragmented()
    eng.submit(whole("gang", "a", 4, members=2), 1)
    eng.submit(whole("small", "a", 2, members=4), 2)
    eng.schedule(2)
    small = eng.jobs["small"]
    assert (small.phase, small.job_class, small.size) == (JobPhase.RUNNING, JobClass.GUARANTEED, 4)
    assert len(nodes_of(eng, small)) == 4
    assert eng.jobs["gang"].phase == JobPhase.PENDING
    assert not eng.jobs["gang"].running_members
    check_engine(eng)


def test_gang_starts_with_every_member_once_it_fits() -> None:
    eng = fragmented()
    eng.submit(whole("gang", "a", 4, members=2), 1)
    eng.schedule(1)
    freed = nodes_of(eng, eng.jobs["h0"])
    eng.finish("h0", 2)  # one node is whole again: both members fit there
    result = eng.schedule(2)
    gang = eng.jobs["gang"]
    assert [j.name for j in result.started] == ["gang"]
    assert (gang.phase, gang.job_class, gang.size) == (JobPhase.RUNNING, JobClass.GUARANTEED, 2)
    assert nodes_of(eng, gang) == freed
    check_engine(eng)


def test_borrowed_gang_is_all_or_nothing_too() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 8}, "b": {"gpus": 24}})
    eng.submit(whole("b1", "b", 8), 0)
    eng.submit(whole("gang", "a", 8, members=4), 0)  # 32 GPUs: more than a's guarantee, so it must borrow
    eng.schedule(0)
    assert eng.jobs["b1"].job_class == JobClass.GUARANTEED
    reason = pending_reason(eng, "gang")
    assert "VC a guarantees 8 GPUs; the job needs 32" in reason
    assert "no idle capacity to borrow" in reason
    assert set(eng.book.allocations) == set(eng.jobs["b1"].running_members)
    eng.finish("b1", 1)
    eng.schedule(1)
    gang = eng.jobs["gang"]
    assert (gang.phase, gang.job_class, gang.size) == (JobPhase.RUNNING, JobClass.BORROWED, 4)
    assert eng.queries.status()["a"]["borrowed_gpus"] == 32
    check_engine(eng)


class _BrokenAfterFirst(Binpack):
    """Hands out the GPUs of the first member again for the second: the second allocation must fail."""

    def __init__(self) -> None:
        super().__init__()
        self.first: tuple[int, ...] | None = None

    def choose_gpus(self, book: AllocationBook, request: Request, node: int, rng: np.random.Generator,
                    allowed: Any = None) -> tuple[int, ...]:
        if self.first is None:
            self.first = super().choose_gpus(book, request, node, rng, allowed)
        return self.first


def test_commit_rolls_back_every_member_when_one_fails() -> None:
    nodes = make_nodes(2)
    book = AllocationBook(nodes)
    book.allocate(whole("other", "a", 5).member_request(0), 1, range(5))
    free_before, cpu_before = book.gpu_milli_free.copy(), book.cpu_free.copy()
    gangs = GangPlacer(book, Placer(book, _BrokenAfterFirst()), np.full(2, -1), np.full(2, -1))
    with pytest.raises(AllocationError):
        gangs.place(whole("gang", "a", 4, members=2), None, None, 2, 2)
    assert set(book.allocations) == {"other/0"}  # the member placed first was released
    assert (book.gpu_milli_free == free_before).all()
    assert (book.cpu_free == cpu_before).all()
    book.check_invariants()
    # The PreFilter never lets a gang start below its minimum.
    healthy = GangPlacer(book, Placer(book, Binpack()), np.full(2, -1), np.full(2, -1))
    spec = whole("gang", "a", 4, members=3)
    assert not healthy.fits(spec, None, None, 3, 3)
    assert healthy.place(spec, None, None, 3, 3) is None
    assert set(book.allocations) == {"other/0"}
    placed = healthy.place(whole("gang", "a", 4, members=3, min_members=2), None, None, 3, 2)
    assert placed is not None
    assert len(placed) == 2


# ============================================================================ threshold gangs
def three_nodes_busy() -> Engine:
    """VC a is guaranteed all four nodes; three of them run an 8-GPU job each."""
    eng = engine(make_nodes(4), {"a": {"gpus": 32}})
    for i in range(3):
        eng.submit(whole(f"blocker{i}", "a", 8), 0)
    eng.schedule(0)
    return eng


def test_threshold_gang_starts_with_what_fits_above_its_minimum_and_grows() -> None:
    eng = three_nodes_busy()
    eng.submit(whole("elastic", "a", 4, members=4, min_members=2), 1)
    eng.schedule(1)
    job = eng.jobs["elastic"]
    assert (job.phase, job.job_class, job.size) == (JobPhase.RUNNING, JobClass.GUARANTEED, 2)
    check_engine(eng)
    eng.finish("blocker0", 2)
    result = eng.schedule(2)
    assert [j.name for j in result.grown] == ["elastic"]
    assert job.size == 4
    assert eng.queries.status()["a"]["guaranteed_used_gpus"] == 16 + 16
    check_engine(eng)


def test_threshold_gang_below_its_minimum_holds_nothing() -> None:
    eng = three_nodes_busy()
    eng.submit(whole("half", "a", 4), 0)
    eng.schedule(0)
    eng.submit(whole("elastic", "a", 4, members=4, min_members=2), 1)
    eng.schedule(1)
    assert "2 member(s) of 4 GPU" in pending_reason(eng, "elastic")
    check_engine(eng)


def test_threshold_gang_takes_its_whole_headcount_when_it_can() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}})
    eng.submit(whole("elastic", "a", 4, members=4, min_members=1), 0)
    eng.schedule(0)
    assert eng.jobs["elastic"].size == 4


@pytest.mark.parametrize("policy", ["hived", "quota"])
def test_threshold_gang_never_exceeds_the_guarantee_room(policy: str) -> None:
    # a's guarantee leaves room for 3 members: the gang starts guaranteed with 3 and does not grow beyond
    # the guarantee (hived does not borrow; under quota b's idle quota is not lent to a growing gang).
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}}, policy)
    eng.submit(whole("a1", "a", 4), 0)
    eng.submit(whole("elastic", "a", 4, members=4, min_members=2), 0)
    eng.schedule(0)
    eng.schedule(1)
    job = eng.jobs["elastic"]
    assert (job.job_class, job.size) == (JobClass.GUARANTEED, 3)
    assert eng.queries.status()["a"]["guaranteed_used_gpus"] == 16
    check_engine(eng)


# ============================================================================ property: random workloads
@st.composite
def workload(draw: st.DrawFn) -> list[tuple[str, int, int, int, int]]:
    ops = st.tuples(st.sampled_from(["submit", "submit", "submit", "finish", "fail", "heal", "cycle"]),
                    st.integers(0, 2), st.sampled_from([1, 2, 4, 8]), st.integers(1, 4), st.integers(0, 3))
    return draw(st.lists(ops, min_size=1, max_size=18))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["kubecell", "hived", "quota"]), workload(), st.sampled_from([0.0, 300.0]))
def test_random_workloads_keep_every_gang_whole(policy: str, ops: list[tuple[str, int, int, int, int]],
                                                interval: float) -> None:
    eng = engine(make_nodes(4, gpus=4, racks_of=2), {"a": {"gpus": 8}, "b": {"gpus": 4}, "c": {"gpus": 4}},
                 policy, resize_min_interval_seconds=interval)
    names = ["a", "b", "c"]
    resized: dict[str, float] = {}  # job -> when its current run last grew or shrank
    now = 0.0
    for index, (op, vc, gpus, members, extra) in enumerate(ops):
        now += 1.0
        if op == "submit":
            topology = [None, None, TopologyLevel.NODE, TopologyLevel.RACK][extra] if members > 1 else None
            minimum = max(1, members - extra) if extra < 2 else None
            eng.submit(whole(f"j{index}", names[vc], gpus, members=members, min_members=minimum,
                             priority=extra % 2, topology=topology), now)
        elif op == "finish" and eng.running:
            eng.finish(sorted(eng.running)[vc % len(eng.running)], now)
        elif op in ("fail", "heal"):
            eng.set_node_health(f"n{extra}", op == "heal", now)
        result = eng.schedule(now)
        for job in eng.running.values():
            if job.phase == JobPhase.RESERVED:
                eng.confirm(job.name, now)
        for job in result.started:
            if job.phase in (JobPhase.RUNNING, JobPhase.RESERVED):
                assert job.spec.minimum <= job.size <= job.spec.members
            else:  # the quota policy may start a job and reclaim it later in the same cycle
                assert job in result.evicted
                assert job.phase == JobPhase.PENDING
        for job in result.started:
            resized.pop(job.name, None)
        for job in result.grown:  # growth waits out the interval after any resize of the run
            assert now >= resized.get(job.name, -interval) + interval, eng.queries.explain(job.name)
            resized[job.name] = now
        for cut in result.shrunk:  # a shrink keeps the job running, never below its minimum
            job = cut.job
            assert cut.members
            assert not set(cut.members) & set(job.running_members)
            if job not in result.evicted:
                assert job.phase in (JobPhase.RUNNING, JobPhase.RESERVED)
                assert job.spec.minimum <= job.size < job.spec.members
                assert "shrunk" in eng.queries.explain(job.name)
            resized[job.name] = now
        for job in result.evicted:
            resized.pop(job.name, None)
        check_engine(eng)
        for job in eng.pending.values():  # every waiting job says why, newcomers and requeued ones too
            assert job.wait_reason not in GENERIC_REASONS, eng.queries.explain(job.name)
        unhealthy = ~eng.book.gpu_healthy & eng.book.gpu_present
        for job in result.started + result.grown:
            for name in job.running_members:
                allocation = eng.book.allocations[name]
                row = eng.book.index[allocation.node]
                assert not unhealthy[row, list(allocation.gpu_indices)].any()
