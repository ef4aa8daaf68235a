"""Members an elastic job grew above its minimum go back to a job of its own VC and priority that needs its
minimum: the grown job shrinks (most-served first, newest members first), never below its minimum, never
inside its resize interval or minRuntime (the waiting job is woken when that ends), and nobody of equal
priority is evicted or downgraded for it. Without this, a job that grew into its VC's whole guarantee kept
every later job of the VC waiting until it finished."""

from __future__ import annotations

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobClass, JobPhase
from tests.core.support import check_engine, engine, make_nodes, whole


def grown(interval: float = 0.0, **vc: object) -> Engine:
    """One 8-GPU node, VC a guaranteed all of it; an elastic job of 8 one-GPU members (minimum 1) grows into it."""
    eng = engine(make_nodes(1), {"a": {"gpus": 8, **vc}}, resize_min_interval_seconds=interval)
    eng.submit(whole("elastic", "a", 1, members=8, min_members=1), 0)
    eng.schedule(0)
    assert eng.jobs["elastic"].size == 8
    return eng


def test_a_teammates_job_takes_back_what_growth_took() -> None:
    eng = grown()
    eng.submit(whole("new", "a", 2), 10)
    result = eng.schedule(10)
    job, new = eng.jobs["elastic"], eng.jobs["new"]
    assert new.phase in (JobPhase.RUNNING, JobPhase.RESERVED)
    assert result.evicted == []
    assert [(cut.job.name, len(cut.members)) for cut in result.shrunk] == [("elastic", 2)], "only what it needs"
    assert (job.phase, job.job_class, job.size, job.preemptions) == (JobPhase.RUNNING, JobClass.GUARANTEED, 6, 0)
    assert "given back to new (VC a, equal priority)" in eng.queries.explain("elastic")
    check_engine(eng)


def test_never_below_the_minimum_and_never_a_whole_job_of_equal_priority() -> None:
    eng = grown()
    eng.submit(whole("rigid", "a", 7), 5)  # takes 7 of the 8 members' GPUs back: elastic runs on its minimum
    eng.schedule(5)
    assert eng.jobs["elastic"].size == 1
    eng.submit(whole("late", "a", 1), 20)
    result = eng.schedule(20)
    assert eng.jobs["late"].phase == JobPhase.PENDING
    assert result.evicted == []
    assert result.shrunk == []
    assert eng.jobs["elastic"].size == 1
    assert eng.jobs["rigid"].phase in (JobPhase.RUNNING, JobPhase.RESERVED)


def test_inside_its_resize_interval_a_grown_job_keeps_its_members_and_the_waiting_job_is_woken_after() -> None:
    eng = grown(interval=300.0)
    eng.submit(whole("first", "a", 2), 10)
    eng.schedule(10)  # a start is no resize: the grown job may give back at once
    assert eng.jobs["elastic"].size == 6
    eng.submit(whole("second", "a", 2), 20)
    result = eng.schedule(20)
    assert eng.jobs["second"].phase == JobPhase.PENDING, "the last shrink was 10 s ago"
    assert result.shrunk == []
    assert eng.queries.next_wake() == 310.0, "tried again when the interval ends"
    eng.schedule(310)
    assert eng.jobs["second"].phase in (JobPhase.RUNNING, JobPhase.RESERVED)
    assert eng.jobs["elastic"].size == 4
    check_engine(eng)


def test_min_runtime_protects_a_job_that_just_started() -> None:
    eng = grown(minRuntimeMinutes=10)
    eng.submit(whole("new", "a", 2), 60)
    eng.schedule(60)
    assert eng.jobs["new"].phase == JobPhase.PENDING
    assert eng.queries.next_wake() == 600.0
    eng.schedule(600)
    assert eng.jobs["new"].phase in (JobPhase.RUNNING, JobPhase.RESERVED)


def test_another_vc_or_a_lower_priority_never_takes_members_this_way() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"gpus": 8}}, resize_min_interval_seconds=0.0)
    eng.submit(whole("b-own", "b", 8), 0)
    eng.submit(whole("elastic", "a", 1, members=8, min_members=1), 0)
    eng.schedule(0)
    assert eng.jobs["elastic"].size == 8
    eng.submit(whole("low", "a", 2, priority=-1), 5)
    eng.submit(whole("b-new", "b", 2), 5)
    result = eng.schedule(5)
    assert eng.jobs["low"].phase == JobPhase.PENDING, "a lower priority does not shrink a job of its VC"
    assert eng.jobs["b-new"].phase == JobPhase.PENDING, "another VC's job does not, inside its own guarantee"
    assert result.shrunk == []
    assert eng.jobs["elastic"].size == 8
    check_engine(eng)


def test_a_job_whose_model_a_grown_job_filled_takes_back_though_the_guarantee_has_room() -> None:
    """The VC's guarantee has room on another model, so nothing is "full"; the job asks for the model a grown
    job of its VC filled, and takes its minimum back from it."""
    nodes = make_nodes(1, model="A100", prefix="a") + make_nodes(1, model="V100M32", prefix="v")
    eng = engine(nodes, {"a": {"cells": {"A100x8/node": 1, "V100M32x8/node": 1}}}, resize_min_interval_seconds=0.0)
    eng.submit(whole("elastic", "a", 1, members=8, min_members=1, models=["A100"]), 0)
    eng.schedule(0)
    assert eng.jobs["elastic"].size == 8
    eng.submit(whole("new", "a", 2, models=["A100"]), 10)
    result = eng.schedule(10)
    assert eng.jobs["new"].phase in (JobPhase.RUNNING, JobPhase.RESERVED), eng.queries.explain("new")
    assert [(cut.job.name, len(cut.members)) for cut in result.shrunk] == [("elastic", 2)]
    assert result.evicted == []
    check_engine(eng)


def test_members_the_job_could_not_use_are_never_taken() -> None:
    """A grown job on V100s gives nothing to a job that asks for an A100: shrinking it would not let that job
    run, so it keeps its members and the job waits."""
    nodes = make_nodes(1, model="A100", prefix="a") + make_nodes(1, model="V100M32", prefix="v")
    eng = engine(nodes, {"a": {"cells": {"A100x8/node": 1, "V100M32x8/node": 1}}}, resize_min_interval_seconds=0.0)
    eng.submit(whole("rigid", "a", 8, models=["A100"]), 0)
    eng.submit(whole("elastic", "a", 1, members=8, min_members=1, models=["V100M32"]), 0)
    eng.schedule(0)
    eng.submit(whole("new", "a", 2, models=["A100"]), 10)
    result = eng.schedule(10)
    assert eng.jobs["new"].phase == JobPhase.PENDING
    assert result.shrunk == []
    assert eng.jobs["elastic"].size == 8
