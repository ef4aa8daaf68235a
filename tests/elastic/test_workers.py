"""Worker Pods read into the states the state machine observes (a table), and which Pods count as a job's."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.elastic import workers as readers
from kubecell.elastic.states import Worker
from kubecell.kube import elasticjobs as ej


def pod(phase: str = "Pending", *, node: str = "", ready: bool = False, deleting: bool = False,
        waiting: str | None = None, disrupted: bool = False, name: str = "bert-worker-1", index: str = "1",
        owner: str = "job-uid") -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if disrupted:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"})
    statuses = [{"name": "trainer", "restartCount": 4, "state": {"waiting": {"reason": waiting}}}] if waiting else []
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": "p1",
                            "labels": {"kubecell.io/elastic-job": "bert", "kubecell.io/elastic-role": "worker",
                                       "kubecell.io/worker-index": index},
                            "ownerReferences": [{"kind": "ElasticJob", "uid": owner, "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "trainer", "env": [{"name": "X"}]}]},
            "status": {"phase": phase, "conditions": conditions, "containerStatuses": statuses}}


def evicted_by_the_kubelet() -> dict[str, Any]:
    """A node-pressure eviction: the kubelet takes first the pods using most above their requests (a script that
    leaks memory), so it is counted as the worker's failure, not replaced for ever."""
    body = pod("Failed", node="n1")
    body["status"]["reason"] = "Evicted"
    body["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                         "reason": "TerminationByKubelet"})
    return body


@pytest.mark.parametrize(("obj", "state"), [
    (pod(), Worker.UNSCHEDULED),
    (pod(node="n1"), Worker.SCHEDULED),
    (pod("Running", node="n1"), Worker.RUNNING),
    (pod("Running", node="n1", ready=True), Worker.READY),
    (pod("Running", node="n1", waiting="CrashLoopBackOff"), Worker.CRASH_LOOP),
    (pod("Running", node="n1", waiting="ContainerCreating"), Worker.RUNNING),
    (pod("Succeeded", node="n1"), Worker.SUCCEEDED),
    (pod("Failed", node="n1"), Worker.FAILED),
    (pod("Failed", node="n1", disrupted=True), Worker.DISRUPTED),
    (pod("Running", node="n1", ready=True, deleting=True), Worker.TERMINATING),
    (pod("Failed", node="n1", deleting=True), Worker.TERMINATING),
    (evicted_by_the_kubelet(), Worker.FAILED),
], ids=["unscheduled", "scheduled", "running", "ready", "crash loop", "creating", "succeeded", "failed",
        "disrupted", "terminating", "failed and deleted", "evicted under node pressure: counted"])
def test_a_worker_pods_state(obj: dict[str, Any], state: Worker) -> None:
    assert readers.worker_state(obj) is state
    assert readers.worker_state(readers.trimmed(obj)) is state  # what the watch keeps is enough


def initialising(reason: str, *, phase: str = "Pending", sidecar_ready: bool = False) -> dict[str, Any]:
    """A bound worker whose init container (``fetch``: downloads the dataset) is waiting for ``reason``."""
    body = pod(phase, node="n1", ready=sidecar_ready)
    body["status"]["initContainerStatuses"] = [{"name": "fetch", "restartCount": 6,
                                                "state": {"waiting": {"reason": reason}}}]
    body["status"]["containerStatuses"] = [{"name": "trainer", "restartCount": 0,
                                            "state": {"waiting": {"reason": "PodInitializing"}}}]
    return body


@pytest.mark.parametrize(("obj", "state"), [
    (initialising("CrashLoopBackOff"), Worker.CRASH_LOOP),
    (initialising("PodInitializing"), Worker.SCHEDULED),
    (initialising("CrashLoopBackOff", phase="Running", sidecar_ready=True), Worker.READY),
], ids=["init container crash loop", "init container starting", "a sidecar's restarts while the worker trains"])
def test_a_worker_whose_init_container_crash_loops_is_crash_looping(obj: dict[str, Any], state: Worker) -> None:
    """With ``restartPolicy: OnFailure`` the kubelet restarts a failing init container for ever and the Pod stays
    Pending: the worker was read as Scheduled, so the job sat Pending ("waiting for the scheduler") holding the
    GPUs it was bound to, with no CrashLoop condition, no Event and no restart counted. A native sidecar (an init
    container with ``restartPolicy: Always``) restarting while the worker trains is left to its readiness."""
    assert readers.worker_state(obj) is state
    assert readers.worker_state(readers.trimmed(obj)) is state  # what the watch keeps is enough


@pytest.mark.parametrize(("obj", "index"), [
    (pod(), 1),
    (pod(index="01"), None),              # the label must be the name's index
    (pod(index="x"), None),
    (pod(index="4096", name="bert-worker-4096"), None),
    (pod(name="other-worker-1"), None),
])
def test_a_worker_index_is_its_label_and_its_name(obj: dict[str, Any], index: int | None) -> None:
    assert ej.worker_index(obj, "bert") == index


def test_only_pods_the_job_controls_count() -> None:
    assert readers.controlled_by(pod(), "job-uid")
    assert not readers.controlled_by(pod(owner="an-older-job-of-the-same-name"), "job-uid")
    assert readers.job_key(pod()) == "team-a/bert"


def test_the_trimmed_pod_keeps_no_environment() -> None:
    kept = readers.trimmed(pod("Running", node="n1"))
    assert "containers" not in kept["spec"]
    assert kept["metadata"]["ownerReferences"]


@pytest.mark.parametrize("statuses", [[None], ["x"], [{"name": "t", "state": "x"}], [{"state": {"waiting": 3}}], "x"])
def test_a_malformed_container_status_is_trimmed_not_raised(statuses: Any) -> None:
    """Read defensively (the watch transform raised AttributeError on a status that is not an object)."""
    body = pod("Running", node="n1")
    body["status"]["containerStatuses"] = statuses
    kept = readers.trimmed(body)
    assert all(isinstance(entry, dict) for entry in kept["status"]["containerStatuses"])


@pytest.mark.parametrize(("text", "run"), [("0", 0), ("12", 12), ("012", None), ("-1", None), ("x", None),
                                           ("1" * 11, None)])
def test_a_workers_rendezvous_run_is_its_label(text: str, run: int | None) -> None:
    obj = pod()
    obj["metadata"]["labels"]["kubecell.io/rendezvous-run"] = text
    assert readers.worker_run(obj) == run
    assert readers.worker_run(pod()) is None


def test_a_workers_template_is_its_label_or_unknown() -> None:
    obj = pod()
    assert readers.worker_template(obj) is None, "made before workers named it: never judged outdated"
    obj["metadata"]["labels"]["kubecell.io/template-hash"] = "0123456789abcdef"
    assert readers.worker_template(obj) == readers.worker_template(readers.trimmed(obj)) == "0123456789abcdef"
    obj["metadata"]["labels"]["kubecell.io/template-hash"] = ""
    assert readers.worker_template(obj) is None


def test_times_are_read_or_none() -> None:
    assert readers.parse_time("2026-01-01T00:00:10Z") == readers.parse_time("2026-01-01T00:00:00Z") + 10  # type: ignore[operator]
    assert readers.parse_time("yesterday") is None
    assert readers.parse_time(5) is None


def test_a_pod_terminating_long_past_its_grace_period_is_overdue() -> None:
    """deletionTimestamp is when the grace period ends; a Pod still there well after it has a kubelet that is not
    answering (its node lost), and only a deletion at once frees its name for a replacement."""
    deleting = pod("Running", node="n1", deleting=True)  # deletionTimestamp 2026-01-01T00:00:00Z
    end = readers.parse_time("2026-01-01T00:00:00Z")
    assert end is not None
    assert not readers.overdue(deleting, end + 299, 300)
    assert readers.overdue(deleting, end + 301, 300)
    assert not readers.overdue(pod("Running", node="n1"), end + 10_000, 300), "not being deleted"
    broken = pod("Running", node="n1")
    broken["metadata"]["deletionTimestamp"] = "not a time"
    assert not readers.overdue(broken, end + 10_000, 300)
