"""The scheduler's ElasticJob sizer decides from the engine and the pods, without a cluster: it raises the
target into what ``Engine.queries.headroom`` offers (all of it before any report, as far as goodput pays once the job
reports), waits while pods it asked for are being made or bound, gives a raise back when its pods wait past the
grace period, and lowers the target of a job the engine shrank. Writes are recorded, not sent."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import Job
from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError
from kubecell.kube.step_reports import build_step_report
from kubecell.scheduler.elastic import ElasticSizer
from kubecell.scheduler.elastic_sized import Sized
from kubecell.scheduler.observe.recorder import Recorder
from tests.core.support import engine, make_nodes
from tests.scheduler.elastic_sizer_support import (
    OWNER,
    RecordingSizer,
    hold,
    running_job,
    worker,
)
from tests.scheduler.test_shrink_pods import Loop
from tests.scheduler.trust_support import pod_body


def test_it_raises_into_idle_gpus_waits_for_the_pods_and_follows_a_shrink() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), RecordingSizer()
    hold(loop, "b-own", "b", 8)  # b's guarantee is in use: the elastic job borrows
    loop.cycle(0)
    loop.add(worker(0), worker(1))
    loop.cycle(1)
    job = running_job(loop)
    assert loop.state.tracked[job.name].elastic is not None, "its pods' controller is an ElasticJob"
    assert (job.size, job.spec.members) == (2, 4), "started with the pods it has; may grow to its maximum"

    sizer.grow(loop.state, loop.mirror, 2)
    assert sizer.written[-1][0] == 4
    assert "no trusted step reports" in sizer.written[-1][1]
    sizer.grow(loop.state, loop.mirror, 3)
    assert len(sizer.written) == 1, "raised: it waits for its controller to make the pods"

    loop.add(worker(2, size=4), worker(3, size=4))  # the controller follows
    assert loop.state.tracked[job.name].live_pods() == 4
    sizer.grow(loop.state, loop.mirror, 4)
    assert len(sizer.written) == 1, "pods wait to be bound: the engine grows into them first"
    loop.cycle(5)
    assert job.size == 4

    hold(loop, "claim", "a", 8)
    hold(loop, "claim-2", "a", 8)  # a's two nodes: one is free, the other the job borrowed
    result = eng.schedule(100)
    assert [cut.job for cut in result.shrunk] == [job]
    sizer.shrunk(loop.state, [cut.job for cut in result.shrunk])
    assert sizer.written[-1][0] == job.size == 2
    assert "shrunk by kubecell" in sizer.written[-1][1]


def test_a_raise_whose_pods_wait_past_the_grace_period_is_given_back() -> None:
    eng = engine(make_nodes(3), {"a": {"gpus": 8}, "b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), RecordingSizer()
    hold(loop, "b-own", "b", 8)
    loop.cycle(0)
    loop.add(worker(0), worker(1))
    loop.cycle(1)
    job = running_job(loop)
    sizer.grow(loop.state, loop.mirror, 2)
    assert sizer.written[-1][0] == 4, "two more members fit the idle GPUs"
    hold(loop, "a-own", "a", 8)
    loop.cycle(3)  # a's guarantee takes the idle node first
    loop.add(worker(2, size=4), worker(3, size=4))
    loop.cycle(4)
    assert job.size == 2, "no room left for the new pods"
    sizer.grow(loop.state, loop.mirror, 30)
    assert len(sizer.written) == 1
    sizer.grow(loop.state, loop.mirror, 100)
    assert sizer.written[-1][0] == 2
    assert "waited 60 s" in sizer.written[-1][1]


def test_reports_feed_the_model_and_a_forged_one_is_told_once() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), RecordingSizer()
    sizer.recorder = Recorder()
    loop.add(worker(0), worker(1))
    loop.cycle(1)
    job = running_job(loop)
    good = build_step_report(time=time.time(), replicas=2, nodes=1, local_batch=32, accumulation_steps=1,
                             step_seconds=0.4, sync_seconds=0.05, grad_sqr=1.0, grad_var=50.0, steps=10)
    for index, text in ((0, good), (1, '{"v": 1, "stepSeconds": -1}')):
        uid = f"uid-{index}"
        body = copy.deepcopy(loop.mirror.pods[uid])
        body["metadata"]["annotations"][ANNOTATION_STEP_REPORT] = text
        loop.mirror.pods[uid] = body
    sizer.grow(loop.state, loop.mirror, time.time())
    sizer.grow(loop.state, loop.mirror, time.time())
    tracked = loop.state.tracked[job.name]
    assert tracked.elastic is not None
    model = sizer.jobs[tracked.elastic].model
    assert model is not None
    assert model.gpu_types == frozenset({"V100M32"})
    assert (model.initial_bsz, model.max_bsz) == (64, 1024), "the job's stated batch range, for Pollux's batch"
    assert [reason for reason, _ in sizer.events] == ["MalformedReport"], "told once, for the forged pod only"
    reports = {sample.labels["outcome"]: sample.value for metric in sizer.recorder.step_reports.collect()
               for sample in metric.samples if sample.name.endswith("_total")}
    assert reports == {"accepted": 1, "MalformedReport": 1}, "each report counted once, by outcome"


def test_headroom_is_asked_again_only_when_the_cluster_or_the_job_changed_or_after_the_refresh() -> None:
    eng = engine(make_nodes(3), {"a": {"gpus": 8}, "b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), RecordingSizer()
    asked: list[float] = []
    real = eng.queries.headroom

    def counted(name: str, now: float) -> int:
        asked.append(now)
        return real(name, now)

    eng.queries.headroom = counted  # type: ignore[method-assign]
    hold(loop, "a-own", "a", 8)
    hold(loop, "b-own", "b", 8)
    loop.cycle(0)
    loop.add(worker(0), worker(1))  # b's guarantee is in use: the job borrows the last node, and no more is idle
    loop.cycle(1)
    job = running_job(loop)
    assert job.size == 2
    sizer.grow(loop.state, loop.mirror, 2)
    sizer.grow(loop.state, loop.mirror, 3)
    sizer.grow(loop.state, loop.mirror, 10)
    assert asked == [2], "nothing changed: the first answer (no room) stands"
    assert sizer.written == []
    sizer.grow(loop.state, loop.mirror, 2 + sizer.headroom_refresh_seconds)
    assert asked == [2, 2 + sizer.headroom_refresh_seconds], "refreshed after the interval"

    loop.gone("uid-a-own")
    loop.cycle(40)  # a's pod ended: its GPUs are idle, and the book says so
    sizer.grow(loop.state, loop.mirror, 41)
    assert asked[-1] == 41
    assert sizer.written[-1][0] == 4, "the freed node is offered at once, not after the refresh"


@pytest.mark.parametrize(("sync_seconds", "grad_var", "restart", "grows"),
                         [(0.01, 500.0, None, True), (0.39, 0.01, None, False), (0.01, 500.0, 86400, False)])
def test_a_job_that_reports_is_sized_by_the_simulators_allocator(sync_seconds: float, grad_var: float,
                                                                  restart: int | None, grows: bool) -> None:
    """Once a job's reports give it a goodput model, how far it grows is the allocator's decision (the rule the
    simulator measures), with the allocator's reason on the Resize: a job whose step is mostly compute grows
    into the room; one whose step is almost all synchronisation, with a gradient too clean for a larger batch,
    keeps its members, and so does one whose ElasticJob says a restart costs a day (before any report, all
    would take the room)."""
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop = Loop(eng)
    sizer = RecordingSizer() if restart is None else RecordingSizer(restartSeconds=restart)
    hold(loop, "b-own", "b", 8)  # b's guarantee is in use: the elastic job borrows a's idle GPUs
    loop.cycle(0)
    loop.add(worker(0), worker(1))
    loop.cycle(1)
    job = running_job(loop)
    report = build_step_report(time=time.time(), replicas=2, nodes=1, local_batch=32, accumulation_steps=1,
                               step_seconds=0.4, sync_seconds=sync_seconds, grad_sqr=1.0, grad_var=grad_var,
                               steps=10)
    for uid in ("uid-0", "uid-1"):
        body = copy.deepcopy(loop.mirror.pods[uid])
        body["metadata"]["annotations"][ANNOTATION_STEP_REPORT] = report
        loop.mirror.pods[uid] = body
    sizer.grow(loop.state, loop.mirror, time.time())
    tracked = loop.state.tracked[job.name]
    assert tracked.elastic is not None
    assert sizer.jobs[tracked.elastic].model is not None
    reason = sizer.explain(tracked.elastic)
    if grows:
        assert sizer.written == [(4, reason)], sizer.written
        assert reason.startswith("grown 2->4"), reason
    else:
        assert sizer.written == [], sizer.written
        assert reason.startswith("kept 2"), reason


def teammate_worker(job: str, index: int, size: int) -> dict[str, Any]:
    """A worker of ElasticJob ``job`` (1-GPU members, minimum 1, maximum 8) in VC b."""
    gang = {"kubecell.io/vc": "b", "kubecell.io/group": job, "kubecell.io/group-size": str(size),
            "kubecell.io/group-min": "1", "kubecell.io/group-max": "8"}
    owner = {**OWNER, "name": job, "uid": f"{job}-uid"}
    body = pod_body("ns", f"{job}-worker-{index}", {"nvidia.com/gpu": "1"}, annotations=gang)
    body["metadata"].update(uid=f"{job}-{index}", creationTimestamp="1970-01-01T00:00:00Z", ownerReferences=[owner])
    body["status"] = {"phase": "Pending"}
    return body


class TeamSizer(RecordingSizer):
    """Records writes per job; every ElasticJob reads as 1..8 workers with a 300 s grace period."""

    def __init__(self) -> None:
        super().__init__()
        self.by_job: list[tuple[str, int, str]] = []

    def _get(self, ref: Any) -> dict[str, Any]:
        return {"metadata": {"name": ref.name, "namespace": "ns", "uid": ref.uid},
                "spec": {"minReplicas": 1, "maxReplicas": 8, "replicas": 1, "terminationGracePeriodSeconds": 300,
                         "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}}

    def _write(self, sized: Sized, target: int, reason: str) -> bool:
        self.by_job.append((sized.ref.name, target, reason))
        return super()._write(sized, target, reason)


def report_on(loop: Loop, job: str, members: int, now: float) -> None:
    text = build_step_report(time=now, replicas=members, nodes=1, local_batch=32, accumulation_steps=1,
                             step_seconds=0.4, sync_seconds=0.01, grad_sqr=1.0, grad_var=500.0, steps=10)
    for index in range(members):
        uid = f"{job}-{index}"
        body = copy.deepcopy(loop.mirror.pods[uid])
        body["metadata"]["annotations"][ANNOTATION_STEP_REPORT] = text
        loop.mirror.pods[uid] = body


def test_a_long_grown_job_gives_members_to_a_new_teammate_who_waits_out_their_grace() -> None:
    """Two ElasticJobs of one VC on one 8-GPU node: the one that has run an hour on 7 GPUs is lowered so that
    the one that just started grows (least attained service, as in the simulator). The growing job's pods wait
    for the lowered job's workers to end: past the sizer's 60 s grace, until that job's 300 s grace has run."""
    start = time.time() - 3600.0
    eng = engine(make_nodes(1), {"b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), TeamSizer()
    loop.add(*(teammate_worker("old", index, 7) for index in range(7)))
    loop.cycle(start)
    loop.add(teammate_worker("new", 0, 1))
    loop.cycle(start + 3500.0)
    running = {job.name: job.size for job in eng.running.values()}
    assert sorted(running.values()) == [1, 7], "the old job on 7 GPUs, the new one on the last idle GPU"
    now = start + 3600.0
    report_on(loop, "old", 7, now)
    report_on(loop, "new", 1, now)
    sizer.grow(loop.state, loop.mirror, now)
    lowered = [(target, reason) for job, target, reason in sizer.by_job if job == "old"]
    raised = [(target, reason) for job, target, reason in sizer.by_job if job == "new"]
    assert lowered, sizer.by_job
    assert raised, sizer.by_job
    assert lowered[0][0] < 7, lowered
    assert lowered[0][1].startswith("shrunk 7->"), lowered
    assert raised[0][0] - 1 == 7 - lowered[0][0], "it grows by exactly what the other gives"

    loop.add(*(teammate_worker("new", index, raised[0][0]) for index in range(1, raised[0][0])))
    sizer.grow(loop.state, loop.mirror, now + 1)  # its new pods wait: the other's workers are still ending
    sizer.grow(loop.state, loop.mirror, now + 100)
    assert [job for job, _, _ in sizer.by_job].count("new") == 1, "past 60 s it still waits for them"
    assert [job for job, _, _ in sizer.by_job].count("old") == 1, "nor is the lowered job sized again meanwhile"
    sizer.grow(loop.state, loop.mirror, now + 400)
    assert sizer.by_job[-1][:2] == ("new", 1), "after their 300 s grace it gives the raise back"


def test_workers_on_several_gpu_models_are_told_once_and_take_only_the_room() -> None:
    """A template that names no GPU model can land its workers on two models: the job is told once that it
    steps at its slowest GPU and cannot be priced, and it is not sized on goodput."""
    nodes = make_nodes(1, model="A100", prefix="a") + make_nodes(1, model="V100M32", prefix="v")
    eng = engine(nodes, {"b": {"cells": {"A100x8/node": 1, "V100M32x8/node": 1}}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), RecordingSizer()
    loop.add(*(worker(index, size=4) for index in range(4)))
    loop.cycle(1)
    job = running_job(loop)
    book = eng.book
    models = {book.model_names[book.model_id[book.index[a.node]]] for a in eng.queries.allocations_of(job.name)}
    assert models == {"A100", "V100M32"}, "four 4-GPU workers on two 8-GPU nodes of two models"
    sizer.grow(loop.state, loop.mirror, 2)
    sizer.grow(loop.state, loop.mirror, 3)
    assert [reason for reason, _ in sizer.events] == ["MixedGpuModels"]
    assert "A100, V100M32" in sizer.events[0][1]
    assert sizer.written == [], "at its maximum of 4: nothing to take"


def pinned_loop(sizer: RecordingSizer) -> tuple[Loop, Engine]:
    """Idle A100 and V100 nodes, and an ElasticJob of 2 workers that accept both, formed by the intake with the
    scheduler's pinning (``Scheduler`` wires it alike)."""
    nodes = make_nodes(1, model="A100", prefix="a") + make_nodes(1, model="V100M32", prefix="v")
    eng = engine(nodes, {"b": {"cells": {"A100x8/node": 1, "V100M32x8/node": 1}}}, resize_min_interval_seconds=0)
    loop = Loop(eng)
    loop.intake.pin = sizer.types.pin_model
    loop.add(*(worker(index, size=2) for index in range(2)))
    loop.cycle(1)
    return loop, eng


def models_run_on(eng: Engine, job: Job) -> set[str]:
    book = eng.book
    return {book.model_names[book.model_id[book.index[a.node]]] for a in eng.queries.allocations_of(job.name)}


def test_the_model_a_gang_is_pinned_to_is_kept_in_the_status_and_read_back_after_a_restart() -> None:
    first = RecordingSizer()
    loop, eng = pinned_loop(first)
    chosen = models_run_on(eng, running_job(loop))
    assert len(chosen) == 1, "the gang runs on one model"
    assert first.pins_written == list(chosen), "the pin is written once, as chosen"
    # An earlier scheduler had chosen the other model (a move under way, a start elsewhere): a new one forms
    # the job's gang there, and writes nothing, since the status already says so.
    (other,) = {"A100", "V100M32"} - chosen
    restarted = RecordingSizer()
    restarted.kept = other
    loop, eng = pinned_loop(restarted)
    assert models_run_on(eng, running_job(loop)) == {other}
    assert restarted.pins_written == []


@pytest.mark.parametrize("kept", ["H100", None])
def test_a_kept_model_the_pods_do_not_accept_is_ignored(kept: str | None) -> None:
    fresh, forged = RecordingSizer(), RecordingSizer()
    forged.kept = kept  # no node of that model here (or nothing kept): chosen afresh, as without it
    loop, eng = pinned_loop(fresh)
    expected = models_run_on(eng, running_job(loop))
    loop, eng = pinned_loop(forged)
    assert models_run_on(eng, running_job(loop)) == expected
    assert forged.pins_written == sorted(expected)


class RefusedKube:
    """An API server that refuses the sizer's writes as RBAC without deploy/elastic's rules does."""

    def __init__(self) -> None:
        self.patches = 0

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        self.patches += 1
        raise ApiError(403, "Forbidden", "cannot patch resource elasticjobs/scale", method="PATCH", path=path)


def test_a_refused_write_is_told_once_and_tried_again() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), RecordingSizer()
    refused = RefusedKube()
    sizer.kube = refused  # type: ignore[assignment]
    sizer._write = ElasticSizer._write.__get__(sizer)  # type: ignore[method-assign]  # the real write
    hold(loop, "b-own", "b", 8)  # as in the first test: the job borrows, and a raise is worth writing
    loop.cycle(0)
    loop.add(worker(0), worker(1))
    loop.cycle(1)
    for now in range(2, 12):
        sizer.grow(loop.state, loop.mirror, now)
    assert refused.patches == 10, "the raise is decided and tried again at every pass"
    assert [reason for reason, _ in sizer.events] == ["ResizeRefused"], "told once"
    assert "403 Forbidden" in sizer.events[0][1]
