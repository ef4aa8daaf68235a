"""The cluster changing under running jobs, through the engine's public API: a reload of the virtual
clusters never evicts anything by itself, and a failed node stops its gangs whole until it recovers."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobClass, JobPhase
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
    assert eng.queries.status()["a"]["bound_cells"] == 3


def test_reload_downgrades_what_the_new_guarantee_no_longer_covers() -> None:
    eng = busy_cluster()
    downgraded = eng.reload(tenants(eng.forest, RELOADS["shrink-a"]), 10)
    assert sorted(j.name for j in downgraded) == ["a2", "a3"]  # the oldest job keeps the guarantee
    assert eng.jobs["a1"].job_class == JobClass.GUARANTEED
    assert {eng.jobs[n].job_class for n in ("a2", "a3")} == {JobClass.BORROWED}
    status = eng.queries.status()["a"]
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
    assert "b" not in eng.queries.status()
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
    status = eng.queries.status()
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
    assert eng.queries.status()["a"]["doomed_gpus"] == 8
    eng.finish("b1", 2)
    eng.schedule(2)
    assert eng.queries.status()["a"]["doomed_gpus"] == 0
    job = eng.submit(whole("a1", "a"), 3)
    eng.schedule(3)
    assert (job.phase, job.job_class) == (JobPhase.RUNNING, JobClass.GUARANTEED)
    check_engine(eng)


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
    assert eng.queries.explain("b2").startswith(
        "b2: rejected: virtual cluster 'b' was removed by a configuration reload")
    assert eng.jobs["b1"].phase == JobPhase.RUNNING
