"""A reload under the ``quota`` policy, which guarantees GPU counts rather than cells: the guarantee that is left
is kept by the oldest guaranteed jobs, as under cells (``test_engine_changes``), and no job the new guarantee
still covers becomes borrowed work another VC may reclaim."""

from __future__ import annotations

from kubecell.core.engine.job import JobClass
from tests.core.support import allocations_by_job, check_engine, engine, make_nodes, tenants, whole


def test_a_quota_reload_keeps_the_oldest_jobs_guaranteed() -> None:
    """Each job was judged against the VC's whole guaranteed use, the newer jobs' included: the oldest were
    downgraded first, and a job that fits the new guarantee alone was downgraded with the others (here both, with
    4 of the 8 guaranteed GPUs then held by nobody), so another VC could reclaim it."""
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}}, "quota")
    eng.submit(whole("old", "a", 4), 0)
    eng.schedule(0)
    eng.submit(whole("new", "a", 4, members=3), 1)
    eng.schedule(1)
    assert {eng.jobs[n].job_class for n in ("old", "new")} == {JobClass.GUARANTEED}
    before = allocations_by_job(eng)
    downgraded = eng.reload(tenants(eng.forest, {"a": {"gpus": 8}, "b": {"gpus": 24}}), 10)
    assert [job.name for job in downgraded] == ["new"]
    assert eng.jobs["old"].job_class == JobClass.GUARANTEED
    assert eng.jobs["new"].job_class == JobClass.BORROWED
    assert allocations_by_job(eng) == before
    check_engine(eng)


def test_a_quota_reload_that_still_covers_every_job_changes_no_class() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}}, "quota")
    for t, name in enumerate(("j1", "j2")):
        eng.submit(whole(name, "a", 8), float(t))
        eng.schedule(float(t))
    assert eng.reload(tenants(eng.forest, {"a": {"gpus": 16}, "b": {"gpus": 8}}), 10) == []
    assert {eng.jobs[n].job_class for n in ("j1", "j2")} == {JobClass.GUARANTEED}
    check_engine(eng)
