"""The engine as a driver uses it: submit, cancel, confirm or fail a bind, the invariant check, and the
rules a driver relies on (what a job is charged, which class a GPU-less job gets, who goes first)."""

from __future__ import annotations

import pytest

from kubecell.core.book import AllocationBook
from kubecell.core.engine.admission import member_charge
from kubecell.core.engine.invariants import EngineInvariantError
from kubecell.core.engine.job import JobClass, JobPhase, JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request, make_node
from tests.core.support import engine, make_nodes, nodes_of, whole


def cpu_job(name: str, vc: str, cpu_milli: int = 100_000) -> JobSpec:
    return JobSpec(name=name, vc=vc, member=Request(name, cpu_milli=cpu_milli))


# ============================================================================ driver API
def test_cancel_releases_a_running_job_and_withdraws_a_waiting_one() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 8}}, borrowing=False)
    eng.submit(whole("run", "a"), 0)
    eng.submit(whole("wait", "a"), 0)
    eng.schedule(0)
    assert eng.jobs["run"].phase == JobPhase.RUNNING
    eng.cancel("wait", 1)
    assert eng.jobs["wait"].phase == JobPhase.CANCELLED
    assert "wait" not in eng.pending
    eng.cancel("run", 2)
    assert eng.jobs["run"].phase == JobPhase.CANCELLED
    assert not eng.book.allocations
    assert eng.queries.status()["a"]["guaranteed_used_gpus"] == 0
    eng.cancel("run", 3)  # cancelling twice changes nothing
    eng.check_invariants()
    with pytest.raises(InvalidInputError, match="no job named 'ghost'"):
        eng.cancel("ghost", 4)


def test_a_failed_bind_releases_the_job_and_keeps_its_place_in_the_queue() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 8}}, borrowing=False)
    eng.submit(whole("first", "a"), 0)
    eng.schedule(0)
    eng.submit(whole("second", "a"), 5)
    eng.schedule(5)
    eng.bind_failed("first", 10, "node agent refused the record")
    first = eng.jobs["first"]
    assert first.phase == JobPhase.PENDING
    assert first.preemptions == 0  # not a preemption
    assert "binding failed: node agent refused the record" in eng.queries.explain("first")
    assert first.queued_at == 0  # it was waiting since 0, before "second" (5)
    result = eng.schedule(11)
    assert [j.name for j in result.started] == ["first"]
    eng.check_invariants()


def test_an_unconfirmed_preemptor_goes_back_with_its_age_and_gets_its_capacity_again() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"gpus": 8}}, reservation_timeout_seconds=100.0)
    eng.submit(whole("a1", "a"), 0)
    eng.submit(whole("a2", "a"), 0)  # borrows b's idle node
    eng.schedule(0)
    eng.submit(whole("b1", "b"), 10)
    eng.schedule(10)
    assert eng.jobs["b1"].phase == JobPhase.RESERVED
    assert eng.jobs["a2"].phase == JobPhase.PENDING  # evicted for b1
    eng.schedule(200)  # b1's bind was never confirmed: it goes back, as old as it was
    b1 = eng.jobs["b1"]
    assert b1.phase == JobPhase.RUNNING  # ... and takes the freed node again before a2 can borrow it
    assert b1.queued_at == 10
    assert eng.jobs["a2"].preemptions == 1
    eng.confirm("b1", 201)
    eng.check_invariants()


@pytest.mark.parametrize("now", [float("nan"), float("inf"), -float("inf"), "5", True, None])
def test_a_time_that_is_no_finite_number_is_refused_and_changes_nothing(now: object) -> None:
    """At NaN the borrowed a1 was reclaimed inside its 600 s minimum run time (NaN passes every deadline)."""
    eng = engine(make_nodes(1, gpus=4), {"a": {"gpus": 2}, "b": {"gpus": 2}}, reclaim_min_runtime_seconds=600.0)
    eng.submit(whole("a1", "a", 4), 0)
    eng.schedule(0)
    eng.submit(whole("b1", "b", 2), 1)
    for call in (lambda: eng.schedule(now), lambda: eng.submit(whole("b2", "b", 1), now),  # type: ignore[arg-type]
                 lambda: eng.finish("a1", now), lambda: eng.cancel("b1", now)):  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match=r"field 'now'.*finite number"):
            call()
    assert eng.jobs["a1"].phase == JobPhase.RUNNING
    assert eng.jobs["b1"].phase == JobPhase.PENDING
    assert "b2" not in eng.jobs
    assert not eng.schedule(2).evicted, "still inside a1's minimum run time"


def test_allocations_of_tells_the_driver_where_every_member_is() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    eng.submit(whole("g", "a", 4, members=3), 0)
    eng.schedule(0)
    allocations = eng.queries.allocations_of("g")
    assert sorted(a.name for a in allocations) == ["g/0", "g/1", "g/2"]
    assert {a.node for a in allocations} == nodes_of(eng, eng.jobs["g"])


def test_check_invariants_reports_a_corrupted_state() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    eng.submit(whole("g", "a", 4, members=2), 0)
    eng.schedule(0)
    eng.check_invariants()
    eng.usage["a"].guaranteed_milli += 1000
    with pytest.raises(EngineInvariantError, match="usage"):
        eng.check_invariants()
    eng.usage["a"].guaranteed_milli -= 1000
    eng.jobs["g"].running_members.pop()
    with pytest.raises(EngineInvariantError, match="owned by no running job"):
        eng.check_invariants()


# ============================================================================ charges
@pytest.mark.parametrize(("request_", "expected"), [
    (Request("w", gpu_count=2, gpu_milli=1000), 2000),
    (Request("s", gpu_count=1, gpu_milli=300), 300),
    (Request("m", gpu_count=1, gpu_memory_mib=16000), 493),  # 16,000 of a V100M32's 32,510 MiB
    (Request("sm", gpu_count=1, gpu_milli=700, gpu_memory_mib=16000), 700),  # the larger of the two
    (Request("a", gpu_count=1, gpu_memory_mib=16000, gpu_models=frozenset({"A100"})), 395),  # 16,000 of 40,536
    (Request("big", gpu_count=1, gpu_memory_mib=35000), 864),  # only the A100 can hold it
    (Request("cpu", cpu_milli=1000), 0),
])
def test_member_charge_counts_gpu_memory_as_gpu_share(request_: Request, expected: int) -> None:
    book = AllocationBook([make_node("v", cpu_milli=1000, memory_mib=1000, gpu_count=2, gpu_model="V100M32"),
                           make_node("a", cpu_milli=1000, memory_mib=1000, gpu_count=2, gpu_model="A100")])
    assert member_charge(book, request_) == expected


def test_a_memory_share_on_gpus_of_unknown_memory_counts_its_compute_and_at_least_one_milli() -> None:
    book = AllocationBook([make_node("g", cpu_milli=1000, memory_mib=1000, gpu_count=1, gpu_model="G1")])
    assert member_charge(book, Request("m", gpu_count=1, gpu_memory_mib=4000)) == 1
    assert member_charge(book, Request("s", gpu_count=1, gpu_milli=250, gpu_memory_mib=4000)) == 250


# ============================================================================ GPU-less jobs
def test_gpu_less_jobs_are_guaranteed_where_no_guarantee_can_need_the_node_and_borrowed_elsewhere() -> None:
    nodes = [*make_nodes(2), make_node("cpu-0", cpu_milli=128_000, memory_mib=1 << 20)]
    eng = engine(nodes, {"a": {"gpus": 8}, "b": {"pinnedCells": ["n1"]}})
    eng.submit(cpu_job("on-cpu-node", "a"), 0)
    eng.submit(cpu_job("a-borrows", "a"), 0)
    eng.schedule(0)
    eng.submit(cpu_job("b-pinned", "b", 120_000), 1)
    eng.schedule(1)
    assert nodes_of(eng, eng.jobs["on-cpu-node"]) == {"cpu-0"}
    assert eng.jobs["on-cpu-node"].job_class == JobClass.GUARANTEED
    assert nodes_of(eng, eng.jobs["b-pinned"]) == {"n1"}  # b's pinned node is b's for good
    assert eng.jobs["b-pinned"].job_class == JobClass.GUARANTEED
    assert eng.jobs["a-borrows"].job_class == JobClass.BORROWED
    assert nodes_of(eng, eng.jobs["a-borrows"]) == {"n0"}  # GPU nodes nobody has bound first
    eng.check_invariants()


def test_gpu_less_jobs_that_could_only_borrow_are_rejected_under_a_policy_that_does_not() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 8}}, "hived")
    job = eng.submit(cpu_job("c", "a"), 0)
    assert job.phase == JobPhase.REJECTED
    assert "runs guaranteed only on nodes without GPUs" in job.wait_reason


# ============================================================================ order
def test_idle_capacity_goes_by_fair_share_between_vcs_and_by_priority_inside_one() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 8}, "b": {"gpus": 8}, "idle": {"gpus": 16}})
    eng.submit(whole("a0", "a"), 0)
    eng.submit(whole("b0", "b"), 0)
    eng.schedule(0)
    eng.submit(whole("a-low", "a", priority=0), 1)
    eng.submit(whole("b-old", "b"), 1)
    eng.submit(whole("a-high", "a", priority=5), 2)
    eng.submit(whole("b-new", "b"), 3)
    eng.schedule(3)
    running = {name for name, job in eng.jobs.items() if job.phase == JobPhase.RUNNING}
    assert running == {"a0", "b0", "a-high", "b-old"}  # one borrowed node each; a's priority picks a-high
    eng.check_invariants()


# ============================================================================ starvation backstop
def test_a_starving_guaranteed_job_reserves_inside_its_own_vcs_cells() -> None:
    # a's guarantee (two nodes) is full of its own 1-GPU jobs, and a new one arrives whenever one ends, so
    # its 8-GPU job never finds a whole node. b's idle node is no use to it (a may not borrow): the backstop
    # must hold one of a's nodes, where the big job can run, until it drains.
    eng = engine(make_nodes(3), {"a": {"gpus": 16, "borrowLimitGpus": 0}, "b": {"gpus": 8}},
                 starvation_seconds=30.0)
    for i in range(16):
        eng.submit(whole(f"s{i}", "a", 1), 0)
    eng.schedule(0)
    eng.submit(whole("big", "a", 8), 1)
    eng.schedule(1)
    target = next(iter(nodes_of(eng, eng.jobs["s0"])))
    arrivals, reasons = 16, []
    for tick in range(1, 30):
        now = 10.0 * tick
        on_target = sorted(name for name, job in eng.running.items() if name != "big"
                           and nodes_of(eng, job) == {target})
        if not on_target or eng.jobs["big"].phase == JobPhase.RUNNING:
            break
        eng.finish(on_target[0], now)
        eng.submit(whole(f"s{arrivals}", "a", 1), now)
        arrivals += 1
        eng.schedule(now)
        eng.check_invariants()
        if eng.jobs["big"].phase == JobPhase.PENDING:
            reasons.append(eng.queries.explain(f"s{arrivals - 1}"))
    big = eng.jobs["big"]
    assert big.phase == JobPhase.RUNNING, eng.queries.explain("big")
    assert big.job_class == JobClass.GUARANTEED
    assert nodes_of(eng, big) == {target}
    late = eng.jobs[f"s{arrivals - 1}"]
    assert late.phase == JobPhase.PENDING  # the small jobs that came later wait their turn now
    assert any("8 GPUs of it are held for a starving job" in reason for reason in reasons), reasons


def test_a_starving_job_holds_its_guarantee_room_so_the_vcs_new_work_borrows_instead() -> None:
    # a's small jobs finish on both of a's nodes; without a hold on the room, each new small job would
    # start guaranteed on whichever node just freed a GPU and the big job would never have 8 GPUs of room.
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}}, starvation_seconds=30.0)
    for i in range(16):
        eng.submit(whole(f"s{i}", "a", 1), 0)
    eng.submit(whole("b1", "b"), 0)
    eng.submit(whole("b2", "b"), 0)  # b's nodes are busy: there is nothing else to borrow
    eng.schedule(0)
    eng.submit(whole("big", "a", 8), 1)
    eng.schedule(1)
    arrivals, borrowed_while_held = 16, 0
    for tick in range(1, 60):
        now = 10.0 * tick
        if eng.jobs["big"].phase == JobPhase.RUNNING:
            break
        small = sorted(name for name, job in eng.running.items() if job.vc == "a")
        eng.finish(small[tick % len(small)], now)  # a GPU frees on one of a's nodes or another
        eng.submit(whole(f"s{arrivals}", "a", 1), now)
        arrivals += 1
        result = eng.schedule(now)
        if eng.jobs["big"].phase == JobPhase.PENDING and "big" in eng.session.reservations:
            for job in result.started:
                if job.job_class == JobClass.GUARANTEED:  # only where the guarantee has room beyond the hold
                    assert eng.usage["a"].guaranteed_milli <= 16_000 - 8_000
                else:
                    borrowed_while_held += 1
        eng.check_invariants()
    assert eng.jobs["big"].phase == JobPhase.RUNNING, eng.queries.explain("big")
    assert eng.jobs["big"].job_class == JobClass.GUARANTEED
    assert borrowed_while_held > 0  # a's new work kept running, on borrowed capacity
