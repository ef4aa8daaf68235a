"""History-based queue order: inside a VC, with ``queue_order: shortest-expected``, the job its history says is
shortest starts first; without it, the oldest; the order between VCs (fair share) and guarantees are untouched;
and the duration history gives the median of a family's run times at the most specific level it knows."""

from __future__ import annotations

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import Job, JobPhase, JobSpec
from kubecell.core.engine.queue import JobQueue
from kubecell.core.errors import InvalidInputError
from kubecell.core.estimates import DurationHistory
from kubecell.core.model import MILLI_PER_GPU, Request
from tests.core.support import engine, make_nodes


def job(name: str, vc: str, expected: float | None, submitted: float) -> JobSpec:
    return JobSpec(name=name, vc=vc, member=Request(name, gpu_count=8, gpu_milli=MILLI_PER_GPU),
                   submit_time=submitted, expected_seconds=expected)


def first_started_after_blocker(order: str, vcs: dict[str, dict[str, int]], specs: list[JobSpec]) -> str:
    eng: Engine = engine(make_nodes(1), vcs, queue_order=order)
    eng.submit(job("blocker", "a", None, 0), 0)
    eng.schedule(0)
    for spec in specs:
        eng.submit(spec, spec.submit_time)
    eng.schedule(5)
    eng.finish("blocker", 10)
    eng.schedule(10)
    (started,) = [name for name, j in eng.jobs.items() if j.phase == JobPhase.RUNNING]
    return started


def test_shortest_expected_first_inside_a_vc() -> None:
    specs = [job("long", "a", 40_000, 1), job("unknown", "a", None, 2), job("short", "a", 600, 3)]
    assert first_started_after_blocker("age", {"a": {"gpus": 8}}, specs) == "long"
    assert first_started_after_blocker("shortest-expected", {"a": {"gpus": 8}}, specs) == "short"


def test_a_job_without_history_counts_as_an_hour() -> None:
    specs = [job("day", "a", 86_400, 1), job("unknown", "a", None, 2)]
    assert first_started_after_blocker("shortest-expected", {"a": {"gpus": 8}}, specs) == "unknown"


def test_estimates_within_a_factor_of_two_keep_their_age_order() -> None:
    specs = [job("older", "a", 3000, 1), job("newer", "a", 2500, 2)]
    assert first_started_after_blocker("shortest-expected", {"a": {"gpus": 8}}, specs) == "older"


def test_the_order_between_vcs_is_fair_share_not_expected_time() -> None:
    queue = JobQueue(3, shortest_expected=True)
    long_b, short_a = Job(job("b-long", "b", 90_000, 1)), Job(job("a-short", "a", 60, 2))
    for item in (long_b, short_a):
        queue.enqueue(item, item.spec.submit_time)
    shares = {"a": 0.5, "b": 0.1}  # b has used less of its share
    first = min((long_b, short_a), key=lambda item: queue.order_key(item, shares.__getitem__))
    assert first is long_b, "a short job of one VC does not pass the turn of a VC further below its share"
    assert queue.order_key(short_a, shares.__getitem__) < queue.order_key(
        Job(job("a-long", "a", 90_000, 0)), shares.__getitem__), "inside a VC, the shorter first"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="queue order"):
        engine(make_nodes(1), {"a": {"gpus": 8}}, queue_order="sjf")
    with pytest.raises(InvalidInputError, match="expected_seconds"):
        job("x", "a", float("nan"), 0)
    with pytest.raises(InvalidInputError, match="min_samples"):
        DurationHistory(keep=2, min_samples=3)


def test_the_history_gives_the_median_at_the_most_specific_level_it_knows() -> None:
    history = DurationHistory(keep=4, min_samples=3)
    for seconds in (100, 200, 300):
        history.record([("a", "alice", "bert"), ("a", "bert")], seconds)
    history.record([("a", "bob", "bert"), ("a", "bert")], 10_000)
    history.record([("a", "bob", "bert"), ("a", "bert")], float("nan"))  # ignored
    assert history.estimate([("a", "alice", "bert"), ("a", "bert")]) == 200
    assert history.estimate([("a", "bob", "bert"), ("a", "bert")]) == 250, "bob has 1 run: the family's median"
    assert history.estimate([("a", "carol", "gpt")]) is None
    for seconds in (1, 1, 1):
        history.record([("a", "bert")], seconds)
    assert history.estimate([("a", "bert")]) == 1, "only the last 4 runs count"


def backfill_case(margin: float | None, small_expected: float | None,
                  running_expected: float | None = 1000.0) -> JobPhase:
    """One 8-GPU node: a 4-GPU job runs (expected to end at 1000 s), an 8-GPU job starves and reserves the
    node at 100 s, and a 4-GPU job of the same VC arrives at 200 s: does it start on the reserved node?"""
    eng = engine(make_nodes(1), {"a": {"gpus": 8}}, starvation_seconds=100, backfill_margin=margin)
    runner = JobSpec(name="running", vc="a", member=Request("running", gpu_count=4, gpu_milli=MILLI_PER_GPU),
                     expected_seconds=running_expected)
    eng.submit(runner, 0)
    eng.schedule(0)
    eng.submit(job("big", "a", 5000, 1), 1)
    eng.schedule(1)
    eng.schedule(150)  # big has starved: it holds the node
    small = JobSpec(name="small", vc="a", member=Request("small", gpu_count=4, gpu_milli=MILLI_PER_GPU),
                    expected_seconds=small_expected)
    eng.submit(small, 200)
    eng.schedule(200)
    assert "holding a reservation" in eng.jobs["big"].wait_reason
    return eng.jobs["small"].phase


def test_backfill_lets_a_job_that_ends_before_the_region_drains_start_on_reserved_nodes() -> None:
    assert backfill_case(None, 300) == JobPhase.PENDING, "no backfill: the reserved node takes no other work"
    assert backfill_case(1.0, 300) == JobPhase.RUNNING, "200 + 300 <= 1000: it ends before the node drains"
    assert backfill_case(2.0, 300) == JobPhase.RUNNING, "200 + 2 x 300 <= 1000"
    assert backfill_case(3.0, 300) == JobPhase.PENDING, "200 + 3 x 300 > 1000: not with that margin"
    assert backfill_case(1.0, 2000) == JobPhase.PENDING, "it would outlast the running job"
    assert backfill_case(1.0, None) == JobPhase.PENDING, "no history: no backfill"
    assert backfill_case(1.0, 300, running_expected=None) == JobPhase.PENDING, "the region's end is unknown"


def test_a_backfill_margin_below_one_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="backfill margin"):
        engine(make_nodes(1), {"a": {"gpus": 8}}, backfill_margin=0.5)
