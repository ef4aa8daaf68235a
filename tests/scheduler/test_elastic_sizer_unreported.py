"""An ElasticJob that never reports step times takes the idle room (nothing is known of its worth), and what it
took above its minimum is given to a teammate of its VC that reports and needs it: before, such a job was no
candidate of the allocator, so a teammate that reported never grew into those members (only a claim or a
teammate's minimum took them back)."""

from __future__ import annotations

import time

from tests.core.support import engine, make_nodes
from tests.scheduler.test_elastic_sizer import TeamSizer, report_on, teammate_worker
from tests.scheduler.test_shrink_pods import Loop


def two_jobs(interval: float) -> tuple[Loop, TeamSizer, float]:
    """One 8-GPU node of VC b: ``quiet`` on 7 GPUs for an hour (it never reports), ``new`` on the last one."""
    start = time.time() - 3600.0
    eng = engine(make_nodes(1), {"b": {"gpus": 8}}, resize_min_interval_seconds=interval)
    loop, sizer = Loop(eng), TeamSizer()
    loop.add(*(teammate_worker("quiet", index, 7) for index in range(7)))
    loop.cycle(start)
    loop.add(teammate_worker("new", 0, 1))
    loop.cycle(start + 3500.0)
    assert sorted(job.size for job in eng.running.values()) == [1, 7]
    return loop, sizer, start + 3600.0


def test_a_job_that_never_reports_gives_what_it_grew_to_a_teammate_that_reports() -> None:
    loop, sizer, now = two_jobs(0.0)
    report_on(loop, "new", 1, now)
    sizer.grow(loop.state, loop.mirror, now)
    lowered = [(target, reason) for job, target, reason in sizer.by_job if job == "quiet"]
    raised = [(target, reason) for job, target, reason in sizer.by_job if job == "new"]
    assert lowered, sizer.by_job
    assert raised, sizer.by_job
    assert 1 <= lowered[0][0] < 7, lowered
    assert "no trusted step reports" in lowered[0][1], lowered
    assert raised[0][0] - 1 == 7 - lowered[0][0], "it grows by exactly what the other gives"
    sizer.grow(loop.state, loop.mirror, now + 1)
    sizer.grow(loop.state, loop.mirror, now + 30)
    assert [job for job, _, _ in sizer.by_job].count("quiet") == 1, "lowered once: not raised or lowered again"


def test_not_inside_its_resize_interval() -> None:
    """The engine's resize interval holds for it as for any job: it just grew, so it keeps its members."""
    loop, sizer, now = two_jobs(300.0)
    quiet = next(job for job in loop.state.engine.running.values() if job.size == 7)
    quiet.resized_at = now - 10.0  # it grew 10 s ago
    report_on(loop, "new", 1, now)
    sizer.grow(loop.state, loop.mirror, now)
    assert [job for job, _, _ in sizer.by_job if job == "quiet"] == [], sizer.by_job
