"""The dynamic simulator keeps a job history as a cluster's profiler would: a job is submitted with its family's
median run time so far (from its first start to its finish), a job of no family with none; and with
``queue_order: shortest-expected`` the history moves a short family's job ahead of an older long one."""

from __future__ import annotations

from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.estimates import DurationHistory
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.core.topology import CellForest
from kubecell.sim.dynamic.simulator import DynamicSimulation, family_keys
from tests.core.support import make_nodes, tenants


def job(name: str, family: str | None, work: float, submit: float) -> JobSpec:
    return JobSpec(name=name, vc="a", member=Request(name, gpu_count=8, gpu_milli=MILLI_PER_GPU), work=work,
                   submit_time=submit, labels=(("family", family),) if family else ())


def run(jobs: list[JobSpec], order: str) -> DynamicSimulation:
    nodes = make_nodes(1)
    simulation = DynamicSimulation(nodes, tenants(CellForest(nodes), {"a": {"gpus": 8}}),
                                   PRESETS["kubecell"].with_(queue_order=order), jobs, sample_seconds=0,
                                   durations=DurationHistory(min_samples=3))
    simulation.run()
    return simulation


def test_jobs_are_submitted_with_their_familys_median_so_far() -> None:
    jobs = [job("s0", "short", 100, 0), job("s1", "short", 200, 1), job("s2", "short", 300, 2),
            job("s3", "short", 50, 3), job("x", None, 10, 4)]
    simulation = run(jobs, "age")
    spec = simulation.engine.jobs["s3"].spec
    assert spec.expected_seconds is None, "submitted at 3 s, before any short job finished"
    later = run([*jobs[:3], job("s3", "short", 50, 1000), job("x", None, 10, 1001)], "age")
    assert later.engine.jobs["s3"].spec.expected_seconds == 200
    assert later.engine.jobs["x"].spec.expected_seconds is None
    assert family_keys(job("y", None, 1, 0)) == []


def test_the_history_moves_a_short_familys_job_ahead_of_an_older_long_one() -> None:
    history = [job(f"s{i}", "short", 60, i) for i in range(3)] + [job(f"l{i}", "long", 7200, 3 + i)
                                                                     for i in range(3)]
    blocker = job("blocker", None, 1000, 30_000)
    waiting = [job("long-next", "long", 7200, 30_001), job("short-next", "short", 60, 30_002)]
    for order, first in (("age", "long-next"), ("shortest-expected", "short-next")):
        simulation = run([*history, blocker, *waiting], order)
        starts = {name: simulation.records[name].first_start for name in ("long-next", "short-next")}
        assert min(starts, key=lambda name: starts[name] or 0.0) == first, order
