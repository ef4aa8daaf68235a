"""Guaranteed work stays guaranteed, and only within its guarantee, across reloads, restarts, cordons and
preemptions. Each test is a sequence a stateful fuzz of the engine found breaking the engine's invariant or
demoting (and then reclaiming) work the engine had itself started as guaranteed. Among them: shares charged by
memory can sum past their GPU (616 + 400 milli on one GPU), so a job whose cell is still bound may still be
one too many."""

from __future__ import annotations

from dataclasses import replace

from kubecell.core.engine.invariants import problems
from kubecell.core.engine.job import JobClass, JobSpec, MemberGroup
from kubecell.core.engine.restore import RunningMember
from kubecell.core.model import Node, Request
from tests.core.support import engine, make_nodes, tenants, whole


def shares() -> tuple[JobSpec, JobSpec]:
    return (JobSpec(name="A", vc="a", member=Request("A", gpu_count=1, gpu_milli=600, gpu_memory_mib=20000)),
            JobSpec(name="B", vc="a", member=Request("B", gpu_count=1, gpu_milli=400, gpu_memory_mib=12000)))


def test_a_shrinking_reload_downgrades_the_newest_job_past_the_guarantee() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 8}})
    first, second = shares()
    eng.submit(first, 0)
    eng.schedule(0)
    eng.submit(second, 1)
    eng.schedule(1)
    assert eng.jobs["A"].held_gpu_milli + eng.jobs["B"].held_gpu_milli > 1000, "charged past one GPU"
    downgraded = eng.reload(tenants(eng.forest, {"a": {"gpus": 1}, "b": {"gpus": 7}}), 2)
    assert [job.name for job in downgraded] == ["B"]
    assert eng.jobs["A"].job_class == JobClass.GUARANTEED
    assert problems(eng.session) == []


def test_a_restore_past_the_guarantee_restores_the_rest_borrowed() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 1}, "b": {"gpus": 7}})
    for spec in shares():
        eng.restore(spec, [RunningMember(0, "n0", (0,))], JobClass.GUARANTEED, started_at=0)
    assert (eng.jobs["A"].job_class, eng.jobs["B"].job_class) == (JobClass.GUARANTEED, JobClass.BORROWED)
    assert problems(eng.session) == []


def test_the_quota_policy_keeps_the_minimum_run_time_it_promises_borrowed_work() -> None:
    """``reclaim_min_runtime_seconds`` held under the cells policies only: the quota policy's reclaim by count
    evicted a borrowed job one second after it started."""
    eng = engine(make_nodes(2, gpus=4), {"a": {"gpus": 4}, "b": {"gpus": 4}}, "quota",
                 reclaim_min_runtime_seconds=60.0)
    eng.submit(whole("a1", "a", 4), 0)
    eng.submit(whole("a2", "a", 4), 0)  # borrows b's idle quota
    eng.schedule(0)
    assert eng.jobs["a2"].job_class == JobClass.BORROWED
    eng.submit(whole("b1", "b", 4), 1)
    assert not eng.schedule(1).evicted
    assert "minimum run time" in eng.jobs["b1"].wait_reason
    assert [job.name for job in eng.schedule(61).evicted] == ["a2"], "reclaimed once the minimum is over"
    assert eng.jobs["b1"].job_class == JobClass.GUARANTEED
    assert problems(eng.session) == []


def test_a_failed_priority_preemption_never_leaves_a_guaranteed_job_on_unbound_cells() -> None:
    """L runs guaranteed on a node then cordoned; H (higher priority, same VC) cannot start. Before, L was made
    guaranteed again although its cell, released for H, could not be bound again: guaranteed on cells bound to no
    VC, which another VC could bind under it."""
    eng = engine(make_nodes(2, gpus=4), {"a": {"gpus": 4}, "b": {"gpus": 4}})
    eng.submit(whole("L", "a", 4, priority=0), 0)
    eng.submit(whole("B", "b", 4), 0)
    eng.schedule(0)
    eng.set_node_open(eng.book.allocations[eng.jobs["L"].running_members[0]].node, False)  # L keeps running
    eng.schedule(1)
    eng.submit(whole("H", "a", 1, priority=1), 2)
    eng.schedule(2)
    assert eng.jobs["L"].phase.value == "running"
    assert eng.jobs["L"].job_class == JobClass.GUARANTEED, "its cell, under it on the cordoned node, bound again"
    assert eng.jobs["H"].phase.value == "pending"
    assert problems(eng.session) == []


def test_a_reload_keeps_guaranteed_work_on_a_cordoned_node_guaranteed() -> None:
    """A no-op reload demoted a guaranteed job on a cordoned node to borrowed (its cell, on closed hardware,
    was not free to bind again), and once the node reopened another VC reclaimed it."""
    config = {"a": {"gpus": 4}, "b": {"gpus": 4}}
    eng = engine(make_nodes(2, gpus=4), config)
    eng.submit(whole("a1", "a", 4), 0)
    eng.schedule(0)
    node = eng.book.allocations[eng.jobs["a1"].running_members[0]].node
    eng.set_node_open(node, False)
    eng.schedule(1)
    assert eng.reload(tenants(eng.forest, config), 2) == []
    assert eng.jobs["a1"].job_class == JobClass.GUARANTEED
    eng.set_node_open(node, True)
    eng.submit(whole("b1", "b", 4), 3)
    assert not eng.schedule(3).evicted
    assert eng.jobs["a1"].preemptions == 0
    assert problems(eng.session) == []


def test_nothing_is_freed_for_a_job_its_driver_has_too_few_pods_for() -> None:
    """A guaranteed job whose driver has a pod for one of its two minimum members cannot start; before, reclaim
    evicted the borrowed b2 for it at every retry of the queue (a ping-pong until b2 ran out of preemptions)."""
    eng = engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"gpus": 8}})
    eng.submit(whole("b1", "b", 8), 0)
    eng.submit(whole("b2", "b", 8), 0)  # borrows a's idle node
    eng.schedule(0)
    eng.submit(whole("a1", "a", 4, members=2, min_members=2), 1)
    eng.limit_growth("a1", (1,))
    for step in range(1, 5):
        result = eng.schedule(10.0 * step)
        assert not result.evicted
    assert eng.jobs["b2"].preemptions == 0
    assert "has pods for 1 of the 2 members" in eng.jobs["a1"].wait_reason
    eng.limit_growth("a1", None)  # its second pod exists now: b2 is reclaimed for it, once
    assert [job.name for job in eng.schedule(50.0).evicted] == ["b2"]
    assert problems(eng.session) == []


def test_a_guarantee_never_reclaims_its_own_vcs_higher_priority_work() -> None:
    """H (priority 1) borrows while its VC's guarantee is full of G's higher-priority work; G ends and L (priority
    0, same VC) may only run where H runs. Before, L reclaimed H as borrowed work, and at the next cycle H
    preempted L back by priority: each preempted once by the other, both runs lost."""
    eng = engine(make_nodes(2), {"a": {"gpus": 8, "borrowLimitGpus": 4}, "b": {"gpus": 8}})
    eng.submit(whole("G", "a", 6, priority=2), 0)
    eng.schedule(0)
    eng.submit(whole("H", "a", 4, priority=1), 1)
    eng.schedule(1)
    assert eng.jobs["H"].job_class == JobClass.BORROWED
    eng.finish("G", 2)
    host = eng.book.allocations[eng.jobs["H"].running_members[0]].node
    eng.submit(replace(whole("L", "a", 6, priority=0), nodes=frozenset({host})), 2)
    for now in (2, 3, 4, 5):
        eng.schedule(now)
        assert problems(eng.session) == []
    assert (eng.jobs["H"].preemptions, eng.jobs["L"].preemptions) == (0, 0)
    assert eng.jobs["H"].phase.value == "running"


STRADDLE_CONFIG = {"a": {"cells": {"V100M32x4/node": 1}}, "b": {"cells": {"V100M32x4/2gpu": 2}}}


def nvlink_pairs() -> list[Node]:
    return make_nodes(2, gpus=4, nvlink_groups=[[0, 1], [2, 3]])


def test_a_member_on_two_of_its_vcs_cells_stays_guaranteed_across_a_reload_and_a_restart() -> None:
    """A 2-GPU member took the last free GPU of each of its VC's two NVLink pairs (GPUs 1 and 2: the region of
    a per-member job is all of its VC's bound cells). A reload looked for one cell holding both GPUs (the node,
    which b may not bind), demoted the job, and b's next job reclaimed it; a restart restored it borrowed."""
    eng = engine(nvlink_pairs(), STRADDLE_CONFIG)
    for i in range(4):
        eng.submit(whole(f"s{i}", "b", 1), 0)
    eng.schedule(0)
    for name, job in list(eng.running.items()):
        if eng.book.allocations[job.running_members[0]].gpu_indices[0] in (1, 2):
            eng.finish(name, 1)
    eng.submit(whole("two", "b", 2), 2)
    eng.schedule(2)
    two = eng.jobs["two"]
    gpus = eng.book.allocations[two.running_members[0]].gpu_indices
    assert (two.job_class, gpus) == (JobClass.GUARANTEED, (1, 2))

    assert eng.reload(tenants(eng.forest, STRADDLE_CONFIG), 3) == []
    assert two.job_class == JobClass.GUARANTEED
    eng.submit(whole("next", "b", 2), 4)
    assert not eng.schedule(4).evicted
    assert problems(eng.session) == []

    restarted = engine(nvlink_pairs(), STRADDLE_CONFIG)
    restored = restarted.restore(two.spec, [RunningMember(0, "n0", gpus)], JobClass.GUARANTEED, started_at=2)
    assert restored.job_class == JobClass.GUARANTEED
    assert sorted(cell.id for cell in restarted.tenancy.binding) == ["n0/2gpu0", "n0/2gpu1"]
    assert problems(restarted.session) == []


def test_a_member_across_cells_the_vc_cannot_hold_is_still_restored_borrowed() -> None:
    """The fallback covers a member with its VC's cells GPU by GPU, never with cells the VC may not bind: with
    no 2-GPU cell left to b, the same member restores borrowed and binds nothing."""
    eng = engine(nvlink_pairs(), {"a": {"cells": {"V100M32x4/node": 1}}, "b": {"cells": {"V100M32x4/2gpu": 1}}})
    restored = eng.restore(whole("two", "b", 2), [RunningMember(0, "n0", (1, 2))], JobClass.GUARANTEED,
                           started_at=0)
    assert restored.job_class == JobClass.BORROWED
    assert not [cell for cell, vc in eng.tenancy.binding.items() if vc == "b"]
    assert problems(eng.session) == []


def test_a_heterogeneous_gangs_gpu_member_on_two_cells_stays_guaranteed_across_a_reload() -> None:
    """A gang whose minimum is its CPU launcher starts guaranteed with its 4-GPU worker on two 2-GPU cells of
    its VC; a no-op reload demoted it before."""
    eng = engine(make_nodes(2, gpus=4) + make_nodes(1, gpus=0, prefix="c"), STRADDLE_CONFIG)
    groups = [MemberGroup("launcher", Request("x", cpu_milli=2000), 1, 0),
              MemberGroup("worker", Request("x", cpu_milli=1000, gpu_count=4, gpu_milli=1000), 1, 0)]
    eng.submit(JobSpec.gang("g", "b", groups), 0)
    eng.schedule(0)
    gang = eng.jobs["g"]
    assert gang.job_class == JobClass.GUARANTEED
    assert len(gang.running_members) == 2
    assert eng.reload(tenants(eng.forest, STRADDLE_CONFIG), 1) == []
    assert gang.job_class == JobClass.GUARANTEED
    assert problems(eng.session) == []
