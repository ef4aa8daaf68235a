"""Heterogeneous gangs: member groups with their own shape, count and minimum, all or nothing across groups.

The spec refuses every malformed gang with the job, the group, the value and what is accepted; the fill
order decides which members run; each member is charged its own group's GPU units; placement never
leaves a gang partly bound nor touches the book when it fails; topology, node restrictions, guarantees,
preemption, restore and explanations treat the groups as the gang they are.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobClass, JobPhase, JobSpec, MemberGroup
from kubecell.core.engine.options import PRESETS
from kubecell.core.engine.restore import RunningMember
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_GANG_MEMBERS
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel, make_node
from kubecell.core.topology import CellForest
from tests.core.engine.hetero_support import (
    LAUNCHER_CPU,
    WORKER_CPU,
    hetero_engine,
    launcher,
    mpi,
    node_of,
    running_indices,
    worker,
)
from tests.core.support import allocations_by_job, nodes_of, pending_reason, tenants, whole

W, L = worker(), launcher()
SHARE = Request("share", gpu_count=1, gpu_milli=500)


# ============================================================================ the spec
@pytest.mark.parametrize(("groups", "kwargs", "match"), [
    ([MemberGroup("w", W, 2, 2), MemberGroup("w", L, 1, 1)], {}, r"job 'j'.*duplicate group name 'w'.*unique"),
    ([MemberGroup("w", W, 0, 0)], {}, r"job 'j' group 'w': field 'count': count 0 \(accepted: an integer in 1\.\."),
    ([MemberGroup("w", W, True, 1)], {}, r"group 'w'.*count True"),
    ([MemberGroup("w", W, 2, -1)], {}, r"group 'w': field 'minimum': minimum -1 \(accepted: an integer in 0\.\.2"),
    ([MemberGroup("w", W, 2, 3)], {}, r"group 'w'.*minimum 3.*0\.\.2 \(the group's count\)"),
    ([MemberGroup("l", L, 1, 1), MemberGroup("w", W, 2, 2)], {"min_members": 2},
     r"field 'min_members': total minimum 2 outside 3\.\.3 \(accepted: 3 \(the sum of the group minimums"),
    ([MemberGroup("l", L, 1, 0), MemberGroup("w", W, 2, 1)], {"min_members": 4}, r"total minimum 4 outside 1\.\.3"),
    ([MemberGroup("w", W, MAX_GANG_MEMBERS + 1, 0)], {}, r"group 'w'.*count"),
    ([MemberGroup("w", W, MAX_GANG_MEMBERS, 1), MemberGroup("l", L, 1, 1)], {},
     r"headcount \(all groups\) 4194305 is out of range"),
    ([MemberGroup("s", Request("s", gpu_count=1, gpu_milli=500, topology=TopologyLevel.NVLINK), 1, 1)], {},
     r"group 's': field 'member.topology': a nvlink constraint on a member that is not whole GPUs"),
    ([MemberGroup("l", L, 1, 1), MemberGroup("w", W, 2, 2)], {"topology": TopologyLevel.NVLINK},
     r"field 'topology': 3 members cannot all sit inside one NVLINK cell"),
    ([], {}, r"job 'j': field 'groups': member groups \(\) \(accepted: a non-empty sequence of MemberGroup"),
    ([("w", W, 1, 1)], {}, r"member group 0 is a tuple"),
    ([MemberGroup("", L, 1, 1), MemberGroup("", W, 1, 1)], {}, r"duplicate group name ''"),
    ([MemberGroup("w", "gpu", 1, 1)], {}, r"group 'w': field 'member'"),  # type: ignore[arg-type]
])
def test_a_malformed_gang_is_refused_naming_the_group_and_what_is_accepted(
        groups: list[Any], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        JobSpec.gang("j", "a", groups, **kwargs)


def test_a_spec_whose_member_or_headcount_disagrees_with_its_groups_is_refused() -> None:
    groups = (MemberGroup("l", L, 1, 1), MemberGroup("w", W, 2, 2))
    with pytest.raises(InvalidInputError, match=r"field 'member': member differs from the first group's request"):
        JobSpec("j", "a", W, members=3, groups=groups)
    with pytest.raises(InvalidInputError, match=r"field 'members': headcount 5 is not the groups' total 3"):
        JobSpec("j", "a", L, members=5, groups=groups)
    with pytest.raises(InvalidInputError, match=r"given as a list"):
        JobSpec("j", "a", L, members=3, groups=list(groups))  # type: ignore[arg-type]
    assert JobSpec("j", "a", L, members=3, min_members=3, groups=groups) == JobSpec.gang("j", "a", groups)


def test_the_total_minimum_defaults_to_the_sum_of_the_group_minimums() -> None:
    spec = JobSpec.gang("j", "a", [MemberGroup("l", L, 1, 1), MemberGroup("w", W, 4, 2)])
    assert (spec.member, spec.members, spec.minimum) == (L, 5, 3)
    strict = JobSpec.gang("j", "a", [MemberGroup("l", L, 1, 1), MemberGroup("w", W, 4, 4)])
    assert strict.minimum == strict.members == 5  # every group at its count: all or nothing
    loose = JobSpec.gang("j", "a", [MemberGroup("l", L, 1, 0), MemberGroup("w", W, 4, 0)])
    assert loose.minimum == 1  # a running gang holds at least one member


def test_fill_order_takes_every_group_minimum_first_then_group_by_group() -> None:
    share = MemberGroup("ps", SHARE, 2, 1)
    spec = JobSpec.gang("j", "a", [MemberGroup("worker", W, 3, 1), MemberGroup("launcher", L, 1, 1), share])
    # members: worker 0..2, launcher 3, ps 4..5
    assert tuple(spec.fill_order()) == (0, 3, 4, 1, 2, 5)
    assert spec.fill_segments() == ((0, 0, 1), (1, 3, 1), (2, 4, 1), (0, 1, 2), (2, 5, 1))
    assert spec.first_counts(3) == (1, 1, 1)
    assert spec.first_counts(5) == (3, 1, 1)
    assert [spec.group_of(i).name for i in range(6)] == ["worker"] * 3 + ["launcher", "ps", "ps"]
    assert spec.member_request(3) == Request("j/3", cpu_milli=LAUNCHER_CPU)
    assert spec.member_request(5) == Request("j/5", gpu_count=1, gpu_milli=500)
    assert spec.member_request(0).name == "j/0"
    assert spec.member_request(0).gpu_count == 8
    with pytest.raises(InvalidInputError, match=r"member index 6 \(accepted: 0\.\.5\)"):
        spec.member_request(6)
    assert spec.meets_minimums((1, 1, 1))
    assert not spec.meets_minimums((3, 0, 0))


def test_a_homogeneous_job_has_one_implied_group_and_identical_requests() -> None:
    member = Request("x", cpu_milli=2000, gpu_count=2, gpu_milli=MILLI_PER_GPU)
    plain = JobSpec("j", "a", member, members=4, min_members=2, topology=TopologyLevel.NODE)
    single = JobSpec.gang("j", "a", [MemberGroup("", member, 4, 2)], topology=TopologyLevel.NODE)
    assert plain.member_groups == (MemberGroup("", member, 4, 2),)
    assert not single.heterogeneous
    assert not plain.heterogeneous
    assert list(plain.fill_order()) == list(single.fill_order()) == [0, 1, 2, 3]
    assert [plain.member_request(i) for i in range(4)] == [single.member_request(i) for i in range(4)]
    nvlink = Request("x", gpu_count=2, gpu_milli=MILLI_PER_GPU)
    assert JobSpec("j", "a", nvlink, topology=TopologyLevel.NVLINK).member_request(0).topology == TopologyLevel.NVLINK


def test_describe_names_every_group() -> None:
    assert mpi("j", "a", 4).describe() == "1 x 4000m CPU (launcher) + 4 x 8 GPU (worker), minimum 5"
    assert mpi("j", "a", 4, worker_min=2).describe() == \
        "1 x 4000m CPU (launcher) + 4 x 8 GPU (worker, min 2), minimum 3"


# ============================================================================ charges
def test_each_member_is_charged_its_own_group() -> None:
    eng = hetero_engine({"a": {"gpus": 24}}, gpu_nodes=3)
    spec = JobSpec.gang("j", "a", [MemberGroup("launcher", L, 1, 1), MemberGroup("worker", W, 2, 1),
                                   MemberGroup("ps", SHARE, 2, 0)], min_members=2)
    job = eng.submit(spec, 0)
    assert job.group_milli == (0, 8000, 500)
    assert job.min_milli == 8000  # launcher (0) + one worker
    assert job.milli_of_first(5) == 2 * 8000 + 2 * 500
    # fill order: launcher, worker, then worker, ps, ps
    assert [job.members_within(m) for m in (0, 7999, 8000, 15999, 16000, 16500, 17000)] == [1, 1, 2, 2, 3, 4, 5]
    eng.schedule(0)
    assert job.phase == JobPhase.RUNNING
    assert job.size == 5
    assert job.held_gpu_milli == 17000
    assert eng.queries.status()["a"]["guaranteed_used_gpus"] == 17
    assert eng.usage["a"].cpu_milli == LAUNCHER_CPU + 2 * WORKER_CPU
    small = hetero_engine({"a": {"gpus": 16}}, gpu_nodes=3)  # room for 16 units: the first 3 of the fill order
    capped = small.submit(spec, 0)
    small.schedule(0)
    assert running_indices(capped) == [0, 1, 2]
    assert capped.held_gpu_milli == 16000
    eng.check_invariants()


# ============================================================================ all or nothing
def test_workers_that_fit_do_not_start_without_their_launcher_and_the_book_is_untouched() -> None:
    eng = hetero_engine({"a": {"gpus": 16}}, cpu_nodes=0, gpu_cpu=40000)
    before = dict(eng.book.allocations)
    free = eng.book.cpu_free.copy()
    eng.submit(mpi("j", "a", launcher_cpu=16000, worker_cpu=32000), 0)
    result = eng.schedule(0)
    assert result.started == []
    reason = pending_reason(eng, "j")
    assert "group 'launcher' does not fit beside the others" in reason
    assert eng.book.allocations == before
    assert (eng.book.cpu_free == free).all()
    assert not eng.session.gangs.fits(eng.jobs["j"].spec, None, None, 3, 3)
    assert eng.book.allocations == before
    eng.check_invariants()


@pytest.mark.parametrize("placement", ["kubecell", "spread", "fgd", "gpupacking", "binpack", "bestfit"])
def test_the_hardest_members_are_placed_first_whatever_the_policy(placement: str) -> None:
    """A launcher placed first could take a GPU node's CPU that a worker needs (spread and FGD would put
    it on an empty node); the workers go first, and the launcher takes the small node beside busy work."""
    nodes = [make_node(f"n{i}", cpu_milli=cpu, memory_mib=1 << 18, gpu_count=8, gpu_model="V100M32")
             for i, cpu in enumerate([40000, 40000, 20000])]
    forest = CellForest(nodes)
    eng = Engine(nodes, tenants(forest, {"a": {"gpus": 24}}), PRESETS["kubecell"], forest=forest,
                 placement=placement)
    eng.submit(replace(whole("busy", "a", 8), nodes=frozenset({"n2"})), 0)
    job = eng.submit(mpi("j", "a", launcher_cpu=16000, worker_cpu=32000), 1)
    eng.schedule(1)
    assert job.phase == JobPhase.RUNNING
    assert [node_of(eng, job, i) for i in (0, 1, 2)] in (["n2", "n0", "n1"], ["n2", "n1", "n0"])
    eng.check_invariants()


def test_a_launcher_that_fits_does_not_start_without_its_workers() -> None:
    eng = hetero_engine({"a": {"gpus": 16}})
    eng.submit(whole("busy", "a", 2), 0)
    eng.schedule(0)
    before = allocations_by_job(eng)
    eng.submit(mpi("j", "a"), 1)
    eng.schedule(1)
    assert "group 'worker' needs 2, the nodes take 1" in pending_reason(eng, "j")
    assert allocations_by_job(eng) == {**before, "j": frozenset()}
    assert not any(name.startswith("j/") for name in eng.book.allocations)
    eng.check_invariants()


# ============================================================================ per-group minimums, growth
def test_a_threshold_gang_starts_with_every_group_minimum_and_grows_in_fill_order() -> None:
    eng = hetero_engine({"a": {"gpus": 32}}, gpu_nodes=4, resize_min_interval_seconds=0)  # grows at t=2 and 3
    for i in range(2):
        eng.submit(whole(f"blocker{i}", "a", 8), 0)
    eng.schedule(0)
    spec = mpi("elastic", "a", 4, worker_min=2, min_members=3)
    job = eng.submit(spec, 1)
    eng.schedule(1)
    assert job.job_class == JobClass.GUARANTEED
    assert running_indices(job) == sorted(spec.fill_order()[:3]) == [0, 1, 2]  # the launcher and two workers
    eng.finish("blocker0", 2)
    eng.schedule(2)
    assert running_indices(job) == [0, 1, 2, 3]
    assert job.meets_minimums()
    eng.finish("blocker1", 3)
    result = eng.schedule(3)
    assert job in result.grown
    assert running_indices(job) == [0, 1, 2, 3, 4]
    assert job.held_gpu_milli == 32000
    eng.check_invariants()


def test_growth_within_the_borrowing_limit_counts_each_group_charge() -> None:
    eng = hetero_engine({"a": {"gpus": 8, "borrowLimitGpus": 16}, "b": {"gpus": 24}}, gpu_nodes=4)
    eng.submit(whole("own", "a", 8), 0)
    eng.schedule(0)
    job = eng.submit(mpi("elastic", "a", 4, worker_min=1, min_members=2), 1)
    eng.schedule(1)
    assert job.job_class == JobClass.BORROWED
    assert running_indices(job) == [0, 1, 2]  # launcher (0 units) and two workers: 16 of the 16 it may borrow
    eng.schedule(2)
    assert job.size == 3
    assert eng.queries.status()["a"]["borrowed_gpus"] == 16
    eng.check_invariants()


def test_a_gang_beyond_guarantee_and_borrowing_limit_is_rejected() -> None:
    eng = hetero_engine({"a": {"gpus": 8, "borrowLimitGpus": 4}, "b": {"gpus": 8}})
    job = eng.submit(mpi("j", "a"), 0)
    assert job.phase == JobPhase.REJECTED
    assert "the job needs 16" in job.wait_reason
    assert "may borrow at most 4 GPUs" in job.wait_reason


# ============================================================================ topology and node restriction
def test_a_one_node_gang_of_mixed_shapes_lands_on_one_gpu_node() -> None:
    eng = hetero_engine({"a": {"gpus": 24}}, gpu_nodes=3)
    eng.submit(whole("busy", "a", 2), 0)
    eng.schedule(0)
    job = eng.submit(mpi("j", "a", 2, gpus=4, topology=TopologyLevel.NODE), 1)
    eng.schedule(1)
    assert job.size == 3
    assert len(nodes_of(eng, job)) == 1
    assert nodes_of(eng, job) != nodes_of(eng, eng.jobs["busy"])
    assert "c0" not in nodes_of(eng, job)
    wide = eng.submit(mpi("wide", "a", 3, gpus=4, topology=TopologyLevel.NODE), 2)
    eng.schedule(2)
    assert wide.phase == JobPhase.REJECTED
    assert "within one node" in wide.wait_reason
    eng.check_invariants()


def test_a_rack_gang_keeps_its_launcher_in_the_rack() -> None:
    eng = hetero_engine({"a": {"gpus": 32}}, gpu_nodes=4, racks_of=2)
    eng.submit(whole("busy", "a", 4), 0)
    eng.schedule(0)
    job = eng.submit(mpi("j", "a", 2, topology=TopologyLevel.RACK), 1)
    eng.schedule(1)
    racks = {eng.book.nodes[eng.book.index[n]].rack for n in nodes_of(eng, job)}
    assert job.size == 3
    assert len(racks) == 1
    assert "" not in racks
    assert not nodes_of(eng, job) & nodes_of(eng, eng.jobs["busy"])
    eng.check_invariants()


def test_every_member_stays_on_the_nodes_the_job_may_use() -> None:
    eng = hetero_engine({"a": {"gpus": 16}}, gpu_cpu=16000)
    job = eng.submit(mpi("j", "a", 1, nodes={"n1", "c0"}), 0)
    eng.schedule(0)
    assert nodes_of(eng, job) <= {"n1", "c0"}
    assert job.size == 2
    # the launcher cannot fit beside the worker on n0 (16 cores), and c0 is not allowed: nothing starts
    stuck = eng.submit(mpi("stuck", "a", 1, nodes={"n0"}, launcher_cpu=12000), 1)
    eng.schedule(1)
    assert stuck.phase == JobPhase.PENDING
    assert not stuck.running_members
    assert "not allowed by the job's node constraints" in pending_reason(eng, "stuck")
    eng.check_invariants()


# ============================================================================ guarantees, preemption
def test_a_gang_within_its_guarantee_runs_guaranteed_and_one_beyond_borrows() -> None:
    eng = hetero_engine({"a": {"gpus": 16}, "b": {"gpus": 8}}, gpu_nodes=3)
    inside = eng.submit(mpi("inside", "a"), 0)
    beyond = eng.submit(mpi("beyond", "b"), 0)
    eng.schedule(0)
    assert inside.job_class == JobClass.GUARANTEED
    assert beyond.phase == JobPhase.PENDING
    eng.finish("inside", 1)
    eng.schedule(1)
    assert beyond.job_class == JobClass.BORROWED
    assert eng.queries.status()["b"]["borrowed_gpus"] == 16
    assert eng.queries.status()["b"]["guaranteed_used_gpus"] == 0
    eng.check_invariants()


def test_a_borrowing_heterogeneous_gang_is_reclaimed_whole() -> None:
    eng = hetero_engine({"a": {"gpus": 8}, "b": {"gpus": 8}})
    gang = eng.submit(mpi("gang", "b"), 0)
    eng.schedule(0)
    assert gang.job_class == JobClass.BORROWED
    owner = eng.submit(whole("owner", "a", 8), 10)
    result = eng.schedule(10)
    assert owner.job_class == JobClass.GUARANTEED
    assert result.evicted == [gang]
    assert gang.phase == JobPhase.PENDING
    assert not any(n.startswith("gang/") for n in eng.book.allocations)
    assert eng.usage["b"].cpu_milli == 0
    eng.check_invariants()


def test_a_heterogeneous_preemptor_displaces_lower_priority_work_by_its_summed_need() -> None:
    eng = hetero_engine({"a": {"gpus": 16}}, cpu_nodes=0)
    for i in range(2):
        eng.submit(whole(f"low{i}", "a", 8), 0)
    eng.schedule(0)
    high = eng.submit(mpi("high", "a", priority=1), 10)
    result = eng.schedule(10)
    assert high.phase in (JobPhase.RUNNING, JobPhase.RESERVED)
    assert high.job_class == JobClass.GUARANTEED
    assert {j.name for j in result.evicted} == {"low0", "low1"}
    eng.check_invariants()


def test_a_starving_heterogeneous_gang_reserves_nodes_for_every_group() -> None:
    eng = hetero_engine({"a": {"gpus": 8}, "b": {"gpus": 16}}, gpu_nodes=3, starvation_seconds=10)
    for i in range(3):
        eng.submit(replace(whole(f"b{i}", "b", 4), nodes=frozenset({f"n{i}"})), 0)
    eng.schedule(0)
    job = eng.submit(mpi("mpi", "a"), 1)
    eng.schedule(1)
    assert job.phase == JobPhase.PENDING
    eng.schedule(20)
    held = eng.session.reservations.held["mpi"]
    reserved = {eng.book.nodes[i].name for i in held.nonzero()[0]}
    assert len(reserved & {"n0", "n1", "n2"}) == 2  # one node per worker; the launcher fits beside one
    assert "holding a reservation" in pending_reason(eng, "mpi")
    eng.check_invariants()


# ============================================================================ restore
def test_a_running_heterogeneous_gang_is_restored_member_by_member() -> None:
    source = hetero_engine({"a": {"gpus": 16}})
    job = source.submit(mpi("j", "a"), 0)
    source.schedule(0)
    members = [RunningMember(i, node_of(source, job, i), source.book.allocations[f"j/{i}"].gpu_indices)
               for i in running_indices(job)]
    target = hetero_engine({"a": {"gpus": 16}})
    restored = target.restore(job.spec, members, JobClass.GUARANTEED, started_at=0)
    assert {a: (x.node, x.gpu_indices, x.request) for a, x in target.book.allocations.items()} == {
        a: (x.node, x.gpu_indices, x.request) for a, x in source.book.allocations.items()}
    assert restored.held_gpu_milli == 16000
    assert not restored.short_of_minimum
    assert target.queries.status() == source.queries.status()
    target.check_invariants()


def test_a_gang_restored_below_a_group_minimum_is_refilled_minimums_first() -> None:
    source = hetero_engine({"a": {"gpus": 16}})
    job = source.submit(mpi("j", "a"), 0)
    source.schedule(0)
    workers = [RunningMember(i, node_of(source, job, i), source.book.allocations[f"j/{i}"].gpu_indices)
               for i in (1, 2)]  # the launcher (index 0) died while the scheduler was away
    target = hetero_engine({"a": {"gpus": 16}})
    restored = target.restore(job.spec, workers, JobClass.GUARANTEED, started_at=0)
    assert restored.short_of_minimum
    target.check_invariants()
    target.schedule(1)
    assert running_indices(restored) == [0, 1, 2]
    assert not restored.short_of_minimum
    target.check_invariants()
    with pytest.raises(InvalidInputError, match=r"not distinct members of 0\.\.2"):
        target.restore(mpi("k", "a"), [RunningMember(3, "c0")], JobClass.GUARANTEED, started_at=0)


# ============================================================================ admission and explanations
def test_rejections_name_the_group_that_can_never_fit() -> None:
    eng = hetero_engine({"a": {"gpus": 16}})
    huge = eng.submit(mpi("huge", "a", gpus=16), 0)
    assert huge.phase == JobPhase.REJECTED
    assert huge.wait_reason.startswith("no node could ever hold a member of group 'worker': asks for 16 GPUs")
    many = eng.submit(mpi("many", "a", 3), 0)
    assert many.wait_reason == ("the gang (1 x 4000m CPU (launcher) + 3 x 8 GPU (worker), minimum 4) is larger "
                                "than the cluster could ever hold")
    fat = eng.submit(mpi("fat", "a", launcher_cpu=100_000), 0)
    assert "of group 'launcher': asks for 100000m CPU" in fat.wait_reason
    hived = hetero_engine({"a": {"cells": {"V100M32x8/4gpu": 4}}}, policy="hived")
    small = hived.submit(mpi("small", "a"), 0)
    assert small.wait_reason == ("VC a has no cell type that holds a member of group 'worker' (8 GPU), and this "
                                 "policy does not borrow")
    fits = hived.submit(mpi("fits", "a", gpus=4), 0)
    assert fits.phase == JobPhase.PENDING


def test_jobs_are_of_one_class_only_if_every_group_matches() -> None:
    eng = hetero_engine({"a": {"gpus": 16}})
    key = eng.session.queue.class_key
    one, same = eng.submit(mpi("one", "a"), 0), eng.submit(mpi("same", "a"), 0)
    other = eng.submit(mpi("other", "a", 3, worker_min=2), 0)
    renamed = eng.submit(JobSpec.gang("renamed", "a", [MemberGroup("driver", L, 1, 1),
                                                       MemberGroup("worker", W, 2, 2)]), 0)
    assert key(one) == key(same)
    assert key(one) != key(other)
    assert key(one) != key(renamed)


def test_the_online_policy_observes_each_group_with_its_count(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = hetero_engine({"a": {"gpus": 16}})
    seen: list[tuple[int, int, int]] = []
    monkeypatch.setattr(eng.policy, "observe",
                        lambda request, count=1: seen.append((request.cpu_milli, request.gpu_count, count)))
    eng.submit(mpi("j", "a", 3, worker_min=1, min_members=2), 0)
    eng.submit(whole("plain", "a", 2, members=3), 0)
    # at most what the cluster could hold: its 16 GPUs hold 2 of the 3 workers of 8 GPUs (a pod may state millions)
    assert seen == [(LAUNCHER_CPU, 0, 1), (WORKER_CPU, 8, 2), (0, 2, 3)]
