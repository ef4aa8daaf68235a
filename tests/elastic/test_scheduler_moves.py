"""kubecell's scheduler chooses the GPU model of an ElasticJob whose workers accept several, on the real testbed
(API server, fake kubelet, the ElasticJob controller in a thread): its gang is pinned to one model as it forms
(never workers on two models), a gang that waits is started on the model that has room, and a running job is
moved to the model where its step reports say it is much faster once GPUs are idle there: its workers are
evicted with a ``Move`` Event, the controller replaces them (not a counted restart), and the new gang runs on
the new model, also when the scheduler restarts meanwhile (the model is kept in the job's status). While the
moved job's workers end, what the move was given is held against the sizer's other jobs; where a pod the sizer
does not place takes it anyway, the job is started where there is room, with a ``Start`` Event."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest

from kubecell.core.model import make_node
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.kept_holds import HoldStore, KeptHold, decode
from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import Kube
from kubecell.kube.step_reports import build_step_report
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from tests.cluster_fixtures import RunningScheduler, fresh_namespace
from tests.elastic.support import STEP, RunningController, counted, create_job, get_job, template, workers
from tests.elastic.test_scheduler_sizing import job_events, running_workers
from tests.kube.test_virtualclusters import accepted, put
from tests.scheduler.deploy_support import ensure_namespace
from tests.scheduler.trust_support import create_pod, pod
from tests.support import registered_node, wait_for

A100_NODE, V100_NODE = "a100-moves", "v100-moves"
POOL = {"kubecell.io/test-pool": "moves"}


def node(name: str, model: str) -> dict[str, Any]:
    return node_manifest(make_node(name, cpu_milli=64_000, memory_mib=524_288, gpu_count=8, gpu_model=model,
                                   labels=POOL))


def on_node(kube: Kube, namespace: str, name: str) -> set[str]:
    return {p["spec"].get("nodeName", "") for p in workers(kube, namespace, name).values()}


def report(kube: Kube, namespace: str, name: str, *, step_seconds: float) -> None:
    """What each running worker's StepReporter writes (the same global batch of 64 on every placement)."""
    found = workers(kube, namespace, name)
    for worker in found.values():
        text = build_step_report(time=time.time(), replicas=len(found), nodes=1, local_batch=64 // len(found),
                                 accumulation_steps=1, step_seconds=step_seconds, sync_seconds=step_seconds / 10,
                                 grad_sqr=0.8, grad_var=12.0, steps=20)
        kube.patch(f"/api/v1/namespaces/{namespace}/pods/{worker['metadata']['name']}",
                   {"metadata": {"annotations": {ANNOTATION_STEP_REPORT: text}}})


def test_a_job_is_pinned_started_where_there_is_room_and_moved_where_it_is_faster(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, controller: RunningController,
        start_scheduler: type[RunningScheduler]) -> None:
    with registered_node(kube, node(A100_NODE, "A100")), registered_node(kube, node(V100_NODE, "V100M32")):
        running = taught_both_models(testbed, kube, namespace, start_scheduler, controller)
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/claim", gracePeriodSeconds=0)
        moved = wait_for("a Move Event on the job", lambda: job_events(kube, namespace, "bert", "Move"), 2 * STEP)
        assert "V100M32 -> A100" in moved[0], moved
        assert counted(running.scheduler.recorder.elastic_moves) == len(moved), "each move is on /metrics"
        assert get_job(kube, namespace, "bert")["status"]["gpuModel"] == "A100", "kept where a restart finds it"
        # The scheduler restarts while the move is under way (or just done): the new one carries it on from the
        # pods' records and the job's status (the GPU model, the goodput model).
        running.close()
        running = start_scheduler(testbed, SchedulerOptions(resize_interval_seconds=1.0))
        wait_for("its workers to run on the A100s again",
                 lambda: running_workers(kube, namespace, "bert", len(workers(kube, namespace, "bert")))
                 and on_node(kube, namespace, "bert") == {A100_NODE}, 2 * STEP)
        status = get_job(kube, namespace, "bert").get("status") or {}
        assert status.get("phase") not in ("Failed", "Invalid"), status
        assert int(status.get("restarts", 0)) == 0, "a move (workers evicted, replaced) is not a counted restart"
        assert_one_model_per_gang(running, namespace)


def taught_both_models(testbed: ControlPlaneState, kube: Kube, namespace: str,
                       start_scheduler: type[RunningScheduler],
                       controller: RunningController | None = None) -> RunningScheduler:
    """A scheduler, and ``bert`` (speech, accepting either model) just before its move: pinned to the idle A100s
    (the V100s are blocked) it learned them, was taken off them by vision's guaranteed ``claim`` (8 A100s), was
    started on the V100s where there is room and learned them too. Without ``controller`` (one that keeps
    running), none runs when this returns: nobody makes workers until the test starts one."""
    put(kube, "vision", cells={"A100x8/node": 1})  # owns the A100 node, lends it while idle
    put(kube, "speech", cells={"V100M32x8/node": 1})
    scheduler = start_scheduler(testbed, SchedulerOptions(resize_interval_seconds=1.0))
    for name in ("vision", "speech"):
        wait_for(f"{name} accepted", partial(accepted, kube, name))
    create_pod(kube, namespace, "blocker", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "speech"},
               spec={"nodeSelector": {"kubernetes.io/hostname": V100_NODE}})
    wait_for("the blocker to run", lambda: pod(kube, namespace, "blocker")["status"].get("phase") == "Running",
             STEP)
    own = RunningController(testbed.admin_kubeconfig, namespace) if controller is None else None
    try:
        worker = template("kubecell", annotations={"kubecell.io/vc": "speech"}, limits={"nvidia.com/gpu": "2"})
        worker["spec"]["nodeSelector"] = POOL  # either node: the job accepts A100 and V100
        create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=4, replicas=2, template=worker)
        wait_for("the job to run on the idle A100s", lambda: running_workers(kube, namespace, "bert", 4)
                 and on_node(kube, namespace, "bert") == {A100_NODE}, 2 * STEP)
        report(kube, namespace, "bert", step_seconds=0.2)
        ref = ElasticRef(namespace, "bert", get_job(kube, namespace, "bert")["metadata"]["uid"])
        learned = partial(_learned, scheduler, ref)
        wait_for("its goodput model to learn the A100 reports", lambda: learned() == {"A100"}, STEP)
        create_pod(kube, namespace, "claim", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "vision"},
                   spec={"nodeSelector": {"kubernetes.io/hostname": A100_NODE}})
        wait_for("vision's pod to take its A100s back",
                 lambda: pod(kube, namespace, "claim")["status"].get("phase") == "Running", 2 * STEP)
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/blocker", gracePeriodSeconds=0)
        wait_for("the gang to start on the V100s", lambda: running_workers(
            kube, namespace, "bert", len(workers(kube, namespace, "bert")))
            and on_node(kube, namespace, "bert") == {V100_NODE}, 2 * STEP)
        report(kube, namespace, "bert", step_seconds=1.6)  # 8x slower per step than on the A100s
        wait_for("its model to learn the V100 reports", lambda: learned() == {"A100", "V100M32"}, STEP)
        started = wait_for("the Start Event of the start on the V100s",
                           lambda: job_events(kube, namespace, "bert", "Start"), STEP)
        assert len(started) == 1, started
        assert "waiting on A100, started on V100M32" in started[0], started
    finally:
        if own is not None:
            own.close()
    return scheduler


def assert_one_model_per_gang(scheduler: RunningScheduler, namespace: str) -> None:
    engine = scheduler.scheduler.state.engine if scheduler.scheduler.state is not None else None
    assert engine is not None
    gangs = [job for name, job in engine.jobs.items() if name.startswith(f"{namespace}/bert#")]
    assert all(job.spec.member.gpu_models in (frozenset({"A100"}), frozenset({"V100M32"})) for job in gangs), \
        "every gang of the job accepted one model: never workers on two"


def test_a_move_whose_idle_gpus_are_taken_before_its_gang_forms_is_started_where_there_is_room(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, elastic_crd: None,
        start_scheduler: type[RunningScheduler]) -> None:
    """The race a move runs on a busy cluster: it counts on GPUs that are idle when it is decided, but its
    replacement workers are made only once the old ones have ended, and meanwhile a pod the sizer does not place
    may take those GPUs. The moved job must not be stranded on the model it was pinned to: it starts again where
    there is room (here the GPUs its own old gang freed), without a counted restart and never on two models at
    once. To make the race certain, no controller runs while the move is decided and the rival is bound."""
    with registered_node(kube, node(A100_NODE, "A100")), registered_node(kube, node(V100_NODE, "V100M32")):
        scheduler = taught_both_models(testbed, kube, namespace, start_scheduler)
        before = job_events(kube, namespace, "bert", "Start")
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/claim", gracePeriodSeconds=0)
        moved = wait_for("a Move Event on the job", lambda: job_events(kube, namespace, "bert", "Move"), 2 * STEP)
        assert "V100M32 -> A100" in moved[0], moved
        create_pod(kube, namespace, "rival", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "speech"},
                   spec={"nodeSelector": {"kubernetes.io/hostname": A100_NODE}})
        wait_for("the rival to take the A100s",
                 lambda: pod(kube, namespace, "rival")["status"].get("phase") == "Running", 2 * STEP)
        wait_for("the moved job's old workers to be gone", lambda: not workers(kube, namespace, "bert"), STEP)

        controller = RunningController(testbed.admin_kubeconfig, namespace)
        try:
            wait_for("the replacements to run on the V100s its old gang freed, not to wait for the A100s",
                     lambda: running_workers(kube, namespace, "bert", len(workers(kube, namespace, "bert")))
                     and on_node(kube, namespace, "bert") == {V100_NODE}, 2 * STEP)
            assert pod(kube, namespace, "rival")["spec"]["nodeName"] == A100_NODE, "the rival kept what it took"
            started = wait_for("a Start Event saying why it runs elsewhere than the move said", lambda: (
                found if len(found := job_events(kube, namespace, "bert", "Start")) > len(before) else None), STEP)
            assert all("waiting on A100, started on V100M32: started" in message for message in started), started
            starts = scheduler.scheduler.recorder.elastic_starts
            assert counted(starts, after="move") == 1, "the lost race is on /metrics"
            assert counted(starts, after="wait") == 1, "the start on the V100s while the claim held the A100s"
            status = get_job(kube, namespace, "bert").get("status") or {}
            assert status.get("phase") not in ("Failed", "Invalid"), status
            assert int(status.get("restarts", 0)) == 0, "a move that lost its race is not a counted restart"
            assert get_job(kube, namespace, "bert")["status"]["gpuModel"] == "V100M32", \
                "the model it runs on now is the one kept for a restarted scheduler"
            assert_one_model_per_gang(scheduler, namespace)
        finally:
            controller.close()


@pytest.mark.parametrize("restart", [False, True], ids=["one-scheduler", "restarted-while-workers-end"])
def test_what_a_move_counted_on_is_not_given_to_another_job_while_its_workers_end(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, elastic_crd: None,
        start_scheduler: type[RunningScheduler], restart: bool) -> None:
    """The same window, against kubecell's own sizer: while the moved job's workers end, the GPUs it was given
    look idle to the engine, and an elastic job of the same VC that may grow there would be raised into them at
    the sizer's next pass (its pods are made at once; the moved job's only after its workers end), and the moved
    job would find no room where it was sent. The sizer holds what it gave until the job runs there, and keeps
    the hold in the job's status: a scheduler restarted in the window (or a standby taking over) holds it too."""
    ensure_namespace(kube, SchedulerOptions().tenants_namespace)  # the scheduler's own, where it keeps holds
    with registered_node(kube, node(A100_NODE, "A100")), registered_node(kube, node(V100_NODE, "V100M32")), \
            fresh_namespace(kube) as elsewhere:
        scheduler = taught_both_models(testbed, kube, namespace, start_scheduler)
        create_pod(kube, namespace, "small", {"nvidia.com/gpu": "2"}, annotations={"kubecell.io/vc": "speech"},
                   spec={"nodeSelector": {"kubernetes.io/hostname": A100_NODE}})  # waits behind the claim
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/claim", gracePeriodSeconds=0)
        moved = wait_for("a Move Event on the job", lambda: job_events(kube, namespace, "bert", "Move"), 2 * STEP)
        assert "V100M32 -> A100, 4 -> 3 workers" in moved[0], "the 6 A100s left beside the small pod"
        hold = kept_hold(kube, namespace)
        assert hold is not None
        assert (hold.kind, hold.gpu_model, hold.replicas, hold.member_gpus) == ("move", "A100", 3, 2), hold
        if restart:
            scheduler.close()
            scheduler = start_scheduler(testbed, SchedulerOptions(resize_interval_seconds=1.0))
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/small", gracePeriodSeconds=0)

        # Another job of speech, A100s only, with a controller that makes its workers at once.
        others = RunningController(testbed.admin_kubeconfig, elsewhere)
        controller: RunningController | None = None
        try:
            worker = template("kubecell", annotations={"kubecell.io/vc": "speech"}, limits={"nvidia.com/gpu": "2"})
            worker["spec"]["nodeSelector"] = {"kubernetes.io/hostname": A100_NODE}
            create_job(kube, elsewhere, "gpt", minReplicas=1, maxReplicas=4, replicas=1, template=worker)
            wait_for("gpt's first worker to run in the 2 A100s the small pod left", lambda: any(
                p["status"].get("phase") == "Running" for p in workers(kube, elsewhere, "gpt").values()), 2 * STEP)
            time.sleep(5)  # five of the sizer's passes: it may take only what nobody was given
            assert get_job(kube, elsewhere, "gpt")["spec"]["replicas"] == 1, job_events(kube, elsewhere, "gpt",
                                                                                         "Resize")
            controller = RunningController(testbed.admin_kubeconfig, namespace)
            wait_for("the moved job's replacements to run on the A100s it was given",
                     lambda: running_workers(kube, namespace, "bert", 3)
                     and on_node(kube, namespace, "bert") == {A100_NODE}, 2 * STEP)
            assert not job_events(kube, namespace, "bert", "Start")[1:], "started where the move sent it"
            assert counted(scheduler.scheduler.recorder.elastic_starts, after="move") == 0
            assert running_workers(kube, elsewhere, "gpt", 1), "gpt kept its worker"
            assert_one_model_per_gang(scheduler, namespace)
            wait_for("the hold taken out once it runs there", lambda: kept_hold(kube, namespace) is None, STEP)
        finally:
            others.close()
            if controller is not None:
                controller.close()


def kept_hold(kube: Kube, namespace: str, name: str = "bert") -> KeptHold | None:
    """What the scheduler's ConfigMap keeps of the job's hold."""
    store = HoldStore(kube, SchedulerOptions().tenants_namespace)
    key = f"{namespace}.{name}"
    return decode(key, store.read().get(key))


def _learned(running: RunningScheduler, ref: ElasticRef) -> frozenset[str]:
    """The GPU models the scheduler's goodput model of the job has reports from."""
    sized = running.scheduler.elastic.jobs.get(ref)
    return frozenset(sized.model.gpu_types) if sized is not None and sized.model is not None else frozenset()
