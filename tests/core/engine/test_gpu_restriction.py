"""A job limited to some GPUs (``JobSpec.gpus``: what a DRA claim's device selectors leave of the devices
the nodes publish) takes only those GPUs, whether it asks for whole GPUs, a share or a gang, under every
policy; it preempts only where such GPUs are; a job none of whose GPUs is free waits and says so;
unrestricted jobs are untouched."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase, JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request
from tests.core.support import GENERIC_REASONS, check_engine, engine, make_nodes, whole

POLICIES = ["kubecell", "hived", "quota"]


def limited(spec: JobSpec, *gpus: tuple[str, int]) -> JobSpec:
    return replace(spec, gpus=frozenset(gpus))


def held(eng: Engine, name: str) -> set[tuple[str, int]]:
    job = eng.jobs[name]
    assert job.phase == JobPhase.RUNNING, eng.queries.explain(name)
    book = eng.book
    return {(book.allocations[a].node, g) for a in job.running_members for g in book.allocations[a].gpu_indices}


def share(name: str, milli: int, vc: str = "a") -> JobSpec:
    return JobSpec(name=name, vc=vc, member=Request(name, gpu_count=1, gpu_milli=milli))


@pytest.mark.parametrize("gpus", [{("n0", 0)}, [("n0", 0)], frozenset({("n0", -1)}), frozenset({("", 0)}),
                                  frozenset({("n0", "0")}), frozenset({"n0"})])
def test_a_gpu_restriction_must_be_a_frozenset_of_node_and_index(gpus: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"field 'gpus'.*accepted: None \(any GPU\)"):
        JobSpec(name="j", vc="a", member=whole("j", "a").member, gpus=gpus)


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_gpus_come_only_from_the_allowed_ones(policy: str) -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}}, policy)
    allowed = {("n2", 1), ("n2", 5), ("n2", 6), ("n3", 0)}
    eng.submit(limited(whole("j", "a", 3), *allowed), 0)
    eng.schedule(0)
    assert held(eng, "j") == {("n2", 1), ("n2", 5), ("n2", 6)}
    check_engine(eng)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_share_goes_to_an_allowed_gpu_even_when_packing_prefers_another(policy: str) -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}}, policy)
    eng.submit(share("first", 500), 0)
    eng.schedule(0)
    (taken,) = held(eng, "first")
    target = ("n1", 7) if taken != ("n1", 7) else ("n0", 7)
    eng.submit(limited(share("picky", 300), target), 1)
    eng.schedule(1)
    assert held(eng, "picky") == {target}
    check_engine(eng)


def test_a_gang_spreads_over_the_allowed_gpus_of_several_nodes() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 32}})
    allowed = [(f"n{n}", g) for n in (1, 3) for g in (0, 1)]
    eng.submit(limited(whole("g", "a", 2, members=2), *allowed), 0)
    eng.schedule(0)
    assert held(eng, "g") == set(allowed)
    check_engine(eng)


def test_a_job_whose_gpus_are_taken_waits_while_other_gpus_are_free() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    eng.submit(limited(whole("first", "a", 1), ("n0", 3)), 0)
    eng.schedule(0)
    eng.submit(limited(whole("second", "a", 1), ("n0", 3)), 1)
    eng.schedule(1)
    job = eng.jobs["second"]
    assert job.phase == JobPhase.PENDING
    assert job.wait_reason not in GENERIC_REASONS, eng.queries.explain("second")
    eng.submit(limited(whole("nowhere", "a", 1)), 2)
    eng.schedule(2)
    assert eng.jobs["nowhere"].phase == JobPhase.PENDING
    eng.finish("first", 3)
    eng.schedule(3)
    assert held(eng, "second") == {("n0", 3)}
    check_engine(eng)


def test_a_guaranteed_job_preempts_a_borrower_only_on_its_gpus() -> None:
    # VC b borrows all 16 GPUs with one-GPU jobs; VC a's guaranteed job may use n1's GPU 2 only.
    eng = engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"gpus": 8}})
    for i in range(16):
        eng.submit(whole(f"b{i}", "b", 1), 0)
    eng.schedule(0)
    holders = {next(iter(held(eng, f"b{i}"))): f"b{i}" for i in range(16)}
    eng.submit(limited(whole("a0", "a", 1), ("n1", 2)), 1)
    eng.schedule(1)
    victim = holders[("n1", 2)]
    phases = {name: eng.jobs[name].phase for name in holders.values()}
    evicted = {name for name, phase in phases.items() if phase != JobPhase.RUNNING}
    assert evicted == {victim}, eng.queries.explain("a0")
    check_engine(eng)
