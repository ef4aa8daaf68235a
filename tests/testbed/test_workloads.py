"""What users submit, run end to end under kubecell on the testbed: workload controllers create the pods
(kube-controller-manager), kubecell places them, the process kubelet runs their commands as real programs.

Each test registers a node of its own served by a process kubelet of its own, and pins its pods there with a
``nodeSelector``; every wait is bounded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kubecell.kube import pods
from kubecell.kube.names import ANNOTATION_OPPORTUNISTIC, RESOURCE_GPU, SCHEDULER_NAME
from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.process_kubelet import container_log
from tests.cluster_fixtures import RunningScheduler
from tests.support import wait_for
from tests.testbed.process_support import IMAGE, TEST_NODE, WAIT, process_node, python

JOB_WAIT = 120.0
"""Seconds for a Job's pods to be created, placed, run and counted (five python starts on a busy 2-core
machine, and the Job controller's own pace)."""

REPORT_GPUS = python("import json, os; print(json.dumps({k: os.environ.get(k) for k in ("
                     "'CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES', 'KUBECELL_GPU_MILLI')}), flush=True)")
"""A command that prints the GPU variables its container was given."""


@pytest.fixture
def scheduler(testbed: ControlPlaneState) -> Iterator[RunningScheduler]:
    running = RunningScheduler(testbed)
    try:
        yield running
    finally:
        running.close()


def jobs(namespace: str) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/jobs"


def job_pods(kube: Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    return list(kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"job-name={job}")["items"])


def condition(job: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in (job.get("status") or {}).get("conditions") or [])


def completed(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    job = kube.get(f"{jobs(namespace)}/{name}")
    assert not condition(job, "Failed"), job.get("status")
    return job if condition(job, "Complete") else None


def test_the_kubeshare_seed_job_runs_to_completion_with_every_pod_on_its_share(
        testbed: ControlPlaneState, kube: Kube, namespace: str, scheduler: RunningScheduler) -> None:
    """The KubeShare seed's own example (``lstm-g``: 5 completions, parallelism 5, half a GPU each, a gang of 5
    with threshold 0.2), asking for kubecell instead of ``kubeshare-scheduler``; the training program is a
    real process that runs for a second."""
    with process_node(testbed, kube, gpus=4, prefix="kubeshare") as (node, _):
        template = {
            "metadata": {"name": "lstm-o", "labels": {
                "sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_limit": "1.0", "sharedgpu/group_name": "a",
                "sharedgpu/group_headcount": "5", "sharedgpu/group_threshold": "0.2", "sharedgpu/priority": "100"}},
            "spec": {"schedulerName": SCHEDULER_NAME, "restartPolicy": "Never", "nodeSelector": {TEST_NODE: node},
                     "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "pytorch", "image": IMAGE,
                                     "command": python("import time; time.sleep(1); print('epoch done')")}]}}
        kube.create(jobs(namespace), {"apiVersion": "batch/v1", "kind": "Job",
                                      "metadata": {"name": "lstm-g", "labels": {"app": "lstm-g"}},
                                      "spec": {"completions": 5, "parallelism": 5, "template": template}})
        job = wait_for("the KubeShare Job to complete", lambda: completed(kube, namespace, "lstm-g"), JOB_WAIT)

        assert job["status"]["succeeded"] == 5
        finished = [pod for pod in job_pods(kube, namespace, "lstm-g") if pod["status"].get("phase") == "Succeeded"]
        assert len(finished) == 5
        taken: dict[str, int] = {}
        for pod in finished:
            assert pod["spec"]["nodeName"] == node
            record = pods.record_of(pod)
            assert record is not None, pod["metadata"]["name"]
            assert [gpu.milli for gpu in record.gpus] == [500]  # half a GPU, as sharedgpu/gpu_request says
            for gpu in record.gpus:
                taken[gpu.uuid] = taken.get(gpu.uuid, 0) + gpu.milli
            log = container_log(testbed.directory, namespace, pod["metadata"]["name"], "pytorch")
            assert "epoch done" in log
        assert all(milli <= 1000 for milli in taken.values()), taken


def test_a_job_pod_evicted_by_preemption_is_recreated_and_placed_again(
        testbed: ControlPlaneState, kube: Kube, namespace: str, scheduler: RunningScheduler) -> None:
    """An opportunistic Job holds the node's one GPU; a regular pod needing it makes kubecell evict the Job's
    pod (through the Eviction API); the Job controller creates a new pod, which kubecell places again once
    the regular pod has finished."""
    with process_node(testbed, kube, gpus=1, prefix="preempt") as (node, _):
        spec = {"schedulerName": SCHEDULER_NAME, "nodeSelector": {TEST_NODE: node}, "terminationGracePeriodSeconds": 2,
                "restartPolicy": "Never"}
        worker = {"name": "worker", "image": IMAGE, "resources": {"limits": {RESOURCE_GPU: "1"}},
                  "command": python("import time; time.sleep(600)")}
        kube.create(jobs(namespace), {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "scavenger"},
            "spec": {"completions": 1, "parallelism": 1, "backoffLimit": 6, "template": {
                "metadata": {"annotations": {ANNOTATION_OPPORTUNISTIC: "true"}},
                "spec": {**spec, "containers": [worker]}}}})

        def running_pods() -> list[dict[str, Any]] | None:
            found = [pod for pod in job_pods(kube, namespace, "scavenger")
                     if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")]
            return found or None

        (first,) = wait_for("the Job's pod running", running_pods, WAIT)
        assert first["spec"]["nodeName"] == node

        kube.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "urgent"},
            "spec": {**spec, "containers": [{"name": "main", "image": IMAGE, "command": REPORT_GPUS,
                                             "resources": {"limits": {RESOURCE_GPU: "1"}}}]}})

        def urgent_done() -> dict[str, Any] | None:
            pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/urgent")
            return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

        urgent = wait_for("the regular pod to run in the Job pod's place", urgent_done, WAIT)
        assert urgent["status"]["phase"] == "Succeeded", urgent["status"]
        assert urgent["spec"]["nodeName"] == node
        seen = json.loads(container_log(testbed.directory, namespace, "urgent", "main"))
        record = pods.record_of(urgent)
        assert record is not None
        assert seen["CUDA_VISIBLE_DEVICES"] == seen["NVIDIA_VISIBLE_DEVICES"] == record.gpus[0].uuid

        def replaced() -> dict[str, Any] | None:
            found = running_pods() or []
            fresh = [pod for pod in found if pod["metadata"]["uid"] != first["metadata"]["uid"]]
            return fresh[0] if fresh else None

        second = wait_for("the Job's new pod placed and running", replaced, WAIT)
        assert second["spec"]["nodeName"] == node
        assert pods.record_of(second) is not None
        events = kube.get(f"/api/v1/namespaces/{namespace}/events",
                          fieldSelector=f"involvedObject.uid={first['metadata']['uid']}")["items"]
        assert any("preempt" in (event.get("reason", "") + event.get("message", "")).lower() for event in events), \
            [(event.get("reason"), event.get("message")) for event in events]
        job = kube.get(f"{jobs(namespace)}/scavenger")
        assert (job["status"].get("failed") or 0) >= 1  # the evicted pod counts against backoffLimit
