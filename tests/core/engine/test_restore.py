"""A restarted scheduler rebuilds the engine from what runs: same capacity held, same classes, nothing
doubled or lost, and a record that cannot be honoured is refused without changing anything."""

from __future__ import annotations

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobClass, JobPhase, JobSpec
from kubecell.core.engine.restore import RunningMember
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request
from tests.core.support import engine, make_nodes, whole

VCS = {"a": {"gpus": 16}, "b": {"gpus": 8}}


def share(name: str, vc: str, milli: int) -> JobSpec:
    return JobSpec(name=name, vc=vc, member=Request(name, gpu_count=1, gpu_milli=milli))


def running_members(eng: Engine, name: str) -> list[RunningMember]:
    job = eng.jobs[name]
    return [RunningMember(int(a.split("/")[-1]), eng.book.allocations[a].node, eng.book.allocations[a].gpu_indices)
            for a in job.running_members]


def rebuilt(source: Engine, vcs: dict[str, dict[str, int]] = VCS) -> Engine:
    target = engine(make_nodes(4, racks_of=2), vcs)
    for job in source.running.values():
        assert job.job_class is not None
        assert job.started_at is not None
        target.restore(job.spec, running_members(source, job.name), job.job_class, started_at=job.started_at)
    return target


def busy_engine() -> Engine:
    eng = engine(make_nodes(4, racks_of=2), VCS)
    eng.submit(whole("gang", "a", 8, members=2), 0)
    eng.submit(share("half", "b", 500), 0)
    eng.submit(share("quarter", "b", 250), 0)
    eng.submit(whole("borrower", "b", 8), 0)
    eng.schedule(0)
    assert {j.name for j in eng.running.values()} == {"gang", "half", "quarter", "borrower"}
    return eng


def test_restore_holds_exactly_what_ran_in_the_same_classes() -> None:
    source = busy_engine()
    target = rebuilt(source)
    target.check_invariants()
    assert {a.name: (a.node, a.gpu_indices) for a in target.book.allocations.values()} == {
        a.name: (a.node, a.gpu_indices) for a in source.book.allocations.values()}
    assert {n: j.job_class for n, j in target.jobs.items()} == {n: j.job_class for n, j in source.running.items()}
    assert target.queries.status() == source.queries.status()
    assert target.book.allocated_gpu_milli == source.book.allocated_gpu_milli


def test_after_a_restore_the_engine_keeps_scheduling_on_what_is_left() -> None:
    target = rebuilt(busy_engine())
    target.submit(share("fits-beside-half", "b", 250), 10)
    target.submit(whole("no-room", "a", 8), 10)
    target.schedule(10)
    assert target.jobs["fits-beside-half"].phase == JobPhase.RUNNING
    # a's guarantee (16 GPUs) is used by its restored gang and no node has 8 free GPUs: it must wait (a
    # rebuild that lost the gang's or the borrower's allocations would start it).
    assert target.jobs["no-room"].phase == JobPhase.PENDING
    assert "guarantee in use (16 of 16 GPUs)" in target.queries.explain("no-room")
    target.check_invariants()


def test_a_record_that_would_double_a_gpu_is_refused_and_changes_nothing() -> None:
    source = busy_engine()
    target = rebuilt(source)
    before = dict(target.book.allocations)
    gang_member = running_members(source, "gang")[0]
    with pytest.raises(InvalidInputError, match="cannot hold it as recorded"):
        target.restore(whole("intruder", "a", 8), [RunningMember(0, gang_member.node, gang_member.gpus)],
                       JobClass.GUARANTEED, started_at=5)
    assert target.book.allocations == before
    assert "intruder" not in target.jobs
    target.check_invariants()


@pytest.mark.parametrize(("members", "message"), [
    ([RunningMember(0, "n9", (0,))], "unknown node 'n9'"),
    ([RunningMember(0, "n0", (0,)), RunningMember(0, "n1", (0,))], "not distinct"),
    ([], "not distinct"),
])
def test_malformed_member_lists_are_refused(members: list[RunningMember], message: str) -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 8}})
    with pytest.raises(InvalidInputError, match=message):
        eng.restore(share("j", "a", 1000), members, JobClass.GUARANTEED, started_at=0)
    assert not eng.book.allocations


def test_guaranteed_work_the_new_configuration_no_longer_covers_keeps_running_borrowed() -> None:
    source = busy_engine()
    target = rebuilt(source, {"a": {"gpus": 8}, "c": {"gpus": 16}})  # a shrank; b is gone
    target.check_invariants()
    classes = {n: j.job_class for n, j in target.jobs.items()}
    assert classes["gang"] == JobClass.BORROWED
    assert classes["half"] == JobClass.OPPORTUNISTIC
    assert all(j.phase == JobPhase.RUNNING for j in target.jobs.values())


def test_a_restored_threshold_gang_grows_into_its_free_member_slots() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    spec = whole("elastic", "a", 8, members=2, min_members=1)
    eng.restore(spec, [RunningMember(1, "n0", tuple(range(8)))], JobClass.GUARANTEED, started_at=0)
    eng.schedule(1)
    assert eng.jobs["elastic"].size == 2
    eng.check_invariants()
    assert eng.book.allocated_gpu_milli == MILLI_PER_GPU * 16


def test_gpus_another_scheduler_bound_are_held_and_never_evicted() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 8}})
    foreign = eng.hold_external(Request("other/pod", gpu_count=6, gpu_milli=MILLI_PER_GPU), "n0")
    assert foreign.gpu_indices == (0, 1, 2, 3, 4, 5)
    eng.submit(whole("wants-four", "a", 4), 0)
    eng.submit(whole("wants-two", "a", 2), 0)
    eng.schedule(0)
    assert eng.jobs["wants-four"].phase == JobPhase.PENDING  # only 2 GPUs left: nothing may be evicted
    assert eng.jobs["wants-two"].phase == JobPhase.RUNNING
    eng.check_invariants()
    eng.release_external("other/pod")
    eng.schedule(1)
    assert eng.jobs["wants-four"].phase == JobPhase.RUNNING
    eng.check_invariants()
    with pytest.raises(InvalidInputError, match="does not fit"):
        eng.hold_external(Request("other/huge", gpu_count=8, gpu_milli=MILLI_PER_GPU), "n0")
