"""An elastic gang whose driver has pods for fewer members than its headcount (an ElasticJob: headcount =
maxReplicas, pods = the current target): it starts with no more members than it has pods, grows only into
pods the driver adds, and ``headroom`` says how many more members the cluster would give it now, within the
same limits growth obeys (borrow limits, the resize interval, what is free)."""

from __future__ import annotations

from kubecell.core.engine.job import JobClass, JobPhase
from tests.core.support import check_engine, engine, make_nodes, whole


def test_an_elastic_gang_starts_with_the_pods_it_has_and_grows_into_the_ones_added() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}}, resize_min_interval_seconds=0.0)
    eng.submit(whole("el", "a", 2, members=8, min_members=1), 0)
    eng.limit_growth("el", (2,))  # two pods exist
    eng.schedule(0)
    job = eng.jobs["el"]
    assert (job.phase, job.size) == (JobPhase.RUNNING, 2), "no member without a pod, though 16 GPUs are free"
    assert eng.queries.headroom("el", 1) == 6, "six more members would fit (its headcount of 8)"
    eng.limit_growth("el", (2,))  # the driver made two more pods
    result = eng.schedule(1)
    assert job in result.grown
    assert job.size == 4
    assert eng.queries.headroom("el", 2) == 4
    check_engine(eng)


def test_a_gang_with_fewer_pods_than_its_minimum_does_not_start() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 8}})
    eng.submit(whole("el", "a", 2, members=4, min_members=3), 0)
    eng.limit_growth("el", (2,))
    eng.schedule(0)
    assert eng.jobs["el"].phase == JobPhase.PENDING


def test_headroom_stops_at_the_borrow_limit_and_waits_for_the_resize_interval() -> None:
    eng = engine(make_nodes(3), {"a": {"gpus": 16}, "b": {"gpus": 8, "borrowLimitGpus": 8}},
                 resize_min_interval_seconds=60.0)
    eng.submit(whole("blocker", "b", 8), 0)  # b's guarantee is taken: the elastic job borrows
    eng.schedule(0)
    eng.submit(whole("el", "b", 2, members=8, min_members=1), 1)
    eng.limit_growth("el", (2,))
    eng.schedule(1)
    job = eng.jobs["el"]
    assert (job.job_class, job.size) == (JobClass.BORROWED, 2)
    assert eng.queries.headroom("el", 2) == 2, "16 GPUs are idle, but b may borrow only 8 (4 held): two members"
    eng.limit_growth("el", (2,))
    eng.schedule(2)
    assert job.size == 4
    assert eng.queries.headroom("el", 3) == 0, "at its borrow limit"
    check_engine(eng)


def test_headroom_waits_for_the_resize_interval() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 8}}, resize_min_interval_seconds=60.0)
    eng.submit(whole("el", "a", 2, members=4, min_members=1), 0)
    eng.limit_growth("el", (1,))
    eng.schedule(0)
    eng.limit_growth("el", (1,))
    eng.schedule(1)
    job = eng.jobs["el"]
    assert job.size == 2, "grown at t=1"
    assert eng.queries.headroom("el", 30) == 0, "no resize before t=61"
    assert eng.queries.headroom("el", 61) == 2


def test_headroom_is_zero_for_a_job_that_does_not_run() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 8}})
    eng.submit(whole("big", "a", 8, members=2), 0)
    eng.schedule(0)
    assert eng.queries.headroom("big", 1) == 0


def test_members_whose_pods_are_gone_are_released_while_the_rest_keeps_the_minimum() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 8}}, resize_min_interval_seconds=0.0)
    eng.submit(whole("el", "a", 2, members=4, min_members=2), 0)
    eng.limit_growth("el", (4,))
    eng.schedule(0)
    job = eng.jobs["el"]
    assert job.size == 4
    assert eng.release_members("el", ["el/3", "el/2"], 5, "deleted by its controller")
    assert (job.phase, job.size, job.running_members) == (JobPhase.RUNNING, 2, ["el/0", "el/1"])
    assert eng.usage["a"].guaranteed_milli == 4000, "their GPUs are free again"
    assert "deleted by its controller" in eng.queries.explain("el")
    assert not eng.release_members("el", ["el/1"], 6, "gone"), "the rest would be below its minimum"
    assert job.size == 2
    eng.limit_growth("el", (1,))
    eng.schedule(7)
    assert job.size == 3, "it grows again into a pod its driver adds"
    check_engine(eng)
