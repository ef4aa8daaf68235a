"""kubecell's scheduler sizes an ElasticJob on the real testbed (API server, fake kubelet, the ElasticJob
controller in a thread): it places the workers as one elastic gang, raises the job's ``/scale`` target into
idle GPUs it borrows, lowers it when a guaranteed pod of the VC that owns those GPUs claims them (the
members it grew last are evicted, the others run on, and the controller does not recreate what the shrink
took), a forged step report on a worker gets a Warning Event and changes nothing, and the reports workers write
feed the job's goodput model, which is kept in the job's status and taken up by a restarted scheduler."""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kubecell.core.model import make_node
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.kept_holds import HoldStore
from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.step_reports import REASONS, build_step_report
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from tests.cluster_fixtures import RunningScheduler
from tests.elastic.support import STEP, RunningController, counted, create_job, get_job, template, workers
from tests.kube.test_virtualclusters import accepted, put
from tests.scheduler.deploy_support import BASE, DEPLOY, ensure_namespace, kubectl, service_account_kubeconfig
from tests.scheduler.trust_support import create_pod, pod
from tests.support import registered_node, wait_for

NODE = "a100-sizing"
HERE = {"nodeSelector": {"kubernetes.io/hostname": NODE}}


def running_workers(kube: Kube, namespace: str, name: str, count: int) -> dict[int, dict[str, Any]] | None:
    found = workers(kube, namespace, name)
    running = {i: p for i, p in found.items() if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"}
    return running if len(running) == count and len(found) == count else None


def replicas(kube: Kube, namespace: str, name: str) -> int:
    return int(get_job(kube, namespace, name)["spec"]["replicas"])


def pod_events(kube: Kube, namespace: str, name: str) -> list[tuple[str, str, str]]:
    found = kube.get(f"/api/v1/namespaces/{namespace}/events",
                     fieldSelector=f"involvedObject.kind=Pod,involvedObject.name={name}")["items"]
    return [(e["type"], e["reason"], e["message"]) for e in found]


def annotate(kube: Kube, namespace: str, index: int, report: str | None) -> None:
    """Write (None: remove) the step report on worker ``index`` of ``bert``, as its StepReporter would."""
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/bert-worker-{index}",
               {"metadata": {"annotations": {ANNOTATION_STEP_REPORT: report}}})


def job_events(kube: Kube, namespace: str, name: str, reason: str) -> list[str]:
    found = kube.get(f"/api/v1/namespaces/{namespace}/events",
                     fieldSelector=f"involvedObject.kind=ElasticJob,involvedObject.name={name}")["items"]
    return [e["message"] for e in found if e["reason"] == reason]


def test_the_scheduler_grows_an_elastic_job_into_idle_gpus_and_shrinks_it_for_a_guarantee(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, controller: RunningController,
        start_scheduler: type[RunningScheduler]) -> None:
    manifest = node_manifest(make_node(NODE, cpu_milli=64_000, memory_mib=524_288, gpu_count=8, gpu_model="A100"))
    with registered_node(kube, manifest):
        put(kube, "vision", cells={"A100x8/node": 1})  # owns the A100 node, lends it while idle
        put(kube, "speech", cells={"P40x8/node": 1})
        running = start_scheduler(testbed, SchedulerOptions(resize_interval_seconds=1.0))
        for name in ("vision", "speech"):
            wait_for(f"{name} accepted", partial(accepted, kube, name))
        worker = template("kubecell", annotations={"kubecell.io/vc": "speech"}, limits={"nvidia.com/gpu": "2"})
        worker["spec"].update(HERE)
        create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=4, replicas=2, template=worker)

        grown = wait_for("the scheduler to raise the target to 4 and the workers to run",
                         lambda: replicas(kube, namespace, "bert") == 4
                         and running_workers(kube, namespace, "bert", 4), 2 * STEP)
        assert sorted(grown) == [0, 1, 2, 3]
        raised = job_events(kube, namespace, "bert", "Resize")
        assert raised, "the raise has an Event on the job"
        assert "2 -> 4" in raised[0], raised
        assert "no trusted step reports" in raised[0], raised

        forged = '{"v": 1, "time": 1, "replicas": 4, "nodes": 1, "localBatch": 8, "stepSeconds": NaN}'
        kube.patch(f"/api/v1/namespaces/{namespace}/pods/bert-worker-0",
                   {"metadata": {"annotations": {ANNOTATION_STEP_REPORT: forged}}})
        warned = wait_for("a Warning Event about the forged report",
                          lambda: [e for e in pod_events(kube, namespace, "bert-worker-0") if e[0] == "Warning"
                                   and "report" in e[2]], STEP)
        assert "ignored" in warned[0][2], warned

        ref = ElasticRef(namespace, "bert", get_job(kube, namespace, "bert")["metadata"]["uid"])
        for index in (1, 2):  # what each worker's StepReporter writes
            annotate(kube, namespace, index, build_step_report(
                time=time.time(), replicas=4, nodes=1, local_batch=16, accumulation_steps=1, step_seconds=0.5,
                sync_seconds=0.1, grad_sqr=0.8, grad_var=12.0, steps=20))
        model = wait_for("the job's goodput model to learn from the reports", lambda: (
            (sized := running.scheduler.elastic.jobs.get(ref)) is not None and sized.model is not None
            and sized.model.gpu_types == frozenset({"A100"}) and sized.model), STEP)
        assert model.goodput("A100", 1, 4) > 0, "it prices the placement it was told about"
        assert model.refused == 0, "the forged report never reached the model"
        saved = wait_for("the model kept in the job's status", lambda: (get_job(kube, namespace, "bert").get("status")
                                                                       or {}).get("goodputModel"), STEP)
        assert [(entry["gpuType"], row[:3]) for entry in saved["types"] for row in entry["shapes"]] == \
            [("A100", [1, 4, 16])], "what it learned, through the CRD's schema"

        create_pod(kube, namespace, "claim", {"nvidia.com/gpu": "4"}, annotations={"kubecell.io/vc": "vision"},
                   spec=HERE)
        wait_for("the guaranteed pod to run", lambda: pod(kube, namespace, "claim")["status"].get("phase") == "Running",
                 2 * STEP)
        kept = wait_for("the job shrunk to 2 workers, its target lowered",
                        lambda: replicas(kube, namespace, "bert") == 2 and running_workers(kube, namespace, "bert", 2),
                        2 * STEP)
        assert sorted(kept) == [0, 1], "the members grown last were taken; the first ones run on"
        lowered = job_events(kube, namespace, "bert", "Resize")
        assert any("4 -> 2" in message and "shrunk" in message for message in lowered), lowered
        recorder = running.scheduler.recorder
        assert counted(recorder.elastic_resizes, direction="grow") >= 1, "the raise is on /metrics"
        assert counted(recorder.elastic_resizes, direction="shrink") >= 1, "and the lowering"
        assert counted(recorder.step_reports, outcome="accepted") >= 2, "both workers' reports reached the model"
        refused = sum(counted(recorder.step_reports, outcome=reason) for reason in REASONS)
        assert refused >= 1, "the forged report is counted as refused"

        # A restarted scheduler takes the model up from the status at the first report it reads: it still knows
        # the 4-worker placement, which no pod reports any more.
        running.close()
        for index in (0, 1):
            annotate(kube, namespace, index, None)
        running = start_scheduler(testbed, SchedulerOptions(resize_interval_seconds=1.0))
        annotate(kube, namespace, 0, build_step_report(
            time=time.time(), replicas=2, nodes=1, local_batch=16, accumulation_steps=1, step_seconds=0.45,
            sync_seconds=0.05, grad_sqr=0.8, grad_var=12.0, steps=40))
        restored = wait_for("the restarted scheduler's model of the job", lambda: (
            (sized := running.scheduler.elastic.jobs.get(ref)) is not None and sized.model is not None
            and sized.model), STEP)
        assert {row[:3] for row in restored.measurements()["A100"]} == {(1, 4, 16), (1, 2, 16)}
        assert not job_events(kube, namespace, "bert", "GoodputModelDropped")


def test_a_maximum_no_cluster_could_hold_is_told_and_the_job_still_runs(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, controller: RunningController,
        start_scheduler: type[RunningScheduler]) -> None:
    manifest = node_manifest(make_node(NODE, cpu_milli=64_000, memory_mib=524_288, gpu_count=8, gpu_model="A100"))
    with registered_node(kube, manifest):
        put(kube, "vision", cells={"A100x8/node": 1})
        start_scheduler(testbed, SchedulerOptions(resize_interval_seconds=1.0))
        wait_for("vision accepted", partial(accepted, kube, "vision"))
        worker = template("kubecell", annotations={"kubecell.io/vc": "vision"}, limits={"nvidia.com/gpu": "8"})
        worker["spec"].update(HERE)
        create_job(kube, namespace, "huge", minReplicas=1, maxReplicas=4096, replicas=1, template=worker)
        wait_for("its one worker to run", lambda: running_workers(kube, namespace, "huge", 1), 2 * STEP)
        told = wait_for("a Warning about its maximum", lambda: job_events(kube, namespace, "huge",
                                                                          "MaxReplicasUnreachable"), STEP)
        assert "maxReplicas 4096" in told[0], told
        assert replicas(kube, namespace, "huge") == 1, "no room: the target stays"


def test_the_shipped_rbac_lets_the_scheduler_size_a_job(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, controller: RunningController,
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The scheduler's ServiceAccount bound by deploy/base and deploy/elastic only: it reads the ElasticJob and
    writes its ``/scale`` (a raise the controller follows), and may write nothing else of it; it keeps its
    holds in its own namespace."""
    manifest = node_manifest(make_node(NODE, cpu_milli=64_000, memory_mib=524_288, gpu_count=8, gpu_model="A100"))
    shipped = [BASE / "serviceaccount.yaml", BASE / "rbac.yaml", DEPLOY / "elastic" / "rbac.yaml"]
    ensure_namespace(kube)
    for path in shipped:
        kubectl(testbed, "apply", "-f", str(path))
    as_scheduler = Kube.from_kubeconfig(service_account_kubeconfig(testbed, kube, tmp_path / "sa.kubeconfig"))
    scheduler = Scheduler(as_scheduler, SchedulerOptions(resize_interval_seconds=1.0))
    thread = threading.Thread(target=scheduler.run, name="kubecell-scheduler-sa", daemon=True)
    try:
        with registered_node(kube, manifest):
            put(kube, "vision", cells={"A100x8/node": 1})
            thread.start()
            assert scheduler.ready.wait(60), "the scheduler did not complete a cycle as its ServiceAccount"
            wait_for("vision accepted", partial(accepted, kube, "vision"))
            worker = template("kubecell", annotations={"kubecell.io/vc": "vision"}, limits={"nvidia.com/gpu": "2"})
            worker["spec"].update(HERE)
            create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=4, replicas=2, template=worker)
            wait_for("the least-privileged scheduler to raise the target to 4 and the workers to run",
                     lambda: replicas(kube, namespace, "bert") == 4
                     and running_workers(kube, namespace, "bert", 4), 2 * STEP)
            assert job_events(kube, namespace, "bert", "Resize"), "the raise has an Event on the job"
            assert scheduler.elastic.holds_restored, "it may read the holds a previous scheduler kept"
            holds = HoldStore(as_scheduler, SchedulerOptions().tenants_namespace)
            wait_for("the raise's hold, kept while its pods were made, taken out since",
                     lambda: f"{namespace}.bert" not in holds.read(), STEP)
            assert "cannot keep the sizer's holds" not in caplog.text, "it may write them"
            with pytest.raises(ApiError) as refused:  # /scale is all it may write of an ElasticJob
                as_scheduler.patch(f"/apis/kubecell.io/v1alpha1/namespaces/{namespace}/elasticjobs/bert",
                                   {"spec": {"maxReplicas": 8}})
            assert refused.value.status == 403
    finally:
        scheduler.shutdown()
        if thread.is_alive():
            thread.join(timeout=15)
        as_scheduler.close()
        for path in reversed(shipped[1:]):
            kubectl(testbed, "delete", "-f", str(path), "--ignore-not-found")
