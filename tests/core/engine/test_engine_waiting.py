"""Why a job waits or is refused, through the engine's public API: every waiting job says why (explain), and
a job the cluster or its virtual cluster could never hold is rejected at submission."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobClass, JobPhase
from kubecell.core.model import TopologyLevel
from tests.core.support import (
    check_engine,
    engine,
    make_nodes,
    pending_reason,
    whole,
)

V = "V100M32x8"


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
    assert {name: eng.queries.explain(name) for name in eng.pending} == reasons
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
    assert eng.queries.explain("a1").startswith("a1: running: running (guaranteed) since 0")
    eng.submit(whole("nowhere", "zzz"), 3)
    assert eng.queries.explain("nowhere").startswith("nowhere: rejected: unknown virtual cluster 'zzz'")
    assert eng.queries.explain("ghost") == "no job named 'ghost'"


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
    assert eng.queries.counts()["rejected"] == 1


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
    assert "zzz" not in eng.queries.status()


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
