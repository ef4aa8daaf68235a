"""Heterogeneous gangs under random inputs.

* ``fits`` promises exactly what ``place`` delivers (victim searches and region checks rely on it), and
  neither changes the book unless ``place`` succeeds; a placement holds a prefix of the fill order
  covering every group minimum, within the allowed GPUs, one node or one labelled rack when asked.
* Random workloads of heterogeneous gangs on a small cluster: after every submit, cycle, finish and node
  failure the engine's invariants hold and no running gang is below a group minimum.
* A single-group gang built with ``JobSpec.gang`` behaves exactly like the same homogeneous ``JobSpec``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.book import BoolArray
from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase, JobSpec, MemberGroup, member_index
from kubecell.core.model import Request, TopologyLevel
from tests.core.engine.hetero_support import cluster
from tests.core.engine.test_gang_placement import MEMBERS, placers, prefill, specs_strategy
from tests.core.engine.test_gang_placement import cluster as book_of
from tests.core.support import allocations_by_job, engine

group_strategy = st.tuples(st.integers(0, len(MEMBERS) - 1), st.integers(1, 4), st.integers(0, 4))


def gang(name: str, vc: str, groups: list[tuple[int, int, int]], extra: int,
         topology: TopologyLevel | None = None, priority: int = 0) -> JobSpec:
    """Groups of MEMBERS shapes (shape, count, minimum clipped to count); the total minimum is the sum of
    the group minimums plus ``extra`` (clipped to the headcount)."""
    built = [MemberGroup(f"g{i}", Request(name, **MEMBERS[shape]), count, min(minimum, count))
             for i, (shape, count, minimum) in enumerate(groups)]
    floor = max(1, sum(g.minimum for g in built))
    total = sum(g.count for g in built)
    return JobSpec.gang(name, vc, built, min_members=min(total, floor + extra), topology=topology,
                        priority=priority)


def state(book: Any) -> tuple[Any, ...]:
    return (dict(book.allocations), book.cpu_free.tobytes(), book.mem_free.tobytes(), book.gpu_milli_free.tobytes(),
            book.gpu_mem_free.tobytes())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=specs_strategy, groups=st.lists(group_strategy, min_size=2, max_size=3), extra=st.integers(0, 3),
       seed=st.integers(0, 10_000), masked=st.booleans(),
       level=st.sampled_from([None, TopologyLevel.NODE, TopologyLevel.RACK]), policy=st.sampled_from(
           ["kubecell", "fgd", "binpack", "bestfit", "random"]))
def test_fits_promises_exactly_what_place_delivers(specs: list[tuple[int, int, str]],
                                                   groups: list[tuple[int, int, int]], extra: int, seed: int,
                                                   masked: bool, level: TopologyLevel | None, policy: str) -> None:
    book = book_of(specs)
    prefill(book, seed)
    gangs, _ = placers(book, policy, seed)
    spec = gang("g", "a", groups, extra, level)
    allowed: BoolArray | None = np.random.default_rng(seed).random((book.size, book.max_gpus)) < 0.7 if masked \
        else None
    before = state(book)
    fits = gangs.fits(spec, allowed, None, spec.members, spec.minimum)
    assert state(book) == before, "a fit test must leave the book as it was"
    placed = gangs.place(spec, allowed, None, spec.members, spec.minimum)
    assert fits == (placed is not None)
    if placed is None:
        assert state(book) == before
        return
    book.check_invariants()
    indices = sorted(member_index(a.name) for a in placed)
    assert spec.minimum <= len(placed) <= spec.members
    assert indices == sorted(spec.fill_order()[:len(placed)])
    assert spec.meets_minimums(spec.counts_of(indices))
    for allocation in placed:
        assert allocation.request == spec.member_request(member_index(allocation.name))
        if allowed is not None:
            assert all(allowed[book.index[allocation.node], g] for g in allocation.gpu_indices)
    nodes = {a.node for a in placed}
    if level == TopologyLevel.NODE:
        assert len(nodes) == 1
    elif level == TopologyLevel.RACK:
        racks = {book.nodes[book.index[n]].rack for n in nodes}
        assert len(racks) == 1
        assert racks != {""}


# ---------------------------------------------------------------------------------------- random workloads
GPU_SHAPES = [{"cpu_milli": 4000}, {"cpu_milli": 2000, "gpu_count": 1, "gpu_milli": 500},
              {"cpu_milli": 8000, "gpu_count": 4, "gpu_milli": 1000}, {"cpu_milli": 16000, "gpu_count": 8,
                                                                          "gpu_milli": 1000}]
submit_step = st.tuples(st.just("submit"), st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.integers(0, 3)),
                                                   min_size=1, max_size=3),
                        st.integers(0, 2), st.sampled_from(["a", "b"]), st.sampled_from([None, TopologyLevel.NODE,
                                                                                         TopologyLevel.RACK]),
                        st.sampled_from([0, 0, 1, -1]))
other_step = st.tuples(st.sampled_from(["schedule", "finish", "fail", "heal"]), st.integers(0, 1000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.one_of(submit_step, other_step), min_size=1, max_size=25),
       policy=st.sampled_from(["kubecell", "quota", "hived"]), interval=st.sampled_from([0.0, 300.0]))
def test_random_heterogeneous_workloads_keep_every_invariant(steps: list[tuple[Any, ...]], policy: str,
                                                             interval: float) -> None:
    """Every group's minimum holds whatever happens: starts, growth, shrinks (no resize interval, or one)."""
    eng = engine(cluster(4, 2, racks_of=2), {"a": {"gpus": 16}, "b": {"gpus": 8}}, policy,
                 resize_min_interval_seconds=interval)
    now = 0.0
    for number, step in enumerate(steps):
        now += 1
        if step[0] == "submit":
            _, groups, extra, vc, level, priority = step
            built = [MemberGroup(f"g{i}", Request("x", **GPU_SHAPES[shape]), count, min(minimum, count))
                     for i, (shape, count, minimum) in enumerate(groups)]
            total, floor = sum(g.count for g in built), max(1, sum(g.minimum for g in built))
            eng.submit(JobSpec.gang(f"j{number}", vc, built, min_members=min(total, floor + extra),
                                    topology=level, priority=priority), now)
        elif step[0] == "schedule":
            eng.schedule(now)
        elif step[0] == "finish" and eng.running:
            names = sorted(eng.running)
            eng.finish(names[step[1] % len(names)], now)
        elif step[0] in ("fail", "heal"):
            eng.set_node_health(eng.book.nodes[step[1] % eng.book.size].name, step[0] == "heal", now)
        check(eng)
    eng.schedule(now + 1)
    check(eng)


def check(eng: Engine) -> None:
    eng.check_invariants()
    for job in eng.running.values():
        counts = job.running_counts()
        assert job.spec.meets_minimums(counts), (job.name, counts, job.spec.describe())
        assert job.held_gpu_milli == sum(job.charge_of(n) for n in job.running_members)
    for job in eng.jobs.values():
        if job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED):
            assert not any(name.startswith(f"{job.name}/") for name in eng.book.allocations)


# ---------------------------------------------------------------------------------------- one group
job_strategy = st.tuples(st.integers(0, len(GPU_SHAPES) - 1), st.integers(1, 4), st.integers(0, 3),
                         st.sampled_from(["a", "b"]), st.sampled_from([None, TopologyLevel.NODE, TopologyLevel.RACK]),
                         st.sampled_from([0, 1, -1]), st.booleans())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(job_strategy, min_size=1, max_size=12), policy=st.sampled_from(["kubecell", "quota", "hived"]))
def test_a_single_group_gang_behaves_exactly_like_the_homogeneous_job(jobs: list[tuple[Any, ...]],
                                                                      policy: str) -> None:
    plain = engine(cluster(4, 1, racks_of=2), {"a": {"gpus": 16}, "b": {"gpus": 8}}, policy)
    grouped = engine(cluster(4, 1, racks_of=2), {"a": {"gpus": 16}, "b": {"gpus": 8}}, policy)
    for number, (shape, members, slack, vc, level, priority, finish) in enumerate(jobs):
        now = float(number)
        member = Request(f"j{number}", **GPU_SHAPES[shape])
        minimum = max(1, members - slack)
        topology = level if members > 1 else None
        plain.submit(JobSpec(f"j{number}", vc, member, members=members, min_members=minimum, topology=topology,
                             priority=priority), now)
        grouped.submit(JobSpec.gang(f"j{number}", vc, [MemberGroup("", member, members, minimum)],
                                    topology=topology, priority=priority), now)
        if finish and plain.running:
            name = sorted(plain.running)[0]
            plain.finish(name, now)
            grouped.finish(name, now)
        plain.schedule(now)
        grouped.schedule(now)
        assert allocations_by_job(plain) == allocations_by_job(grouped)
        assert {n: (j.phase, j.job_class, j.wait_reason, j.held_gpu_milli) for n, j in plain.jobs.items()} == \
            {n: (j.phase, j.job_class, j.wait_reason, j.held_gpu_milli) for n, j in grouped.jobs.items()}
        assert plain.queries.status() == grouped.queries.status()
    plain.check_invariants()
    grouped.check_invariants()
