"""deploy/elastic/worker-admission.yaml in force on the testbed's real API server: a worker's ServiceAccount,
which RBAC lets patch every pod of its namespace, writes its own Pod's step report and nothing else; everyone
else's writes are untouched."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubecell.elastic.report import StepReporter
from kubecell.kube.names import ANNOTATION_GROUP_SIZE, ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.step_reports import ParsedReport, read_step_report
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.process_kubelet import container_log
from tests.elastic.support import DEPLOY
from tests.scheduler.deploy_support import kubectl, service_account_kubeconfig
from tests.support import refused, wait_for
from tests.testbed.process_support import IMAGE, WAIT, process_node, python

POLICY = DEPLOY / "worker-admission.yaml"
ACCOUNT = "kubecell-elastic-worker"
REPORT = json.dumps({"v": 1, "time": 0, "replicas": 2, "nodes": 1, "localBatch": 8, "accumulationSteps": 1,
                     "stepSeconds": 0.5, "syncSeconds": 0.1, "gradSqr": None, "gradVar": None, "steps": 1})


def pod(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kubecell.io/elastic-job": "train"},
                     "annotations": {ANNOTATION_GROUP_SIZE: "2"}},
        "spec": {"schedulerName": "nobody", "serviceAccountName": ACCOUNT,
                 "containers": [{"name": "trainer", "image": "pytorch/pytorch:2.5.1"}]}})


class Workers:
    """Two worker pods of the account, a client whose token is bound to the first (as the kubelet mounts it)
    and one whose token is bound to no pod."""

    def __init__(self, testbed: ControlPlaneState, kube: Kube, namespace: str, tmp_path: Path) -> None:
        self.namespace = namespace
        self.own = pod(kube, namespace, "train-worker-0")
        self.other = pod(kube, namespace, "train-worker-1")
        self.bound = Kube.from_kubeconfig(service_account_kubeconfig(
            testbed, kube, tmp_path / "bound.kubeconfig", ACCOUNT, namespace=namespace, bound_pod=self.own))
        self.unbound = Kube.from_kubeconfig(service_account_kubeconfig(
            testbed, kube, tmp_path / "unbound.kubeconfig", ACCOUNT, namespace=namespace))

    def path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{name}"

    def close(self) -> None:
        self.bound.close()
        self.unbound.close()


@pytest.fixture
def workers(testbed: ControlPlaneState, kube: Kube, namespace: str, tmp_path: Path) -> Iterator[Workers]:
    kubectl(testbed, "apply", "-n", namespace, "-f", str(DEPLOY / "worker-rbac.yaml"))
    kubectl(testbed, "apply", "-f", str(POLICY))
    made = Workers(testbed, kube, namespace, tmp_path)
    try:
        def in_force() -> bool:
            try:
                made.bound.patch(made.path("train-worker-1"), {"metadata": {"annotations": {"probe": "x"}}})
            except ApiError as error:
                return error.status == 403
            return False

        wait_for("the worker policy in force", in_force, 60)
        yield made
    finally:
        made.close()
        kubectl(testbed, "delete", "-f", str(POLICY), "--ignore-not-found")


def test_a_worker_writes_its_own_step_report(workers: Workers, kube: Kube, namespace: str) -> None:
    reporter = StepReporter(workers.bound, pod_name="train-worker-0", namespace=namespace, replicas=2, nodes=1,
                            interval_seconds=30.0)
    assert reporter.step(step_seconds=0.5, sync_seconds=0.1, local_batch=8), "the real reporter's write passes"
    written = read_step_report(kube.get(workers.path("train-worker-0")), gpu_type="V100", now=time.time())
    assert isinstance(written, ParsedReport)
    assert written.report.step_time == 0.5


def test_a_worker_cannot_write_another_pod(workers: Workers, kube: Kube) -> None:
    says = refused(workers.bound.patch, workers.path("train-worker-1"),
                   {"metadata": {"annotations": {ANNOTATION_STEP_REPORT: REPORT}}})
    assert "writes only the Pod its token is bound to" in says
    assert ANNOTATION_STEP_REPORT not in kube.get(workers.path("train-worker-1"))["metadata"]["annotations"]


@pytest.mark.parametrize(("change", "says"), [
    ({"metadata": {"annotations": {ANNOTATION_GROUP_SIZE: "64"}}}, "no annotation but kubecell.io/step-report"),
    ({"metadata": {"annotations": {ANNOTATION_GROUP_SIZE: None}}}, "no annotation but kubecell.io/step-report"),
    ({"metadata": {"annotations": {"kubecell.io/allocation": "{}"}}}, "no annotation but"),
    ({"metadata": {"labels": {"kubecell.io/elastic-job": "another"}}}, "no label"),
    ({"metadata": {"finalizers": ["example.com/hold"]}}, "no label, owner reference or finalizer"),
    ({"spec": {"activeDeadlineSeconds": 5}}, "nothing in its Pod's spec"),
])
def test_a_worker_changes_nothing_else_on_its_own_pod(workers: Workers, kube: Kube, change: dict[str, Any],
                                                      says: str) -> None:
    before = kube.get(workers.path("train-worker-0"))
    assert says in refused(workers.bound.patch, workers.path("train-worker-0"), change)
    after = kube.get(workers.path("train-worker-0"))
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "nothing was written"


def test_a_token_bound_to_no_pod_writes_nothing(workers: Workers) -> None:
    says = refused(workers.unbound.patch, workers.path("train-worker-0"),
                   {"metadata": {"annotations": {ANNOTATION_STEP_REPORT: REPORT}}})
    assert "writes only the Pod its token is bound to" in says


def test_other_writers_are_untouched(workers: Workers, kube: Kube) -> None:
    kube.patch(workers.path("train-worker-1"), {"metadata": {"labels": {"team": "vision"},
                                                             "annotations": {ANNOTATION_GROUP_SIZE: "3"}}})
    meta = kube.get(workers.path("train-worker-1"))["metadata"]
    assert (meta["labels"]["team"], meta["annotations"][ANNOTATION_GROUP_SIZE]) == ("vision", "3")


WORKER_PROGRAM = """
import os, sys
from kubecell.elastic.report import StepReporter
from kubecell.kube.rest import ApiError, Kube
reporter = StepReporter.from_environment()
print("enabled", reporter.enabled, flush=True)
print("wrote", reporter.step(step_seconds=0.5, sync_seconds=0.1, local_batch=8), flush=True)
kube = Kube.from_kubeconfig(os.environ["KUBECONFIG"])  # the kubeconfig the kubelet gave the pod
try:
    kube.patch(sys.argv[1], {"metadata": {"annotations": {"kubecell.io/step-report": "{}"}}})
    print("other pod: written", flush=True)
except ApiError as error:
    print("other pod:", error.status, flush=True)
"""


def test_a_worker_process_on_the_process_kubelet_reports_with_the_token_of_its_pod(
        workers: Workers, testbed: ControlPlaneState, kube: Kube, namespace: str) -> None:
    """The process kubelet gives a pod's processes a token of its ServiceAccount bound to the pod, as a kubelet
    projects it: the real reporter, run as the pod's program, writes its own pod's report under the policy, and
    the same program cannot write another pod."""
    with process_node(testbed, kube, prefix="report") as (node, _):
        env = [{"name": "KUBECELL_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
               {"name": "KUBECELL_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
        kube.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reporting", "namespace": namespace},
            "spec": {"nodeName": node, "restartPolicy": "Never", "serviceAccountName": ACCOUNT,
                     "containers": [{"name": "trainer", "image": IMAGE, "env": env,
                                     "command": python(WORKER_PROGRAM), "args": [workers.path("train-worker-1")]}]}})
        done = wait_for("the worker program to finish", lambda: (
            found if (found := kube.get(workers.path("reporting")))["status"].get("phase") in ("Succeeded", "Failed")
            else None), WAIT)
        log = container_log(testbed.directory, namespace, "reporting", "trainer")
        assert done["status"]["phase"] == "Succeeded", log
        assert "enabled True" in log, log
        assert "wrote True" in log, log
        assert "other pod: 403" in log, log
        written = read_step_report(kube.get(workers.path("reporting")), gpu_type="A100", now=time.time())
        assert isinstance(written, ParsedReport), written
        assert ANNOTATION_STEP_REPORT not in kube.get(workers.path("train-worker-1"))["metadata"]["annotations"]
