"""Elastic jobs shrink before anyone is preempted whole: reclaim and priority preemption take the members
above a threshold gang's minimum first (newest first, never below a group's minimum), evict whole jobs
only when that is not enough, resize a job at most once per interval (a guarantee excepted), and say why."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import (
    OPPORTUNISTIC_PRIORITY,
    Job,
    JobClass,
    JobPhase,
    JobSpec,
    MemberGroup,
    member_index,
)
from kubecell.core.engine.shrink import shrinkable
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request
from tests.core.engine.hetero_support import hetero_engine, mpi, node_of, running_indices
from tests.core.support import check_engine, engine, make_nodes, nodes_of, whole


def grown_elastic(interval: float = 300.0) -> Engine:
    """Four 8-GPU nodes; VC a is guaranteed two nodes, VC b one. b's 8 x 4-GPU gang (minimum 4) borrows:
    it starts with 4 members beside b's 2-node blocker, and grows to 8 at t=2 when the blocker ends."""
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 8}}, resize_min_interval_seconds=interval)
    eng.submit(whole("blocker", "b", 8, members=2), 0)
    eng.schedule(0)
    eng.submit(whole("elastic", "b", 4, members=8, min_members=4), 1)
    eng.schedule(1)
    job = eng.jobs["elastic"]
    assert (job.job_class, job.size) == (JobClass.BORROWED, 4)
    eng.finish("blocker", 2)
    result = eng.schedule(2)
    assert job in result.grown
    assert job.size == 8
    check_engine(eng)
    return eng


def confirm_all(eng: Engine, now: float) -> None:
    for job in list(eng.running.values()):
        if job.phase == JobPhase.RESERVED:
            eng.confirm(job.name, now)


# ============================================================================ reclaim shrinks first
def test_a_guarantee_shrinks_a_borrowed_elastic_job_to_its_minimum_instead_of_evicting_it() -> None:
    eng = grown_elastic()
    job = eng.jobs["elastic"]
    eng.submit(whole("g", "a", 8, members=2), 100)
    result = eng.schedule(100)
    assert result.evicted == []
    assert [(cut.job.name, len(cut.members)) for cut in result.shrunk] == [("elastic", 4)]
    assert (job.phase, job.job_class, job.size, job.preemptions) == (JobPhase.RUNNING, JobClass.BORROWED, 4, 0)
    assert not set(result.shrunk[0].members) & set(job.running_members)
    assert eng.jobs["g"].phase == JobPhase.RESERVED  # until the driver confirms the shrunk members are gone
    assert eng.queries.status()["b"]["borrowed_gpus"] == 16
    assert "elastic" in eng.session.growable  # it stays growable
    check_engine(eng)


def test_the_newest_members_go_first() -> None:
    eng = grown_elastic()
    job = eng.jobs["elastic"]
    newest = job.running_members[-2:]
    eng.submit(whole("g", "a", 8), 100)  # one node: two 4-GPU members
    result = eng.schedule(100)
    (cut,) = result.shrunk
    assert set(cut.members) == set(newest)
    assert cut.members == tuple(reversed(newest))  # newest first
    assert job.size == 6
    check_engine(eng)


def borrowed_quota_gang(**options: Any) -> Engine:
    """One 8-GPU node, quota VCs a and b of 4 GPUs each: b's gang ``e`` of 8 x 1 GPU (minimum 2) starts borrowed
    beside b's blocker and grows to 8 into a's idle quota when the blocker ends (t=2)."""
    eng = engine(make_nodes(1), {"a": {"gpus": 4}, "b": {"gpus": 4}}, "quota", **options)
    eng.submit(whole("blocker", "b", 4), 0)
    eng.schedule(0)
    eng.submit(whole("e", "b", 1, members=8, min_members=2), 1)
    eng.schedule(1)
    eng.finish("blocker", 2)
    eng.schedule(2)
    return eng


def test_the_drivers_highest_ranks_go_first() -> None:
    """An ElasticJob's controller keeps workers 0..target-1: the scheduler ranks each member by its worker's index,
    and a shrink gives up the highest (before, the newest member went, which after a replacement was worker 0,
    and the controller then removed the highest worker too: two workers lost for one). Without cells any
    member's GPU will do for the preemptor, so the ranks alone decide."""
    for ranked, expected in ((False, ("e/7", "e/6")), (True, ("e/0", "e/1"))):
        eng = borrowed_quota_gang()
        job = eng.jobs["e"]
        assert job.size == 8
        if ranked:  # e/0 is the highest worker index, e/7 the lowest; a name not running is ignored
            eng.rank_members("e", {name: -i for i, name in enumerate(job.running_members)} | {"e/99": 5})
        eng.submit(whole("g", "a", 2), 100)
        (cut,) = eng.schedule(100).shrunk
        assert cut.members == expected
        check_engine(eng)
    with pytest.raises(InvalidInputError, match="an integer per member"):
        eng.rank_members("e", {job.running_members[0]: 1.5})  # type: ignore[dict-item]


def test_a_new_run_forgets_the_ranks_of_the_last() -> None:
    eng = grown_elastic()
    job = eng.jobs["elastic"]
    eng.rank_members("elastic", {name: -i for i, name in enumerate(job.running_members)})
    eng.set_node_health(eng.book.allocations[job.running_members[0]].node, False, 50)  # the job stops and waits again
    assert job.ranks == {}


def test_a_borrowed_gang_grows_into_the_cohorts_last_free_gpu() -> None:
    """Growth needs room for one more member, not for the gang's minimum: a borrowed gang of minimum 2 that lost a
    member could never take the cohort's last free GPU back ("no unused quota left")."""
    eng = borrowed_quota_gang(resize_min_interval_seconds=0)
    job = eng.jobs["e"]
    assert (job.job_class, job.size) == (JobClass.BORROWED, 8)
    assert eng.release_members("e", [job.running_members[-1]], 3, "its pod was deleted")
    assert job.size == 7
    assert job in eng.schedule(4).grown
    assert job.size == 8
    check_engine(eng)


def test_whole_jobs_are_evicted_only_when_shrinking_is_not_enough() -> None:
    # a's guarantee is pinned to n2..n4; b's guarantee (n0) is full of its own job, so its elastic gang (3
    # nodes, minimum 1) and its opportunistic job borrow: n1 and two of a's nodes, and a's third node.
    eng = engine(make_nodes(5), {"a": {"pinnedCells": ["n2", "n3", "n4"]}, "b": {"gpus": 8}})
    eng.submit(whole("own", "b", 8), 0)
    eng.schedule(0)
    eng.submit(whole("opp", "b", 8, priority=OPPORTUNISTIC_PRIORITY), 1)
    eng.submit(whole("elastic", "b", 8, members=3, min_members=1), 1)
    eng.schedule(1)
    elastic, opp = eng.jobs["elastic"], eng.jobs["opp"]
    assert (elastic.job_class, elastic.size, opp.phase) == (JobClass.BORROWED, 3, JobPhase.RUNNING)
    assert nodes_of(eng, opp) <= {"n2", "n3", "n4"}
    eng.submit(whole("two", "a", 8, members=2), 10)  # two nodes: shrinking the gang to 1 is enough
    result = eng.schedule(10)
    assert result.evicted == []
    assert opp.phase == JobPhase.RUNNING  # even opportunistic work is spared
    assert elastic.size == 1
    confirm_all(eng, 10)
    check_engine(eng)
    eng.finish("two", 20)
    eng.schedule(20)
    assert elastic.size == 1  # the interval holds its growth back
    eng.schedule(400)
    assert elastic.size == 3
    eng.submit(whole("three", "a", 8, members=3), 500)  # three nodes: shrinking alone frees two
    result = eng.schedule(500)
    assert result.evicted == [opp]  # the whole job only because shrinking was not enough
    assert [(cut.job, len(cut.members)) for cut in result.shrunk] == [(elastic, 2)]
    assert elastic.phase == JobPhase.RUNNING  # shrunk, not evicted
    assert nodes_of(eng, elastic) == {"n1"}
    check_engine(eng)


def test_shrinking_and_growth_keep_the_guarantee_and_borrow_accounting() -> None:
    eng = grown_elastic(interval=0)
    eng.submit(whole("g", "a", 8, members=2), 100)
    eng.schedule(100)
    confirm_all(eng, 100)
    assert eng.queries.status()["b"]["borrowed_gpus"] == 16
    assert eng.queries.status()["a"]["guaranteed_used_gpus"] == 16
    eng.finish("g", 200)
    result = eng.schedule(200)
    assert eng.jobs["elastic"] in result.grown
    assert eng.jobs["elastic"].size == 8
    assert eng.queries.status()["b"]["borrowed_gpus"] == 32
    check_engine(eng)


# ============================================================================ minimums
def test_a_heterogeneous_gang_is_never_shrunk_below_a_group_minimum() -> None:
    # a launcher (minimum 1) and three 8-GPU workers (minimum 2) of VC b, borrowing a's nodes
    eng = hetero_engine({"a": {"gpus": 24}, "b": {"gpus": 8}}, gpu_nodes=4)
    eng.submit(whole("own", "b", 8), 0)
    eng.schedule(0)
    job = eng.submit(mpi("mpi", "b", 3, worker_min=2, min_members=3), 1)
    eng.schedule(1)
    assert job.job_class == JobClass.BORROWED
    assert running_indices(job) == [0, 1, 2, 3]
    assert shrinkable(job) == ["mpi/3"]
    on = node_of(eng, job, 3)  # the guaranteed jobs go where the workers are (their node constraints)
    eng.submit(replace(whole("g", "a", 8), nodes=frozenset({on})), 10)
    result = eng.schedule(10)
    assert [cut.members for cut in result.shrunk] == [("mpi/3",)]
    assert result.evicted == []
    assert running_indices(job) == [0, 1, 2]
    confirm_all(eng, 10)
    check_engine(eng)
    eng.submit(replace(whole("g2", "a", 8), nodes=frozenset({node_of(eng, job, 2)})), 20)
    result = eng.schedule(20)  # the workers are at their minimum: the gang is evicted, never shrunk below it
    assert result.shrunk == []
    assert result.evicted == [job]
    check_engine(eng)


def two_groups(*, minimum: int, group_minimum: int = 0) -> JobSpec:
    """Group a: members 0, 1 (4 GPUs); group b: members 2, 3 (8 GPUs)."""
    groups = [MemberGroup("a", Request("m", gpu_count=4, gpu_milli=MILLI_PER_GPU), 2, group_minimum),
              MemberGroup("b", Request("m", gpu_count=8, gpu_milli=MILLI_PER_GPU), 2, group_minimum)]
    return JobSpec.gang("x", "a", groups, min_members=minimum)


@pytest.mark.parametrize(("minimum", "group_minimum", "running", "expected"), [
    (3, 0, [0, 1, 2, 3], ["x/3"]),      # total minimum 3: one member may go, the newest
    (3, 0, [2, 3, 0, 1], ["x/1"]),      # grown in another order: the newest is still first
    (3, 0, [0, 1, 2], []),              # at its minimum
    (2, 1, [0, 2, 3], ["x/3"]),         # b may lose one; then b is at its minimum and a's only member stays
    (2, 1, [0, 1, 2], ["x/1"]),         # the newest member (b's) is at its group minimum: skipped
    (1, 0, [3, 0, 2, 1], ["x/1", "x/2", "x/0"]),
])
def test_shrinkable_keeps_every_minimum_newest_first(minimum: int, group_minimum: int, running: list[int],
                                                     expected: list[str]) -> None:
    job = Job(two_groups(minimum=minimum, group_minimum=group_minimum), phase=JobPhase.RUNNING,
              running_members=[f"x/{i}" for i in running])
    assert shrinkable(job) == expected


# ============================================================================ priority preemption
def test_priority_preemption_shrinks_a_lower_priority_elastic_job_before_downgrading_anything() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}})
    rigid = eng.submit(whole("rigid", "a", 8, members=1), 0)
    eng.schedule(0)
    low = eng.submit(whole("low", "a", 8, members=4, min_members=2), 1)
    eng.schedule(1)
    assert low.size == 3
    assert rigid.phase == JobPhase.RUNNING
    high = eng.submit(whole("high", "a", 8, priority=5), 10)
    result = eng.schedule(10)
    assert result.downgraded == []
    assert result.evicted == []
    assert [(cut.job, cut.members) for cut in result.shrunk] == [(low, ("low/2",))]
    assert (low.job_class, low.size, rigid.job_class) == (JobClass.GUARANTEED, 2, JobClass.GUARANTEED)
    assert high.phase == JobPhase.RESERVED
    assert high.job_class == JobClass.GUARANTEED
    assert "preempted by higher-priority high" in eng.queries.explain("low")
    check_engine(eng)


# ============================================================================ no thrash, explain
def test_growth_waits_out_the_interval_after_a_shrink_and_is_woken_when_it_ends() -> None:
    eng = grown_elastic()
    job = eng.jobs["elastic"]
    eng.submit(whole("g", "a", 8, members=2), 100)
    eng.schedule(100)
    confirm_all(eng, 100)
    eng.finish("g", 150)
    result = eng.schedule(150)
    assert result.grown == []
    assert job.size == 4
    assert eng.queries.next_wake() == 400.0
    assert "grows again no earlier than t=400" in eng.queries.explain("elastic")
    result = eng.schedule(400)
    assert result.grown == [job]
    assert job.size == 8
    check_engine(eng)


def test_priority_preemption_treats_a_job_inside_its_resize_interval_as_rigid() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}})
    eng.submit(whole("rigid", "a", 8), 0)
    eng.schedule(0)
    low = eng.submit(whole("low", "a", 8, members=4, min_members=2), 1)
    eng.schedule(1)
    eng.finish("rigid", 5)
    eng.schedule(5)
    assert low.size == 4  # grew at t=5
    eng.submit(whole("high", "a", 8, priority=5), 10)
    result = eng.schedule(10)
    assert result.shrunk == []
    assert result.evicted == [low]  # not a guarantee's reclaim: the interval forbids the shrink
    check_engine(eng)


def test_a_guarantee_shrinks_a_job_that_just_grew() -> None:
    eng = grown_elastic()  # grew at t=2
    job = eng.jobs["elastic"]
    eng.submit(whole("g", "a", 8), 3)  # a guarantee prevails over the interval
    result = eng.schedule(3)
    assert job.size == 6
    assert result.shrunk
    assert result.evicted == []
    confirm_all(eng, 3)
    check_engine(eng)


def test_explain_shows_every_resize_with_its_reason() -> None:
    eng = grown_elastic()
    eng.submit(whole("g", "a", 8, members=2), 100)
    eng.schedule(100)
    text = eng.queries.explain("elastic")
    assert "grown 4 -> 8 members at t=2 (borrowed)" in text
    assert "shrunk 8 -> 4 members at t=100: reclaimed for guaranteed job g (VC a)" in text
    assert text.index("grown") < text.index("shrunk")


def test_an_interval_of_zero_resizes_whenever_capacity_allows() -> None:
    eng = grown_elastic(interval=0)
    job = eng.jobs["elastic"]
    eng.submit(whole("g", "a", 8, members=2), 100)
    eng.schedule(100)
    confirm_all(eng, 100)
    eng.finish("g", 101)
    assert eng.schedule(101).grown == [job]
    assert "grows again" not in eng.queries.explain("elastic")


def test_growth_adds_no_more_members_than_the_driver_can_bind() -> None:
    eng = grown_elastic(interval=0)
    job = eng.jobs["elastic"]
    eng.submit(whole("g", "a", 8, members=2), 100)
    eng.schedule(100)
    confirm_all(eng, 100)
    eng.limit_growth("elastic", [1])  # one pod left to bind
    eng.finish("g", 101)
    eng.schedule(101)
    assert job.size == 5
    assert job.spare == (0,)
    eng.schedule(102)
    assert job.size == 5
    eng.limit_growth("elastic", None)
    eng.schedule(103)
    assert job.size == 8
    assert sorted(member_index(name) for name in job.running_members) == list(range(8))
    check_engine(eng)
