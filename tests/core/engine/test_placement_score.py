"""The placement policy's score of the node a job went to is kept on the job (``Job.placement_score``), for
the people watching the scheduler: it is the score that decided, for a single member, a gang placed
member by member, and a threshold gang that grows; None where no score was computed (one candidate)."""

from __future__ import annotations

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.model import Request
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.testbed.nodes import synthetic_cluster


def engine(nodes: int = 4) -> Engine:
    cluster = synthetic_cluster(nodes)
    forest = CellForest(cluster)
    tenants = resolve_tenants({"virtualClusters": {"a": {"pinnedCells": [c.id for c in forest.roots]}}}, forest,
                              source="test")
    return Engine(cluster, tenants, PRESETS["kubecell"], forest=forest)


def best_score(e: Engine, request: Request) -> int:
    placer = e.session.placer
    feasible = placer.feasible(request)
    return int(placer.scores_within(request, feasible, None).max())


def test_a_single_member_keeps_the_score_of_the_node_it_went_to() -> None:
    e = engine()
    e.submit(JobSpec("warm", "a", Request("x", cpu_milli=1000, gpu_count=1, gpu_milli=300)), 0.0)
    e.schedule(0.0)
    request = Request("j/0", cpu_milli=1000, gpu_count=1, gpu_milli=500)
    job = e.submit(JobSpec("j", "a", request), 1.0)
    expected = best_score(e, request)
    e.schedule(1.0)
    assert job.placement_score == expected
    assert 0 <= expected <= 100


def test_a_gang_keeps_the_score_of_its_first_members_node() -> None:
    e = engine()
    spec = JobSpec("g", "a", Request("x", cpu_milli=1000, gpu_count=2, gpu_milli=1000), members=6)
    expected = best_score(e, spec.member_request(0))
    job = e.submit(spec, 0.0)
    e.schedule(0.0)
    assert job.size == 6
    assert job.placement_score == expected


def test_one_candidate_node_has_no_score_and_a_grown_gang_gets_the_score_of_its_new_node() -> None:
    e = engine(3)
    eight = Request("x", cpu_milli=1000, gpu_count=8, gpu_milli=1000)
    blockers = [e.submit(JobSpec(f"b{i}", "a", eight), 0.0) for i in range(2)]
    e.schedule(0.0)
    job = e.submit(JobSpec("t", "a", eight, members=2, min_members=1), 1.0)
    e.schedule(1.0)
    assert job.size == 1
    assert job.placement_score is None  # one node was left: nothing to compare
    for blocker in blockers:
        e.finish(blocker.name, 2.0)
    expected = best_score(e, job.spec.member_request(1))
    result = e.schedule(2.0)
    assert result.grown == [job]
    assert job.size == 2
    assert job.placement_score == expected
