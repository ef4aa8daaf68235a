"""Interference-aware sharing in the engine: with a co-location rule, a share goes only to a GPU where the rule
admits it beside the shares already there; without one, shares pack by capacity. Profiles are plain data on the
request; a request without one is judged by what it asks for."""

from __future__ import annotations

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase, JobSpec
from kubecell.core.interference import (
    AdmissionRule,
    BlindSharing,
    InterferencePredictor,
    JobKey,
    NoSharing,
    PredictedSlowdown,
    PressureAdaptive,
    SoloProfile,
    SummedUtilThreshold,
)
from kubecell.core.model import Request
from tests.core.support import engine, gpus_of, make_nodes, whole


def busy(name: str, util: float) -> SoloProfile:
    return SoloProfile(JobKey(name), util, util / 2, 2000.0)


def share(name: str, milli: int = 300, profile: SoloProfile | None = None) -> JobSpec:
    return JobSpec(name=name, vc="a", member=Request(name, gpu_count=1, gpu_milli=milli, gpu_memory_mib=2000,
                                                     profile=profile))


def run(rule: AdmissionRule | None, *specs: JobSpec, gpus: int = 2) -> Engine:
    eng = engine(make_nodes(1, gpus=gpus), {"a": {"gpus": gpus}}, colocation=rule)
    for spec in specs:
        eng.submit(spec, 0)
    eng.schedule(1)
    return eng


def placed(eng: Engine) -> dict[str, tuple[int, int] | None]:
    out: dict[str, tuple[int, int] | None] = {}
    for job in eng.jobs.values():
        held = gpus_of(eng, job)
        out[job.name] = next(iter(held)) if job.phase == JobPhase.RUNNING else None
    return out


def test_without_a_rule_shares_pack_by_capacity() -> None:
    eng = run(None, share("x", profile=busy("x", 90)), share("y", profile=busy("y", 90)),
              share("z", profile=busy("z", 90)))
    assert len(set(placed(eng).values())) == 1, "three 300-milli shares fit one GPU: packed together"


def test_a_threshold_keeps_busy_sharers_apart_and_the_last_waits() -> None:
    eng = run(SummedUtilThreshold(100), share("x", profile=busy("x", 70)), share("y", profile=busy("y", 70)),
              share("z", profile=busy("z", 70)))
    where = placed(eng)
    running = [gpu for gpu in where.values() if gpu is not None]
    assert len(running) == 2
    assert len(set(running)) == 2, "70 % + 70 % is above 100 %: one per GPU"
    (waiting,) = [name for name, gpu in where.items() if gpu is None]
    assert eng.jobs[waiting].phase == JobPhase.PENDING


def test_light_sharers_pack_under_the_same_threshold() -> None:
    eng = run(SummedUtilThreshold(100), share("x", profile=busy("x", 20)), share("y", profile=busy("y", 30)),
              share("z", profile=busy("z", 40)))
    assert len(set(placed(eng).values())) == 1, "20 + 30 + 40 = 90 %: all on one GPU"


def test_no_sharing_gives_each_share_its_own_gpu() -> None:
    eng = run(NoSharing(), share("x"), share("y"), share("z"))
    where = placed(eng)
    assert sorted(gpu is None for gpu in where.values()) == [False, False, True]


def test_blind_sharing_packs_as_capacity_allows() -> None:
    eng = run(BlindSharing(), share("x", profile=busy("x", 95)), share("y", profile=busy("y", 95)))
    assert len(set(placed(eng).values())) == 1


def test_a_request_without_a_profile_is_judged_by_its_share() -> None:
    # 600 + 300 milli: 60 % + 30 % <= 100 % -> together; 600 + 600 would not fit capacity anyway, so use 500
    together = run(SummedUtilThreshold(100), share("x", 600), share("y", 300))
    assert len(set(placed(together).values())) == 1
    apart = run(SummedUtilThreshold(80), share("x", 600), share("y", 300))
    assert len({gpu for gpu in placed(apart).values() if gpu is not None}) == 2


def test_the_predictor_rule_admits_by_predicted_speed() -> None:
    rule = PredictedSlowdown(InterferencePredictor(), floor=0.8)
    # default model, two sharers: speed = 1 / (1 + u1 u2); 0.4 * 0.4 = 0.16 -> 0.86 ok; 0.7 * 0.7 -> 0.67 refused
    light = run(rule, share("x", profile=busy("x", 40)), share("y", profile=busy("y", 40)))
    assert len(set(placed(light).values())) == 1
    heavy = run(rule, share("x", profile=busy("x", 70)), share("y", profile=busy("y", 70)))
    assert len(set(placed(heavy).values())) == 2


def test_whole_gpu_jobs_are_not_affected() -> None:
    eng = run(NoSharing(), whole("w", "a", gpus=1), share("x"), gpus=2)
    assert all(gpu is not None for gpu in placed(eng).values())


@pytest.mark.parametrize("rule", [SummedUtilThreshold(100), NoSharing()])
def test_a_share_waits_until_a_gpu_where_the_rule_admits_it_frees(rule: AdmissionRule) -> None:
    eng = engine(make_nodes(1, gpus=1), {"a": {"gpus": 1}}, colocation=rule)
    eng.submit(share("x", profile=busy("x", 80)), 0)
    eng.submit(share("y", profile=busy("y", 80)), 0)
    eng.schedule(1)
    assert [job.phase for job in eng.jobs.values()] == [JobPhase.RUNNING, JobPhase.PENDING]
    eng.finish("x", 2)
    eng.schedule(3)
    assert eng.jobs["y"].phase == JobPhase.RUNNING


def test_a_pressure_adaptive_rule_shares_only_while_other_jobs_queue() -> None:
    rule = PressureAdaptive(NoSharing(), BlindSharing())
    alone = engine(make_nodes(1, gpus=1), {"a": {"gpus": 1}}, colocation=rule)
    alone.submit(share("x"), 0)
    alone.schedule(1)
    alone.submit(share("y"), 2)
    alone.schedule(3)
    assert alone.jobs["y"].phase == JobPhase.PENDING, "nothing else waits: y does not share, it waits"
    queued = engine(make_nodes(1, gpus=1), {"a": {"gpus": 1}}, colocation=rule)
    queued.submit(share("x"), 0)
    queued.schedule(1)
    queued.submit(share("y"), 2)
    queued.submit(share("z", milli=700), 2)
    queued.schedule(3)
    assert queued.jobs["y"].phase == JobPhase.RUNNING, "z waits too: y shares x's GPU"
