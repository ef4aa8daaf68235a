"""A reload that gives back what an earlier one took: jobs it lowered go back up where the new guarantees cover
them, so a reverted configuration push leaves no running job reclaimable for nothing. Before (found by a hostile
review), a reload only lowered classes: a VC removed and restored kept its jobs opportunistic for good, and a
borrower's arrival set off three evictions in two cycles where none was needed."""

from __future__ import annotations

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobClass, JobPhase
from tests.core.support import allocations_by_job, check_engine, engine, make_nodes, tenants, whole


def cycles(eng: Engine, start: float, count: int) -> list[str]:
    """Run ``count`` cycles (each confirming what it reserved); the names of every job evicted."""
    evicted: list[str] = []
    for t in range(count):
        result = eng.schedule(start + t)
        evicted += [job.name for job in result.evicted]
        for job in list(eng.jobs.values()):
            if job.phase == JobPhase.RESERVED:
                eng.confirm(job.name, start + t)
    return evicted


@pytest.mark.parametrize("policy", ["kubecell", "quota"])
def test_a_vc_removed_and_restored_gets_its_guarantee_back_and_nothing_is_evicted(policy: str) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}}, policy)
    for name in ("a1", "a2"):
        eng.submit(whole(name, "a", 8), 0)
    eng.schedule(0)
    placed = allocations_by_job(eng)
    eng.reload(tenants(eng.forest, {"b": {"gpus": 16}}), 10)
    assert {eng.jobs[n].job_class for n in ("a1", "a2")} == {JobClass.OPPORTUNISTIC}
    eng.reload(tenants(eng.forest, {"a": {"gpus": 16}, "b": {"gpus": 16}}), 20)
    assert {eng.jobs[n].job_class for n in ("a1", "a2")} == {JobClass.GUARANTEED}
    assert eng.usage["a"].guaranteed_milli == 16_000
    assert allocations_by_job(eng) == placed
    for name in ("b1", "b2", "b3"):  # b3 finds no room: it waits, it evicts nobody
        eng.submit(whole(name, "b", 8), 30)
    assert cycles(eng, 30, 4) == []
    assert eng.jobs["b3"].phase == JobPhase.PENDING
    check_engine(eng)


def test_a_guarantee_that_shrank_and_grew_back_covers_its_jobs_again_oldest_first() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}}, "quota")
    for t, name in enumerate(("old", "new")):
        eng.submit(whole(name, "a", 8), float(t))
        eng.schedule(float(t))
    assert [job.name for job in eng.reload(tenants(eng.forest, {"a": {"gpus": 8}, "b": {"gpus": 24}}), 10)] == ["new"]
    eng.reload(tenants(eng.forest, {"a": {"gpus": 12}, "b": {"gpus": 20}}), 20)
    assert (eng.jobs["old"].job_class, eng.jobs["new"].job_class) == (JobClass.GUARANTEED, JobClass.BORROWED)
    eng.reload(tenants(eng.forest, {"a": {"gpus": 16}, "b": {"gpus": 16}}), 30)
    assert (eng.jobs["old"].job_class, eng.jobs["new"].job_class) == (JobClass.GUARANTEED, JobClass.GUARANTEED)
    check_engine(eng)


def test_a_job_that_asked_to_be_opportunistic_stays_so() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}})
    eng.submit(whole("scavenger", "a", 8, priority=-1), 0)
    eng.schedule(0)
    assert eng.jobs["scavenger"].job_class == JobClass.OPPORTUNISTIC
    eng.reload(tenants(eng.forest, {"a": {"gpus": 24}}), 10)
    assert eng.jobs["scavenger"].job_class == JobClass.OPPORTUNISTIC
    check_engine(eng)
