"""A job restricted to some nodes (``JobSpec.nodes``: a pod's nodeSelector, required node affinity and
untolerated taints, evaluated by the driver) gets capacity only there, in every way a member gets
capacity: a first start, a gang, growth, borrowing, scavenging, reclaim, priority preemption and the
starvation backstop; a job no allowed node can take waits and says so; unrestricted jobs are untouched."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobClass, JobPhase, JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request, TopologyLevel
from tests.core.support import CPU_MILLI, GENERIC_REASONS, check_engine, engine, make_nodes, nodes_of, whole

POLICIES = ["kubecell", "hived", "quota"]


def only(spec: JobSpec, *nodes: str) -> JobSpec:
    return replace(spec, nodes=frozenset(nodes))


def waiting(eng: Engine, name: str) -> str:
    job = eng.jobs[name]
    assert job.phase == JobPhase.PENDING, eng.queries.explain(name)
    assert not job.running_members
    assert job.wait_reason not in GENERIC_REASONS, eng.queries.explain(name)
    return job.wait_reason


def running(eng: Engine, name: str) -> set[str]:
    job = eng.jobs[name]
    assert job.phase == JobPhase.RUNNING, eng.queries.explain(name)
    return nodes_of(eng, job)


# ============================================================================ the field
@pytest.mark.parametrize("nodes", [{"n0"}, ["n0"], "n0", frozenset({""}), frozenset({"n0", 3})])
def test_a_node_restriction_must_be_a_frozenset_of_node_names(nodes: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"field 'nodes'.*accepted: None \(any node\) or a frozenset"):
        JobSpec(name="j", vc="a", member=whole("j", "a").member, nodes=nodes)


def test_no_restriction_and_an_empty_one_are_valid() -> None:
    assert whole("j", "a").nodes is None
    assert replace(whole("j", "a"), nodes=frozenset()).nodes == frozenset()


def test_equal_node_sets_share_one_read_only_mask() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}})
    first = eng.submit(only(whole("j1", "a", 1), "n1", "n3", "elsewhere"), 0)
    second = eng.submit(only(whole("j2", "a", 1), "n3", "n1", "elsewhere"), 0)
    mask = eng.session.allowed_nodes(first)
    assert mask is not None
    assert mask.tolist() == [False, True, False, True]
    assert eng.session.allowed_nodes(second) is mask
    assert not mask.flags.writeable
    assert eng.session.allowed_nodes(eng.submit(whole("free", "a", 1), 0)) is None


# ============================================================================ first placement
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("gpus", [8, 2, 1])
def test_a_restricted_job_lands_only_on_its_nodes(policy: str, gpus: int) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}}, policy)
    eng.submit(only(whole("j", "a", gpus), "n2"), 0)
    eng.schedule(0)
    assert running(eng, "j") == {"n2"}
    check_engine(eng)


@pytest.mark.parametrize("policy", ["kubecell", "hived"])
def test_a_guaranteed_job_binds_a_cell_on_its_nodes_beyond_the_best_candidates(policy: str) -> None:
    # 40 free node cells: the best 32 by occupancy, buddy order and position (n0..n31) do not include n39.
    eng = engine(make_nodes(40), {"a": {"gpus": 320}}, policy)
    eng.submit(only(whole("j", "a", 8), "n39"), 0)
    eng.schedule(0)
    assert running(eng, "j") == {"n39"}
    assert eng.jobs["j"].job_class == JobClass.GUARANTEED
    check_engine(eng)


@pytest.mark.parametrize("policy", ["kubecell", "quota"])
def test_borrowed_and_cpu_only_jobs_land_only_on_their_nodes(policy: str) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 8}, "b": {"gpus": 24}}, policy)
    eng.submit(only(whole("big", "a", 8, members=2), "n1", "n3"), 0)  # beyond a's guarantee: it borrows
    cpu = Request("cpu", cpu_milli=CPU_MILLI // 2)
    eng.submit(JobSpec(name="cpu", vc="a", member=cpu, nodes=frozenset({"n2"})), 0)
    eng.schedule(0)
    assert running(eng, "big") == {"n1", "n3"}
    assert eng.jobs["big"].job_class == JobClass.BORROWED
    assert running(eng, "cpu") == {"n2"}
    check_engine(eng)


@pytest.mark.parametrize("policy", POLICIES)
def test_an_opportunistic_job_scavenges_only_its_nodes(policy: str) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}}, policy)
    eng.submit(only(whole("scavenger", "a", 4, priority=-1), "n3"), 0)
    eng.schedule(0)
    assert running(eng, "scavenger") == {"n3"}
    assert eng.jobs["scavenger"].job_class == JobClass.OPPORTUNISTIC
    check_engine(eng)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("nodes", [(), ("ghost",)], ids=["empty", "unknown"])
def test_a_job_allowed_on_no_node_waits_naming_its_node_constraints(policy: str, nodes: tuple[str, ...]) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}}, policy)
    eng.submit(only(whole("nowhere", "a", 1), *nodes), 0)
    eng.submit(whole("anywhere", "a", 1), 0)
    eng.schedule(0)
    eng.schedule(1)
    reason = waiting(eng, "nowhere")
    assert "0/4 nodes fit one member: 4 not allowed by the job's node constraints" in reason, reason
    assert eng.jobs["nowhere"].phase == JobPhase.PENDING  # waits (the driver may relabel nodes), not rejected
    assert eng.jobs["anywhere"].phase == JobPhase.RUNNING
    check_engine(eng)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_restricted_to_full_nodes_waits_and_an_identical_unrestricted_one_runs(policy: str) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}}, policy)
    eng.submit(only(whole("blocker", "a", 8), "n1"), 0)
    eng.schedule(0)
    eng.submit(only(whole("pinned", "a", 8), "n1"), 1)
    eng.submit(whole("free", "a", 8), 2)  # same class but for the restriction: it must not wait with it
    eng.schedule(2)
    reason = waiting(eng, "pinned")
    assert "the roomiest node takes 0 member(s) now" in reason, reason
    assert "0/4 nodes fit one member: 3 not allowed by the job's node constraints, 1 insufficient GPUs" in reason
    assert running(eng, "free") != {"n1"}
    eng.finish("blocker", 3)
    eng.schedule(3)
    assert running(eng, "pinned") == {"n1"}
    check_engine(eng)


# ============================================================================ gangs
@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_spreads_only_over_its_nodes(policy: str) -> None:
    eng = engine(make_nodes(6), {"a": {"gpus": 48}}, policy)
    eng.submit(only(whole("gang", "a", 4, members=4), "n1", "n4"), 0)
    eng.submit(only(whole("too-big", "a", 8, members=3), "n0", "n2"), 0)  # 3 members, 2 allowed nodes
    eng.schedule(0)
    assert running(eng, "gang") == {"n1", "n4"}
    assert "nodes fit one member: 4 not allowed by the job's node constraints" in waiting(eng, "too-big")
    check_engine(eng)


@pytest.mark.parametrize("policy", ["kubecell", "quota"])  # hived: a's node cells hold no rack gang
def test_a_rack_gang_takes_the_rack_where_its_nodes_are(policy: str) -> None:
    eng = engine(make_nodes(4, racks_of=2), {"a": {"gpus": 32}}, policy)
    eng.submit(only(whole("gang", "a", 8, members=2, topology=TopologyLevel.RACK), "n1", "n2", "n3"), 0)
    eng.schedule(0)
    assert running(eng, "gang") == {"n2", "n3"}  # rack0 has one allowed node only
    check_engine(eng)


# ============================================================================ growth
@pytest.mark.parametrize("policy", POLICIES)
def test_a_threshold_gang_starts_and_grows_only_on_its_nodes(policy: str) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}}, policy)
    eng.submit(only(whole("blocker", "a", 8), "n1"), 0)
    eng.schedule(0)
    eng.submit(only(whole("elastic", "a", 4, members=4, min_members=2), "n0", "n1"), 1)
    eng.schedule(1)
    elastic = eng.jobs["elastic"]
    assert elastic.size == 2  # n2 and n3 are empty, but not its to take
    assert running(eng, "elastic") == {"n0"}
    eng.finish("blocker", 2)
    result = eng.schedule(2)
    assert [job.name for job in result.grown] == ["elastic"]
    assert elastic.size == 4
    assert running(eng, "elastic") == {"n0", "n1"}
    check_engine(eng)


# ============================================================================ victims
def borrowed_everywhere(policy: str) -> Engine:
    """b's guarantee (16) runs on n0 and n1; its borrowed b3 on n2 (started at 0) and b4 on n3 (started at
    10: the cheaper victim, so the one an unrestricted reclaim takes)."""
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}}, policy)
    for name, node, t in (("b1", "n0", 0), ("b2", "n1", 0), ("b3", "n2", 0), ("b4", "n3", 10)):
        eng.submit(only(whole(name, "b", 8), node), t)
        eng.schedule(t)
    assert [eng.jobs[n].job_class for n in ("b1", "b2", "b3", "b4")] == [
        JobClass.GUARANTEED, JobClass.GUARANTEED, JobClass.BORROWED, JobClass.BORROWED]
    return eng


@pytest.mark.parametrize("policy", ["kubecell", "quota"])
def test_reclaim_by_a_restricted_job_evicts_only_work_on_its_nodes(policy: str) -> None:
    eng = borrowed_everywhere(policy)
    eng.submit(only(whole("a1", "a", 8), "n2"), 20)
    result = eng.schedule(20)
    assert [job.name for job in result.evicted] == ["b3"]
    eng.confirm("a1", 20)
    assert running(eng, "a1") == {"n2"}
    assert running(eng, "b4") == {"n3"}
    check_engine(eng)


@pytest.mark.parametrize("policy", ["kubecell", "quota"])
def test_an_unrestricted_reclaim_takes_the_cheaper_victim(policy: str) -> None:
    eng = borrowed_everywhere(policy)
    eng.submit(whole("a1", "a", 8), 20)
    assert [job.name for job in eng.schedule(20).evicted] == ["b4"]


def test_reclaim_waits_when_only_guaranteed_work_sits_on_its_nodes() -> None:
    eng = borrowed_everywhere("kubecell")
    eng.submit(only(whole("a1", "a", 8), "n0", "n1"), 20)
    result = eng.schedule(20)
    assert result.evicted == []
    assert "0/4 nodes fit one member: 2 not allowed by the job's node constraints, 2 insufficient GPUs" \
        in waiting(eng, "a1")
    check_engine(eng)


def test_a_restricted_borrower_evicts_only_opportunistic_work_on_its_nodes() -> None:
    eng = engine(make_nodes(3), {"a": {"gpus": 8}, "b": {"gpus": 16}})
    eng.submit(only(whole("a1", "a", 8), "n0"), 0)
    eng.submit(only(whole("o1", "b", 8, priority=-1), "n1"), 0)
    eng.schedule(0)
    eng.submit(only(whole("o2", "b", 8, priority=-1), "n2"), 10)  # the cheaper victim
    eng.schedule(10)
    eng.submit(only(whole("a2", "a", 8), "n1"), 20)  # beyond a's guarantee: borrows
    result = eng.schedule(20)
    assert [job.name for job in result.evicted] == ["o1"]
    eng.confirm("a2", 20)
    assert running(eng, "a2") == {"n1"}
    assert eng.jobs["a2"].job_class == JobClass.BORROWED
    assert running(eng, "o2") == {"n2"}
    check_engine(eng)


@pytest.mark.parametrize("policy", ["kubecell", "hived"])
def test_priority_preemption_takes_the_victim_on_its_nodes_not_the_newest(policy: str) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 16}}, policy)
    eng.submit(only(whole("low-old", "a", 8), "n0"), 0)
    eng.schedule(0)
    eng.submit(only(whole("low-new", "a", 8), "n1"), 5)  # the newest: an unrestricted preemptor's victim
    eng.schedule(5)
    eng.submit(only(whole("high", "a", 8, priority=5), "n0"), 10)
    result = eng.schedule(10)
    assert [job.name for job in result.evicted] == ["low-old"]
    eng.confirm("high", 10)
    assert running(eng, "high") == {"n0"}
    assert eng.jobs["high"].job_class == JobClass.GUARANTEED
    assert running(eng, "low-new") == {"n1"}
    assert eng.jobs["low-new"].job_class == JobClass.GUARANTEED
    check_engine(eng)


# ============================================================================ starvation backstop
@pytest.mark.parametrize("restricted", [True, False])
def test_a_starving_job_reserves_only_nodes_it_may_use(restricted: bool) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}}, starvation_seconds=100.0)
    for i in range(4):
        eng.submit(only(whole(f"half{i}", "a", 4), f"n{i}"), 0)
    eng.schedule(0)
    spec = whole("big", "a", 8)
    eng.submit(only(spec, "n3") if restricted else spec, 1)
    eng.schedule(1)
    eng.schedule(200)
    held = eng.session.reservations.held["big"]
    if restricted:
        assert held.tolist() == [False, False, False, True]
    else:
        assert held.sum() == 1
    assert "holding a reservation" in waiting(eng, "big")
    eng.finish("half3", 201)
    eng.schedule(201)
    assert running(eng, "big") == {"n3"} or not restricted
    check_engine(eng)


# ============================================================================ random workloads
@st.composite
def restricted_workload(draw: st.DrawFn) -> list[tuple[str, int, int, int, int, tuple[int, ...] | None]]:
    """(vc, GPUs per member, members, minimum, priority, allowed node indices or None) per job."""
    ops = []
    for _ in range(draw(st.integers(4, 14))):
        members = draw(st.integers(1, 3))
        allowed = draw(st.none() | st.lists(st.integers(0, 5), max_size=4).map(lambda xs: tuple(sorted(set(xs)))))
        ops.append((draw(st.sampled_from("ab")), draw(st.sampled_from([1, 2, 4, 8])), members,
                    draw(st.integers(1, members)), draw(st.sampled_from([-1, 0, 0, 1])), allowed))
    return ops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), restricted_workload(), st.randoms(use_true_random=False))
def test_random_restricted_workloads_stay_on_their_nodes(
        policy: str, ops: list[tuple[str, int, int, int, int, tuple[int, ...] | None]], rnd: Any) -> None:
    eng = engine(make_nodes(6, racks_of=3), {"a": {"gpus": 24}, "b": {"gpus": 16}}, policy,
                 starvation_seconds=30.0 if policy == "kubecell" else None)
    for t, (vc, gpus, members, minimum, priority, allowed) in enumerate(ops):
        spec = whole(f"j{t}", vc, gpus, members=members, min_members=minimum, priority=priority)
        if allowed is not None:
            spec = replace(spec, nodes=frozenset(f"n{i}" for i in allowed))
        eng.submit(spec, float(t * 20))
        result = eng.schedule(float(t * 20))
        for job in result.started:
            if job.phase.value == "reserved":
                eng.confirm(job.name, float(t * 20))
        running_jobs = sorted(eng.running)
        if running_jobs and rnd.random() < 0.3:
            eng.finish(rnd.choice(running_jobs), float(t * 20) + 1)
        for job in eng.running.values():
            if job.spec.nodes is not None:
                assert nodes_of(eng, job) <= job.spec.nodes, (job.name, nodes_of(eng, job), job.spec.nodes)
        check_engine(eng)
    assert np.all(eng.book.cpu_free >= 0)
