"""The scheduling engine through its public API (submit, schedule, finish, set_node_health, reload,
explain, status): gangs are all-or-nothing, threshold gangs start at their minimum, every waiting job
says why, impossible jobs are rejected at submission, and a reload never evicts anything by itself."""

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
    tenants,
    whole,
)

V = "V100M32x8"


def pending_reason(eng: Engine, name: str) -> str:
    job = eng.jobs[name]
    assert job.phase == JobPhase.PENDING, eng.explain(name)
    assert not job.running_members
    assert job.wait_reason, name
    assert job.wait_reason not in GENERIC_REASONS, eng.explain(name)
    return eng.explain(name)


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
    assert eng.status()["a"]["borrowed_gpus"] == 32
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
    assert eng.status()["a"]["guaranteed_used_gpus"] == 16 + 16
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
    assert eng.status()["a"]["guaranteed_used_gpus"] == 16
    check_engine(eng)


# ============================================================================ explain
def mixed_workload() -> Engine:
    eng = engine(make_nodes(4, racks_of=2), {"a": {"gpus": 8, "borrowLimitGpus": 0}, "b": {"gpus": 24}})
    for spec in (whole("a1", "a"), whole("b1", "b"), whole("b2", "b"), whole("b3", "b")):
        eng.submit(spec, 0)
    eng.schedule(0)
    for spec in (whole("over-limit", "a"), whole("full", "b"),
                 whole("rack-gang", "b", 8, members=2, topology=TopologyLevel.RACK),
                 whole("scavenger", "b", 1, priority=-1), whole("elastic", "b", 4, members=4, min_members=3),
                 whole("node-pair", "b", 4, members=2, topology=TopologyLevel.NODE)):
        eng.submit(spec, 1)
    eng.schedule(1)
    return eng


def test_every_waiting_job_has_a_specific_reason() -> None:
    eng = mixed_workload()
    assert set(eng.pending) == {"over-limit", "full", "rack-gang", "scavenger", "elastic", "node-pair"}
    reasons = {name: pending_reason(eng, name) for name in eng.pending}
    for name, reason in reasons.items():
        assert reason.startswith(f"{name}: pending: ")
    assert "borrowing limit" in reasons["over-limit"]
    assert "VC b guarantee in use (24 of 24 GPUs)" in reasons["full"]
    assert "no cell type that holds this job" in reasons["rack-gang"]
    assert "within one rack" in reasons["rack-gang"]
    assert "idle capacity" in reasons["scavenger"]
    assert "3 member(s) of 4 GPU" in reasons["elastic"]
    assert "within one node" in reasons["node-pair"]
    eng.schedule(2)  # a quiet cycle keeps the reasons
    assert {name: eng.explain(name) for name in eng.pending} == reasons
    check_engine(eng)


def test_identical_waiting_jobs_all_get_the_reason_of_their_class() -> None:
    # Only the oldest job of a class of identical jobs is tried; the others must still say why they wait.
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    for i in range(5):
        eng.submit(whole(f"a{i}", "a"), 0)
    eng.schedule(0)
    assert set(eng.pending) == {"a2", "a3", "a4"}
    reasons = {pending_reason(eng, name).split(": ", 1)[1] for name in eng.pending}
    assert len(reasons) == 1
    assert "VC a guarantee in use (16 of 16 GPUs)" in reasons.pop()


def test_explain_running_rejected_and_unknown_jobs() -> None:
    eng = mixed_workload()
    assert eng.explain("a1").startswith("a1: running: running (guaranteed) since 0")
    eng.submit(whole("nowhere", "zzz"), 3)
    assert eng.explain("nowhere").startswith("nowhere: rejected: unknown virtual cluster 'zzz'")
    assert eng.explain("ghost") == "no job named 'ghost'"


def test_an_identical_job_submitted_later_gets_the_reason_too() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    for name in ("a1", "a2", "a3"):
        eng.submit(whole(name, "a"), 0)
    eng.schedule(0)
    first = pending_reason(eng, "a3")
    eng.submit(whole("a4", "a"), 1)
    eng.schedule(1)
    assert pending_reason(eng, "a4") == first.replace("a3:", "a4:", 1)


def test_a_newcomer_is_told_without_rewriting_its_whole_class() -> None:
    # A cycle costs O(classes + newcomers): when the class's reason has not changed, only the newcomer
    # is written (the marker on an old member shows that it was not touched).
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    for name in ("a1", "a2", "a3", "a4"):
        eng.submit(whole(name, "a"), 0)
    eng.schedule(0)
    reason = eng.jobs["a3"].wait_reason
    eng.jobs["a4"].wait_reason = "marker"
    eng.submit(whole("a5", "a"), 1)
    eng.schedule(1)
    assert eng.jobs["a5"].wait_reason == reason
    assert eng.jobs["a4"].wait_reason == "marker"
    eng.finish("a1", 2)  # the class's reason changes: every member hears it
    eng.submit(whole("a6", "a"), 2)
    eng.schedule(2)
    assert eng.jobs["a3"].phase == JobPhase.RUNNING
    assert {eng.jobs[n].wait_reason for n in ("a4", "a5", "a6")} == {reason}


# ============================================================================ rejection at submission
def test_gang_larger_than_its_vc_is_rejected_when_the_policy_does_not_borrow() -> None:
    eng = engine(make_nodes(4), {"a": {"cells": {f"{V}/node": 2}}, "b": {"cells": {f"{V}/node": 2}}}, "hived")
    job = eng.submit(whole("too-big", "a", 8, members=3), 0)
    assert job.phase == JobPhase.REJECTED
    assert "VC a guarantees 16 GPUs; the job needs 24" in job.wait_reason
    assert "does not borrow" in job.wait_reason
    assert "too-big" not in eng.pending
    assert eng.rejected == [job]
    assert eng.schedule(0).started == []
    assert eng.book.allocations == {}


def test_job_no_cell_of_its_vc_could_hold_is_rejected_when_the_policy_does_not_borrow() -> None:
    eng = engine(make_nodes(4), {"a": {"cells": {f"{V}/4gpu": 4}}, "b": {"gpus": 16}}, "hived")
    job = eng.submit(whole("wide", "a", 8), 0)  # 8 GPUs fit a's 16 in count, not in any 4-GPU cell
    assert job.phase == JobPhase.REJECTED
    assert "VC a has no cell type that holds this job" in job.wait_reason
    same_node = eng.submit(whole("pair", "a", 4, members=2, topology=TopologyLevel.NODE), 0)
    assert same_node.phase == JobPhase.REJECTED  # two members in one node need an 8-GPU cell too
    spread = eng.submit(whole("spread", "a", 4, members=2), 0)  # one member per 4-GPU cell
    assert spread.phase == JobPhase.PENDING
    eng.schedule(0)
    assert (spread.phase, spread.job_class, spread.size) == (JobPhase.RUNNING, JobClass.GUARANTEED, 2)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (whole("five", "a", 8, members=5), "the gang (5+ members) is larger than the cluster could ever hold"),
        (whole("pair", "a", 8, members=2, topology=TopologyLevel.NODE), "within one node"),
        (whole("trio", "a", 8, members=3, topology=TopologyLevel.RACK), "within one rack"),
        (whole("nine", "a", 9), "no node could ever hold a member"),
        (whole("model", "a", 1, models=["A100"]), "no node could ever hold a member"),
    ],
    ids=lambda value: getattr(value, "name", None),
)
def test_jobs_the_cluster_could_never_hold_are_rejected_under_every_policy(spec: Any, reason: str) -> None:
    for policy in ("kubecell", "hived", "quota"):
        eng = engine(make_nodes(4, racks_of=2), {"a": {"gpus": 16}, "b": {"gpus": 16}}, policy)
        job = eng.submit(spec, 0)
        assert job.phase == JobPhase.REJECTED, (policy, job.wait_reason)
        assert reason in job.wait_reason, (policy, job.wait_reason)


def test_gang_larger_than_its_vc_borrows_when_the_policy_borrows() -> None:
    eng = engine(make_nodes(4), {"a": {"cells": {f"{V}/node": 2}}, "b": {"cells": {f"{V}/node": 2}}})
    job = eng.submit(whole("too-big", "a", 8, members=3), 0)
    assert job.phase == JobPhase.PENDING
    eng.schedule(0)
    assert (job.phase, job.job_class, job.size) == (JobPhase.RUNNING, JobClass.BORROWED, 3)


def test_gang_larger_than_guarantee_plus_borrow_limit_is_rejected() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 8, "borrowLimitGpus": 4}, "b": {"gpus": 24}})
    job = eng.submit(whole("big", "a", 8, members=2), 0)
    eng.schedule(0)
    assert job.phase == JobPhase.REJECTED
    assert job.wait_reason == "VC a guarantees 8 GPUs; the job needs 16, and it may borrow at most 4 GPUs"
    assert eng.rejected == [job]
    assert eng.counts()["rejected"] == 1


def test_gangs_within_the_guarantee_or_the_borrow_limit_are_accepted() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 8, "borrowLimitGpus": 12}, "b": {"gpus": 24}})
    fits_guarantee = eng.submit(whole("g", "a", 8), 0)
    fits_limit = eng.submit(whole("l", "a", 4, members=3), 0)  # 12 GPUs: beyond the guarantee, borrowed
    beyond_both = eng.submit(whole("x", "a", 8, members=2), 0)  # 16 GPUs: neither (not 8 + 12 = 20)
    assert (fits_guarantee.phase, fits_limit.phase, beyond_both.phase) == (
        JobPhase.PENDING, JobPhase.PENDING, JobPhase.REJECTED)
    eng.schedule(0)
    assert (fits_guarantee.job_class, fits_limit.job_class) == (JobClass.GUARANTEED, JobClass.BORROWED)


def test_gang_beyond_its_guarantee_keeps_the_no_borrowing_reason_under_hived() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 8, "borrowLimitGpus": 4}, "b": {"gpus": 24}}, "hived")
    job = eng.submit(whole("big", "a", 8, members=2), 0)
    assert job.wait_reason == "VC a guarantees 8 GPUs; the job needs 16, and this policy does not borrow"


def test_unknown_vc_is_rejected_and_never_scheduled() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"gpus": 8}})
    job = eng.submit(whole("lost", "zzz"), 0)
    assert job.phase == JobPhase.REJECTED
    assert job.wait_reason == "unknown virtual cluster 'zzz' (known: a, b)"
    assert eng.pending == {}
    assert eng.rejected == [job]
    assert eng.schedule(0).started == []
    assert job.phase == JobPhase.REJECTED
    assert eng.book.allocations == {}
    assert "zzz" not in eng.status()


def test_duplicate_job_name_is_rejected_without_touching_the_first() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    first = eng.submit(whole("job", "a"), 0)
    eng.schedule(0)
    second = eng.submit(whole("job", "a", 4), 1)
    assert second.phase == JobPhase.REJECTED
    assert "already exists" in second.wait_reason
    assert eng.jobs["job"] is first
    assert first.phase == JobPhase.RUNNING
    check_engine(eng)


# ============================================================================ reload
def busy_cluster() -> Engine:
    """a runs three 8-GPU guaranteed jobs, b a 4-GPU guaranteed job and a borrowed one."""
    eng = engine(make_nodes(4), {"a": {"gpus": 24}, "b": {"gpus": 4}})
    for t, name in enumerate(("a1", "a2", "a3")):
        eng.submit(whole(name, "a"), float(t))
        eng.schedule(float(t))
    eng.submit(whole("b1", "b", 4), 3)
    eng.submit(whole("b2", "b", 4), 3)
    eng.schedule(3)
    classes = {name: eng.jobs[name].job_class for name in eng.jobs}
    assert classes == {"a1": JobClass.GUARANTEED, "a2": JobClass.GUARANTEED, "a3": JobClass.GUARANTEED,
                       "b1": JobClass.GUARANTEED, "b2": JobClass.BORROWED}
    check_engine(eng)
    return eng


RELOADS: dict[str, dict[str, Any]] = {
    "identical": {"a": {"gpus": 24}, "b": {"gpus": 4}},
    "shrink-a": {"a": {"gpus": 8}, "b": {"gpus": 24}},
    "remove-b": {"a": {"gpus": 32}},
    "remove-a": {"b": {"gpus": 8}, "c": {"gpus": 24}},
    "reshape": {"a": {"cells": {f"{V}/4gpu": 6}}, "b": {"cells": {f"{V}/2gpu": 2}}},
    "pin": {"a": {"pinnedCells": ["n0", "n1"]}, "b": {"gpus": 16}},
}


@pytest.mark.parametrize("config", list(RELOADS.values()), ids=list(RELOADS))
def test_reload_never_evicts_running_jobs(config: dict[str, Any]) -> None:
    eng = busy_cluster()
    before = allocations_by_job(eng)
    downgraded = eng.reload(tenants(eng.forest, config), 10)
    assert allocations_by_job(eng) == before
    assert all(eng.jobs[n].phase == JobPhase.RUNNING for n in ("a1", "a2", "a3", "b1", "b2"))
    assert all(eng.jobs[n].preemptions == 0 for n in eng.jobs)
    for job in downgraded:
        assert job.job_class in (JobClass.BORROWED, JobClass.OPPORTUNISTIC)
    check_engine(eng)
    for t in (11.0, 12.0, 1000.0):  # cycles with nothing waiting evict nobody either
        result = eng.schedule(t)
        assert (result.evicted, result.started, result.downgraded) == ([], [], [])
    assert allocations_by_job(eng) == before
    check_engine(eng)


def test_identical_reload_changes_no_class() -> None:
    eng = busy_cluster()
    classes = {name: job.job_class for name, job in eng.jobs.items()}
    assert eng.reload(tenants(eng.forest, RELOADS["identical"]), 10) == []
    assert {name: job.job_class for name, job in eng.jobs.items()} == classes
    assert eng.status()["a"]["bound_cells"] == 3


def test_reload_downgrades_what_the_new_guarantee_no_longer_covers() -> None:
    eng = busy_cluster()
    downgraded = eng.reload(tenants(eng.forest, RELOADS["shrink-a"]), 10)
    assert sorted(j.name for j in downgraded) == ["a2", "a3"]  # the oldest job keeps the guarantee
    assert eng.jobs["a1"].job_class == JobClass.GUARANTEED
    assert {eng.jobs[n].job_class for n in ("a2", "a3")} == {JobClass.BORROWED}
    status = eng.status()["a"]
    assert (status["guaranteed_gpus"], status["guaranteed_used_gpus"], status["borrowed_gpus"]) == (8, 8, 16)


def test_reload_removing_a_vc_turns_its_running_jobs_opportunistic() -> None:
    """Guaranteed and borrowed alike: with no VC there is no guarantee and no borrowing limit to
    count against, but the reload itself evicts nothing."""
    eng = busy_cluster()
    downgraded = eng.reload(tenants(eng.forest, RELOADS["remove-b"]), 10)
    assert [j.name for j in downgraded] == ["b1", "b2"]
    assert eng.jobs["b1"].job_class == JobClass.OPPORTUNISTIC
    assert eng.jobs["b2"].job_class == JobClass.OPPORTUNISTIC
    assert eng.jobs["b2"].phase == JobPhase.RUNNING
    assert "b" not in eng.status()
    assert eng.jobs["a1"].job_class == JobClass.GUARANTEED


def test_reload_removing_a_vc_with_waiting_jobs_keeps_scheduling() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"gpus": 8}}, "hived")
    eng.submit(whole("b1", "b"), 0)
    eng.submit(whole("b2", "b"), 0)
    eng.schedule(0)
    assert eng.jobs["b2"].phase == JobPhase.PENDING
    eng.reload(tenants(eng.forest, {"a": {"gpus": 16}}), 1)
    eng.submit(whole("a1", "a"), 2)
    eng.schedule(2)
    assert eng.jobs["a1"].phase == JobPhase.RUNNING
    assert eng.jobs["b2"].phase in (JobPhase.PENDING, JobPhase.REJECTED)
    assert eng.jobs["b2"].wait_reason not in GENERIC_REASONS


# ============================================================================ bad hardware through the engine
def test_failed_node_stops_its_gangs_whole_and_is_never_used_again_until_it_recovers() -> None:
    eng = engine(make_nodes(3), {"a": {"gpus": 24}})
    eng.submit(whole("gang", "a", 8, members=2), 0)
    eng.submit(whole("solo", "a", 8), 0)
    eng.schedule(0)
    node = sorted(nodes_of(eng, eng.jobs["gang"]))[0]
    killed = eng.set_node_health(node, False, 1)
    assert [j.name for j in killed] == ["gang"]
    gang = eng.jobs["gang"]
    assert gang.phase == JobPhase.PENDING
    assert gang.running_members == []
    assert gang.preemptions == 0
    eng.schedule(1)
    assert "gang" in eng.pending  # only 16 healthy GPUs are left and solo holds 8 of them
    assert all(node not in nodes_of(eng, j) for j in eng.running.values())
    eng.set_node_health(node, True, 2)
    eng.schedule(2)
    assert gang.phase == JobPhase.RUNNING
    assert gang.size == 2
    check_engine(eng)


def test_doomed_cells_follow_a_failure_inside_a_bound_cell() -> None:
    eng = engine(make_nodes(4), {"a": {"cells": {f"{V}/node": 2}}, "b": {"cells": {f"{V}/4gpu": 4}}})
    eng.submit(whole("a1", "a"), 0)
    eng.schedule(0)
    eng.set_node_health(sorted(nodes_of(eng, eng.jobs["a1"]))[0], False, 1)
    eng.schedule(1)  # a1 restarts elsewhere; its old cell is released
    for i in range(4):
        eng.submit(whole(f"b{i}", "b", 4), 2)
    eng.schedule(2)
    status = eng.status()
    assert status["a"]["doomed_gpus"] + status["b"]["doomed_gpus"] == 8
    assert status["b"]["guaranteed_used_gpus"] == status["b"]["guaranteed_gpus"] - status["b"]["doomed_gpus"]


@pytest.mark.parametrize("policy", ["kubecell", "hived"])
def test_doom_is_lifted_when_another_vc_releases_the_healthy_cell_it_split(policy: str) -> None:
    # b's 4-GPU job splits one node, the other node fails: a's node is doomed. When b's job ends its
    # node is whole and healthy again, so a's guarantee must be usable without waiting for the repair.
    eng = engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"cells": {f"{V}/4gpu": 1}}}, policy)
    eng.submit(whole("b1", "b", 4), 0)
    eng.schedule(0)
    (used,) = nodes_of(eng, eng.jobs["b1"])
    eng.set_node_health(({"n0", "n1"} - {used}).pop(), False, 1)
    assert eng.status()["a"]["doomed_gpus"] == 8
    eng.finish("b1", 2)
    eng.schedule(2)
    assert eng.status()["a"]["doomed_gpus"] == 0
    job = eng.submit(whole("a1", "a"), 3)
    eng.schedule(3)
    assert (job.phase, job.job_class) == (JobPhase.RUNNING, JobClass.GUARANTEED)
    check_engine(eng)


# ============================================================================ property: random workloads
@st.composite
def workload(draw: st.DrawFn) -> list[tuple[str, int, int, int, int]]:
    ops = st.tuples(st.sampled_from(["submit", "submit", "submit", "finish", "fail", "heal", "cycle"]),
                    st.integers(0, 2), st.sampled_from([1, 2, 4, 8]), st.integers(1, 4), st.integers(0, 3))
    return draw(st.lists(ops, min_size=1, max_size=18))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["kubecell", "hived", "quota"]), workload())
def test_random_workloads_keep_every_gang_whole(policy: str, ops: list[tuple[str, int, int, int, int]]) -> None:
    eng = engine(make_nodes(4, gpus=4, racks_of=2), {"a": {"gpus": 8}, "b": {"gpus": 4}, "c": {"gpus": 4}},
                 policy)
    names = ["a", "b", "c"]
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
        check_engine(eng)
        for job in eng.pending.values():  # every waiting job says why, newcomers and requeued ones too
            assert job.wait_reason not in GENERIC_REASONS, eng.explain(job.name)
        unhealthy = ~eng.book.gpu_healthy & eng.book.gpu_present
        for job in result.started + result.grown:
            for name in job.running_members:
                allocation = eng.book.allocations[name]
                row = eng.book.index[allocation.node]
                assert not unhealthy[row, list(allocation.gpu_indices)].any()


def test_a_job_of_a_removed_vc_requeued_by_a_node_failure_is_rejected_not_a_crash() -> None:
    eng = busy_cluster()
    eng.reload(tenants(eng.forest, RELOADS["remove-b"]), 10)
    node = sorted(nodes_of(eng, eng.jobs["b1"]))[0]
    eng.set_node_health(node, False, 11)
    result = eng.schedule(11)
    b1 = eng.jobs["b1"]
    assert b1.phase == JobPhase.REJECTED
    assert "'b' was removed by a configuration reload" in b1.wait_reason
    assert "b1" not in eng.pending
    assert b1 in eng.rejected
    assert all(j.vc != "b" or j.phase != JobPhase.PENDING for j in eng.jobs.values())
    assert "b1" not in [j.name for j in result.started]
    check_engine(eng)


def test_reload_rejects_the_waiting_jobs_of_a_removed_vc_with_the_reason() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"gpus": 8}}, "hived")
    eng.submit(whole("b1", "b"), 0)
    eng.submit(whole("b2", "b"), 0)
    eng.schedule(0)
    eng.reload(tenants(eng.forest, {"a": {"gpus": 16}}), 1)
    assert eng.jobs["b2"].phase == JobPhase.REJECTED
    assert eng.explain("b2").startswith("b2: rejected: virtual cluster 'b' was removed by a configuration reload")
    assert eng.jobs["b1"].phase == JobPhase.RUNNING
