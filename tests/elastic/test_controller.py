"""The ElasticJob controller on the real testbed: the CRD installed for real, the controller in a thread, the
stock kube-scheduler (or kubecell's) binding the workers and the fake kubelet running them.

A job min 1 max 4 replicas 2 gets its rendezvous Service and host and two workers with the torchrun
contract; /scale to 3 adds index 2, /scale to 1 deletes indices 2 and 1 and keeps 0; a deleted worker 0
comes back with its index; status and /scale read back; an invalid spec gets its condition and Event and
nothing else; workers that all exit 0 make the job Succeeded; failures are replaced until maxRestarts.
Every wait is bounded."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kubecell.kube import elasticjobs as ej
from kubecell.kube.names import ANNOTATION_DURATION, ANNOTATION_GROUP_SIZE
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.elastic.support import (
    DEPLOY,
    STEP,
    RunningController,
    all_pods,
    condition,
    counted,
    create_job,
    events,
    get_job,
    phase_is,
    scale,
    service,
    status,
    template,
    workers,
)
from tests.scheduler.deploy_support import ensure_namespace, kubectl, service_account_kubeconfig
from tests.support import wait_for


def reasons(kube: Kube, namespace: str, name: str) -> list[str]:
    return [reason for _, reason, _ in events(kube, namespace, name)]


def test_an_elastic_job_follows_its_scale_subresource(kube: Kube, namespace: str,
                                                      controller: RunningController) -> None:
    job = create_job(kube, namespace, "bert", minReplicas=1, maxReplicas=4, replicas=2)
    uid = job["metadata"]["uid"]

    # Service + rendezvous host + 2 workers with the contract
    found = wait_for("two workers", lambda: (w := workers(kube, namespace, "bert")) and len(w) == 2 and w, STEP)
    assert sorted(found) == [0, 1]
    rendezvous = wait_for("the rendezvous Service", partial(service, kube, namespace, "bert"), STEP)
    assert rendezvous["spec"]["selector"] == {ej.LABEL_JOB: "bert", ej.LABEL_ROLE: ej.ROLE_RENDEZVOUS}
    assert rendezvous["spec"]["ports"][0]["port"] == 29400
    assert rendezvous["metadata"]["ownerReferences"][0]["uid"] == uid
    host = wait_for("the rendezvous host", lambda: [p for p in all_pods(kube, namespace)
                                                    if p["metadata"]["name"] == "bert-rdzv"], STEP)[0]
    assert host["metadata"]["labels"][ej.LABEL_ROLE] == ej.ROLE_RENDEZVOUS
    pod = found[0]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PET_NNODES"] == "1:4"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == "bert-rdzv:29400"
    assert env["PET_RDZV_ID"] == f"{uid}-0"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["PET_MAX_RESTARTS"] == "3"
    assert env["KUBECELL_WORKER_INDEX"] == "0"
    assert pod["metadata"]["labels"][ej.LABEL_JOB] == "bert"
    assert pod["metadata"]["labels"][ej.LABEL_INDEX] == "0"
    assert pod["metadata"]["ownerReferences"] == [{"apiVersion": ej.API_VERSION, "kind": ej.KIND, "name": "bert",
                                                   "uid": uid, "controller": True, "blockOwnerDeletion": True}]
    assert pod["metadata"]["annotations"][ANNOTATION_GROUP_SIZE] == "2"

    # status and /scale read back
    running = wait_for("the job Running with 2 Ready", partial(phase_is, kube, namespace, "bert", "Running", 2), STEP)
    assert (running["replicas"], running["targetReplicas"], running["restarts"]) == (2, 2, 0)
    assert running["selector"] == ej.worker_selector("bert")
    assert running["observedGeneration"] == get_job(kube, namespace, "bert")["metadata"]["generation"]
    assert running["lastResizeTime"]
    assert condition(get_job(kube, namespace, "bert"), "Accepted")["status"] == "True"  # type: ignore[index]
    available = condition(get_job(kube, namespace, "bert"), "Available")
    assert available is not None
    assert (available["status"], available["reason"]) == ("True", "Running")
    scale_view = kube.get(f"{ej.job_path(namespace, 'bert')}/scale")
    assert scale_view["spec"]["replicas"] == 2
    assert scale_view["status"] == {"replicas": 2, "selector": ej.worker_selector("bert")}
    wait_for("the Created Event", lambda: "Created" in reasons(kube, namespace, "bert"), STEP)
    # /scale to 3: a third worker, index 2
    first = {index: p["metadata"]["uid"] for index, p in workers(kube, namespace, "bert").items()}
    scale(kube, namespace, "bert", 3)
    wait_for("the job Running with 3 Ready", partial(phase_is, kube, namespace, "bert", "Running", 3), STEP)
    now = workers(kube, namespace, "bert")
    assert sorted(now) == [0, 1, 2]
    assert {i: now[i]["metadata"]["uid"] for i in (0, 1)} == first, "growing disturbs no worker"
    assert all(p["metadata"]["annotations"][ANNOTATION_GROUP_SIZE] == "3" for p in now.values())
    assert kube.get(f"{ej.job_path(namespace, 'bert')}/scale")["status"]["replicas"] == 3
    wait_for("the Resizing Event", lambda: "Resizing" in reasons(kube, namespace, "bert"), STEP)
    # /scale to 1: indices 2 and 1 deleted, 0 kept
    scale(kube, namespace, "bert", 1)
    wait_for("only worker 0 left", lambda: sorted(workers(kube, namespace, "bert")) == [0], STEP)
    wait_for("the job Running with 1 Ready", partial(phase_is, kube, namespace, "bert", "Running", 1), STEP)
    assert workers(kube, namespace, "bert")[0]["metadata"]["uid"] == first[0]
    assert status(kube, namespace, "bert")["targetReplicas"] == 1
    resizes = [message for _, reason, message in events(kube, namespace, "bert") if reason == "Resizing"]
    assert "2 -> 3 workers" in resizes
    assert "3 -> 1 workers" in resizes

    # worker 0 deleted: recreated with the same index, not counted as a restart
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/bert-worker-0", gracePeriodSeconds=0)
    wait_for("worker 0 recreated", lambda: (w := workers(kube, namespace, "bert")) and 0 in w
             and w[0]["metadata"]["uid"] != first[0], STEP)
    wait_for("the job Running again", partial(phase_is, kube, namespace, "bert", "Running", 1), STEP)
    assert status(kube, namespace, "bert")["restarts"] == 0
    wait_for("the WorkerLost Event", lambda: "WorkerLost" in reasons(kube, namespace, "bert"), STEP)
    assert workers(kube, namespace, "bert")[0]["metadata"]["annotations"][ANNOTATION_GROUP_SIZE] == "1"


def test_min_above_max_is_invalid_and_touches_nothing(kube: Kube, namespace: str,
                                                      controller: RunningController) -> None:
    create_job(kube, namespace, "broken", minReplicas=5, maxReplicas=2)
    create_job(kube, namespace, "fine", minReplicas=1, maxReplicas=2, replicas=1)
    invalid = wait_for("the job Invalid", partial(phase_is, kube, namespace, "broken", "Invalid"), STEP)
    accepted = condition(get_job(kube, namespace, "broken"), "Accepted")
    assert accepted is not None
    assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
    assert "spec.minReplicas" in accepted["message"]
    assert "above maxReplicas 2" in accepted["message"]
    assert invalid["replicas"] == 0
    wait_for("the InvalidSpec Event", lambda: "InvalidSpec" in reasons(kube, namespace, "broken"), STEP)
    wait_for("the valid job beside it Running", partial(phase_is, kube, namespace, "fine", "Running", 1), STEP)
    assert not workers(kube, namespace, "broken")
    assert service(kube, namespace, "broken") is None
    assert not [p for p in all_pods(kube, namespace) if p["metadata"]["labels"].get(ej.LABEL_JOB) == "broken"]
    assert reasons(kube, namespace, "broken").count("InvalidSpec") == 1  # told once, not at every resync


def test_a_job_the_quota_refuses_makes_one_refused_create_per_pass_and_the_rest_in_bursts(
        kube: Kube, namespace: str, controller: RunningController, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job of many workers is made in bursts, and once the API refuses one (quota, admission) none more that
    pass: a job of 4,096 workers under a quota made a create and an Event per worker in one reconcile, and no
    other ElasticJob was reconciled meanwhile."""
    monkeypatch.setattr("kubecell.elastic.controller.MAX_CREATES_PER_PASS", 2)
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods", "namespace": namespace},
             "spec": {"hard": {"pods": "4"}}}  # the rendezvous host and three workers
    kube.create(f"/api/v1/namespaces/{namespace}/resourcequotas", quota)
    wait_for("the quota counted", lambda: kube.get(
        f"/api/v1/namespaces/{namespace}/resourcequotas/pods").get("status", {}).get("hard"), STEP)
    create_job(kube, namespace, "wide", minReplicas=1, maxReplicas=64, replicas=64)
    wait_for("the four pods the quota allows, made two at a time", lambda: len(all_pods(kube, namespace)) == 4,
             2 * STEP)
    refused = wait_for("a FailedCreate Event", lambda: [m for _, r, m in events(kube, namespace, "wide")
                                                        if r == "FailedCreate"], STEP)
    writes = controller.controller.metrics.pod_writes
    before = counted(writes, verb="create", outcome="refused")
    time.sleep(3)  # three resyncs
    after = counted(writes, verb="create", outcome="refused")
    assert after - before <= 8, f"one refused create per pass, not one per missing worker: {after - before}"
    assert len([r for _, r, _ in events(kube, namespace, "wide") if r == "FailedCreate"]) == len(refused) == 1, \
        "told once"
    assert "exceeded quota" in refused[0]


def test_absent_replicas_are_defaulted_to_min_through_scale(kube: Kube, namespace: str,
                                                            controller: RunningController) -> None:
    create_job(kube, namespace, "gpt", minReplicas=2, maxReplicas=3)
    wait_for("spec.replicas defaulted", lambda: get_job(kube, namespace, "gpt")["spec"].get("replicas") == 2, STEP)
    wait_for("two Ready workers", partial(phase_is, kube, namespace, "gpt", "Running", 2), STEP)
    assert kube.get(f"{ej.job_path(namespace, 'gpt')}/scale")["spec"]["replicas"] == 2


def test_the_api_server_refuses_a_scale_outside_the_bounds(kube: Kube, namespace: str, elastic_crd: None) -> None:
    create_job(kube, namespace, "bounded", minReplicas=2, maxReplicas=4, replicas=2)
    for wrong in (5, 1):
        with pytest.raises(ApiError) as refused:
            scale(kube, namespace, "bounded", wrong)
        assert refused.value.status == 422
        assert "minReplicas..maxReplicas" in refused.value.api_message
    with pytest.raises(ApiError) as refused:
        create_job(kube, namespace, "too-big", minReplicas=1, maxReplicas=5000)
    assert refused.value.status == 422
    assert get_job(kube, namespace, "bounded")["spec"]["replicas"] == 2


def test_workers_that_all_exit_0_make_the_job_succeed(kube: Kube, namespace: str,
                                                      controller: RunningController) -> None:
    # the fake kubelet ends a pod with exit 0 after kubecell.io/duration-seconds
    create_job(kube, namespace, "done", minReplicas=1, maxReplicas=2, replicas=2,
               template=template(annotations={ANNOTATION_DURATION: "3"}))
    wait_for("the rendezvous Service", partial(service, kube, namespace, "done"), STEP)
    succeeded = wait_for("the job Succeeded", partial(phase_is, kube, namespace, "done", "Succeeded"), STEP)
    assert succeeded["restarts"] == 0
    wait_for("the rendezvous Service deleted", lambda: service(kube, namespace, "done") is None, STEP)
    left = workers(kube, namespace, "done")
    assert sorted(left) == [0, 1], "finished workers are left alone"
    assert all(p["status"]["phase"] == "Succeeded" for p in left.values())
    # the status is written first, the Event after it
    wait_for("the Succeeded Event", lambda: "Succeeded" in reasons(kube, namespace, "done"), STEP)
    wait_for("the rendezvous host deleted", lambda: not [p for p in all_pods(kube, namespace)
                                                         if p["metadata"]["name"] == "done-rdzv"], STEP)


def fail(kube: Kube, namespace: str, name: str) -> None:
    """What a kubelet writes when torchrun exits non-zero in a ``restartPolicy: Never`` pod."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
    kube.patch(path, {"status": {"phase": "Failed", "reason": "Error",
                                 "conditions": [{"type": "Ready", "status": "False"}]}}, kind="strategic")


def crash_loop(kube: Kube, namespace: str, name: str) -> None:
    """What a kubelet writes for a container it keeps restarting (``restartPolicy: OnFailure``)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
    kube.patch(path, {"status": {"conditions": [{"type": "Ready", "status": "False"}],
                                 "containerStatuses": [{"name": "trainer", "image": "pytorch/pytorch:2.5.1",
                                                        "imageID": "", "ready": False, "restartCount": 5,
                                                        "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
               kind="strategic")


def replaced(kube: Kube, namespace: str, name: str, index: int, before: str) -> bool:
    found = workers(kube, namespace, name)
    return index in found and found[index]["metadata"]["uid"] != before


def uid_of(kube: Kube, namespace: str, name: str, index: int) -> str:
    return str(workers(kube, namespace, name)[index]["metadata"]["uid"])


def run_of(pod: dict[str, Any]) -> tuple[str, str]:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    return pod["metadata"]["labels"][ej.LABEL_RUN], str(env["PET_RDZV_ID"])


def all_in_run(kube: Kube, namespace: str, name: str, run: int, count: int) -> bool:
    found = workers(kube, namespace, name)
    return len(found) == count and all(p["metadata"]["labels"].get(ej.LABEL_RUN) == str(run) for p in found.values())


def test_a_failed_worker_restarts_the_job_in_a_new_run_until_max_restarts(kube: Kube, namespace: str,
                                                                         controller: RunningController) -> None:
    job = create_job(kube, namespace, "flaky", minReplicas=1, maxReplicas=2, replicas=2, maxRestarts=2)
    uid = job["metadata"]["uid"]
    wait_for("the job Running", partial(phase_is, kube, namespace, "flaky", "Running", 2), STEP)
    assert {run_of(p) for p in workers(kube, namespace, "flaky").values()} == {("0", f"{uid}-0")}

    # torchrun gave up in worker 1 (its run is closed): every worker restarts in run 1
    fail(kube, namespace, "flaky-worker-1")
    wait_for("both workers in run 1", partial(all_in_run, kube, namespace, "flaky", 1, 2), STEP)
    again = wait_for("the job Running again", partial(phase_is, kube, namespace, "flaky", "Running", 2), STEP)
    assert again["restarts"] == 1
    assert {run_of(p) for p in workers(kube, namespace, "flaky").values()} == {("1", f"{uid}-1")}
    wait_for("the WorkerFailed Event", lambda: "WorkerFailed" in reasons(kube, namespace, "flaky"), STEP)
    assert "WorkerLost" not in reasons(kube, namespace, "flaky"), "its own replacements are no loss"

    crash_loop(kube, namespace, "flaky-worker-0")
    wait_for("both workers in run 2", partial(all_in_run, kube, namespace, "flaky", 2, 2), STEP)
    again = wait_for("the job Running again", partial(phase_is, kube, namespace, "flaky", "Running", 2), STEP)
    assert again["restarts"] == 2
    wait_for("the CrashLoop Event", lambda: "CrashLoop" in reasons(kube, namespace, "flaky"), STEP)
    fail(kube, namespace, "flaky-worker-0")
    failed = wait_for("the job Failed", partial(phase_is, kube, namespace, "flaky", "Failed"), STEP)
    assert failed["restarts"] == 2
    available = condition(get_job(kube, namespace, "flaky"), "Available")
    assert available is not None
    assert available["reason"] == "MaxRestartsExceeded"
    wait_for("the MaxRestartsExceeded Event", lambda: "MaxRestartsExceeded" in reasons(kube, namespace, "flaky"), STEP)
    wait_for("the running worker stopped", lambda: list(workers(kube, namespace, "flaky")) == [0], STEP)
    assert workers(kube, namespace, "flaky")[0]["status"]["phase"] == "Failed", "the failed one is kept for its logs"
    wait_for("the rendezvous Service deleted", lambda: service(kube, namespace, "flaky") is None, STEP)


def test_an_evicted_worker_is_replaced_in_the_same_run(kube: Kube, namespace: str,
                                                      controller: RunningController) -> None:
    create_job(kube, namespace, "evicted", minReplicas=1, maxReplicas=2, replicas=2)
    wait_for("the job Running", partial(phase_is, kube, namespace, "evicted", "Running", 2), STEP)
    before = {i: uid_of(kube, namespace, "evicted", i) for i in (0, 1)}
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/evicted-worker-0/status",
               {"status": {"phase": "Failed", "reason": "Evicted",
                           "conditions": [{"type": "DisruptionTarget", "status": "True",
                                           "reason": "PreemptionByScheduler"}]}}, kind="strategic")
    wait_for("worker 0 replaced", partial(replaced, kube, namespace, "evicted", 0, before[0]), STEP)
    again = wait_for("the job Running again", partial(phase_is, kube, namespace, "evicted", "Running", 2), STEP)
    assert again["restarts"] == 0, "the cluster's doing is not the job's failure"
    assert uid_of(kube, namespace, "evicted", 1) == before[1], "the other worker is left alone"
    assert all_in_run(kube, namespace, "evicted", 0, 2)
    wait_for("the WorkerLost Event", lambda: "WorkerLost" in reasons(kube, namespace, "evicted"), STEP)
def test_a_changed_template_replaces_every_worker_in_the_same_run(kube: Kube, namespace: str,
                                                                   controller: RunningController) -> None:
    """A new image (or command) must never meet the old one in one torchrun world: the workers made from the
    old template are replaced, with their grace period, in the same run, and it is not counted as a restart."""
    create_job(kube, namespace, "rollout", minReplicas=1, maxReplicas=2, replicas=2)
    wait_for("the job Running", partial(phase_is, kube, namespace, "rollout", "Running", 2), STEP)
    before = {i: uid_of(kube, namespace, "rollout", i) for i in (0, 1)}
    old_digest = workers(kube, namespace, "rollout")[0]["metadata"]["labels"][ej.LABEL_TEMPLATE]
    changed = template()
    changed["spec"]["containers"][0]["image"] = "pytorch/pytorch:2.9.1"
    kube.patch(ej.job_path(namespace, "rollout"), {"spec": {"template": changed}}, kind="merge")

    def renewed() -> dict[int, dict[str, Any]] | None:
        found = workers(kube, namespace, "rollout")
        fresh = len(found) == 2 and all(found[i]["metadata"]["uid"] != before[i] for i in (0, 1))
        return found if fresh else None

    found = wait_for("both workers made again", renewed, STEP)
    assert {p["spec"]["containers"][0]["image"] for p in found.values()} == {"pytorch/pytorch:2.9.1"}
    assert len({p["metadata"]["labels"][ej.LABEL_TEMPLATE] for p in found.values()} | {old_digest}) == 2
    again = wait_for("the job Running again", partial(phase_is, kube, namespace, "rollout", "Running", 2), STEP)
    assert again["restarts"] == 0, "a new template is not a failure"
    assert all_in_run(kube, namespace, "rollout", 0, 2)
    changes = [message for _, reason, message in events(kube, namespace, "rollout") if reason == "TemplateChanged"]
    assert len(changes) == 1
    assert "workers 0, 1" in changes[0]
    # a change outside the template (the target) replaces nobody
    kept = {i: uid_of(kube, namespace, "rollout", i) for i in (0, 1)}
    scale(kube, namespace, "rollout", 1)
    wait_for("shrunk to 1", partial(phase_is, kube, namespace, "rollout", "Running", 1), STEP)
    assert uid_of(kube, namespace, "rollout", 0) == kept[0]


def test_a_rendezvous_that_does_not_complete_restarts_the_workers(kube: Kube, namespace: str,
                                                                  controller: RunningController) -> None:
    create_job(kube, namespace, "stuck", minReplicas=1, maxReplicas=1, replicas=1, rendezvousTimeoutSeconds=10)
    wait_for("the job Running", partial(phase_is, kube, namespace, "stuck", "Running", 1), STEP)
    before = uid_of(kube, namespace, "stuck", 0)
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/stuck-worker-0/status",
               {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, kind="strategic")
    unavailable = wait_for("the job unavailable", lambda: (c := condition(get_job(kube, namespace, "stuck"),
                                                                            "Available")) and c["status"] == "False"
                           and c, STEP)
    assert unavailable["reason"] == "WorkersNotReady"
    wait_for("worker 0 restarted", partial(replaced, kube, namespace, "stuck", 0, before), STEP)
    again = wait_for("the job Running again", partial(phase_is, kube, namespace, "stuck", "Running", 1), STEP)
    assert again["restarts"] == 1
    timeouts = [message for _, reason, message in events(kube, namespace, "stuck") if reason == "RendezvousTimeout"]
    assert len(timeouts) == 1
    assert "0 of 1 required workers Ready" in timeouts[0]


def test_kubecells_scheduler_places_the_workers_as_one_gang(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                            controller: RunningController,
                                                            start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    create_job(kube, namespace, "gang", minReplicas=2, maxReplicas=4, replicas=3,
               template=template("kubecell", limits={"nvidia.com/gpu": "1"}))
    # the scheduler places the three as one gang, then takes idle GPUs for the job up to its maximum
    wait_for("four Ready workers", partial(phase_is, kube, namespace, "gang", "Running", 4), 2 * STEP)
    assert get_job(kube, namespace, "gang")["spec"]["replicas"] == 4, "the scheduler raised the target"
    placed = workers(kube, namespace, "gang")
    assert all(p["spec"]["nodeName"] and p["metadata"]["annotations"].get("kubecell.io/allocation")
               for p in placed.values()), "bound by kubecell, with its allocation records"
    host = next(p for p in all_pods(kube, namespace) if p["metadata"]["name"] == "gang-rdzv")
    assert host["spec"]["nodeName"], "the rendezvous host (no GPU, no gang) is placed too"


def test_the_shipped_rbac_is_enough_to_run_a_job(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                 elastic_crd: None, tmp_path: Path) -> None:
    ensure_namespace(kube)
    kubectl(testbed, "apply", "-f", str(DEPLOY / "rbac.yaml"))
    try:
        config = service_account_kubeconfig(testbed, kube, tmp_path / "sa.kubeconfig", "kubecell-elastic-controller")
        running = RunningController(config, namespace)
        try:
            create_job(kube, namespace, "least", minReplicas=1, maxReplicas=3)
            wait_for("the job Running", partial(phase_is, kube, namespace, "least", "Running", 1), STEP)
            scale(kube, namespace, "least", 2)
            wait_for("the job grown", partial(phase_is, kube, namespace, "least", "Running", 2), STEP)
            scale(kube, namespace, "least", 1)
            wait_for("the job shrunk", lambda: sorted(workers(kube, namespace, "least")) == [0], STEP)
            wait_for("the Resizing Event", lambda: "Resizing" in reasons(kube, namespace, "least"), STEP)
            assert not running.controller.stop.is_set()
        finally:
            running.close()
        denied = Kube.from_kubeconfig(config)
        try:
            attempts = [partial(denied.get, "/api/v1/namespaces/kube-system/secrets"),
                        partial(denied.get, "/api/v1/nodes"),
                        partial(denied.patch, ej.job_path(namespace, "least"), {"spec": {"maxReplicas": 4}}),
                        partial(denied.create, f"/api/v1/namespaces/{namespace}/pods/least-worker-0/eviction",
                                {"apiVersion": "policy/v1", "kind": "Eviction",
                                 "metadata": {"name": "least-worker-0", "namespace": namespace}})]
            for attempt in attempts:
                with pytest.raises(ApiError) as refused:
                    attempt()
                assert refused.value.status == 403, attempt
        finally:
            denied.close()
    finally:
        kubectl(testbed, "delete", "-f", str(DEPLOY / "rbac.yaml"), "--ignore-not-found")
