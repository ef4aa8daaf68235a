"""On the real testbed, with the controller holding a token of its shipped ServiceAccount: whoever may patch
``elasticjobs/status`` writes ``phase: Succeeded`` on a running job, and the controller, which took that phase
for the job's end, removed its rendezvous. Now the claim is corrected with a Warning and nothing is stopped;
the job's real end (its worker exits 0) is recorded in ``kubecell-system/kubecell-elastic-finished`` (the
shipped rules allow it), and a new controller keeps the job Succeeded after its pod is gone and the status was
rewritten. The same attacks without an API server: ``test_hostile_finality.py``."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kubecell.elastic import finished
from kubecell.kube import elasticjobs as ej
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.elastic.support import DEPLOY, STEP, RunningController, create_job, events, phase_is, service, workers
from tests.scheduler.deploy_support import NAMESPACE, kubectl, service_account_kubeconfig
from tests.support import wait_for


def end(kube: Kube, namespace: str, name: str) -> None:
    """What a kubelet writes when torchrun exits 0 in a ``restartPolicy: Never`` pod."""
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
               {"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}},
               kind="strategic")


def recorded(kube: Kube, entry: str) -> dict[str, Any] | None:
    """The job's entry in the controller's record once it holds an end (it holds the counts from the start)."""
    name = finished.configmap_name(finished.shard_of(finished.job_key(entry)))
    text = kube.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{name}").get("data", {}).get(entry)
    found = json.loads(text) if text else None
    return found if isinstance(found, dict) and "phase" in found else None


def test_a_status_writer_cannot_end_a_job_and_a_real_end_outlives_its_pods(
        testbed: ControlPlaneState, kube: Kube, namespace: str, elastic_crd: None, tmp_path: Path) -> None:
    kubectl(testbed, "apply", "-f", str(DEPLOY / "rbac.yaml"))
    status = f"{ej.job_path(namespace, 'kept')}/status"
    try:
        config = service_account_kubeconfig(testbed, kube, tmp_path / "sa.kubeconfig", "kubecell-elastic-controller")
        running = RunningController(config, namespace)
        try:
            job = create_job(kube, namespace, "kept", minReplicas=1, maxReplicas=1, replicas=1)
            wait_for("the job Running", partial(phase_is, kube, namespace, "kept", "Running", 1), STEP)
            worker = workers(kube, namespace, "kept")[0]["metadata"]["uid"]
            kube.patch(status, {"status": {"phase": "Succeeded"}})  # a status writer's claim
            wait_for("the Warning", lambda: [m for kind, r, m in events(kube, namespace, "kept")
                                             if kind == "Warning" and r == "PhaseNotObserved"], STEP)
            wait_for("the status corrected", partial(phase_is, kube, namespace, "kept", "Running", 1), STEP)
            assert service(kube, namespace, "kept") is not None, "the rendezvous Service is kept"
            assert workers(kube, namespace, "kept")[0]["metadata"]["uid"] == worker, "its worker runs on"

            end(kube, namespace, "kept-worker-0")
            wait_for("the job Succeeded", partial(phase_is, kube, namespace, "kept", "Succeeded"), STEP)
            kept = wait_for("the end recorded", partial(recorded, kube, f"{namespace}.kept"), STEP)
            ended = kept.pop("ended")
            assert isinstance(ended, int), ended
            assert abs(ended - time.time()) < 120, "the end's time, on the controller's clock"
            assert kept == {"uid": job["metadata"]["uid"], "phase": "Succeeded", "restarts": 0, "target": 1}
        finally:
            running.close()
        # the pod garbage collector deletes the ended worker, a status writer says Running, a controller starts
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/kept-worker-0",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
        wait_for("the worker gone", lambda: not workers(kube, namespace, "kept"), STEP)
        kube.patch(status, {"status": {"phase": "Running"}})
        again = RunningController(config, namespace)
        try:
            wait_for("the job Succeeded again", partial(phase_is, kube, namespace, "kept", "Succeeded"), STEP)
            assert not workers(kube, namespace, "kept"), "no worker made again"
            assert "WorkerLost" not in [r for _, r, _ in events(kube, namespace, "kept")]
        finally:
            again.close()
    finally:
        kubectl(testbed, "delete", "-f", str(DEPLOY / "rbac.yaml"), "--ignore-not-found")


def test_a_finished_job_goes_its_ttl_after_its_end_under_the_shipped_rules(
        testbed: ControlPlaneState, kube: Kube, namespace: str, elastic_crd: None, tmp_path: Path) -> None:
    """``spec.ttlSecondsAfterFinished: 2``: the job is kept while it runs and deleted about 2 s after its worker
    exits 0, by the controller holding only its ServiceAccount's token (the rules grant delete on elasticjobs);
    its entry leaves the record with it. The CRD's schema refuses a negative time to live."""
    kubectl(testbed, "apply", "-f", str(DEPLOY / "rbac.yaml"))
    try:
        config = service_account_kubeconfig(testbed, kube, tmp_path / "sa.kubeconfig", "kubecell-elastic-controller")
        running = RunningController(config, namespace)
        try:
            with pytest.raises(ApiError) as refused:
                create_job(kube, namespace, "negative", minReplicas=1, maxReplicas=1, ttlSecondsAfterFinished=-1)
            assert refused.value.status == 422, refused.value
            assert "ttlSecondsAfterFinished" in str(refused.value), refused.value
            create_job(kube, namespace, "brief", minReplicas=1, maxReplicas=1, replicas=1, ttlSecondsAfterFinished=2)
            wait_for("the job Running", partial(phase_is, kube, namespace, "brief", "Running", 1), STEP)
            time.sleep(3)
            assert kube.get(ej.job_path(namespace, "brief")), "a running job is never due"
            end(kube, namespace, "brief-worker-0")
            wait_for("the job Succeeded", partial(phase_is, kube, namespace, "brief", "Succeeded"), STEP)
            ended = time.time()

            def gone() -> bool:
                try:
                    kube.get(ej.job_path(namespace, "brief"))
                except ApiError as error:
                    return error.not_found
                return False

            wait_for("the job deleted", gone, 20.0)
            assert time.time() - ended >= 1.0, "not before its time to live"
            wait_for("its entry out of the record",
                     lambda: f"{namespace}.brief" not in json.dumps(kube.get(
                         f"/api/v1/namespaces/{NAMESPACE}/configmaps/"
                         f"{finished.configmap_name(finished.shard_of(f'{namespace}/brief'))}").get("data", {})),
                     STEP)
        finally:
            running.close()
    finally:
        kubectl(testbed, "delete", "-f", str(DEPLOY / "rbac.yaml"), "--ignore-not-found")
