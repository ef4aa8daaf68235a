"""Which pods make one job: controller owner first, then the gang, else the pod alone; the job's outcome, start
and end from its pods; and pods users wrote badly still land in a job with the reason kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubecell.profiler.history import JobHistory, Outcome
from kubecell.profiler.jobs import group_pods
from kubecell.profiler.run import profile_jobs


def pod(name: str, *, namespace: str = "ns", owner: str | None = None, annotations: dict[str, str] | None = None,
        phase: str = "Pending", finished: str | None = None, gpus: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                            "creationTimestamp": "2026-11-01T10:00:00Z", "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": "Job", "name": owner, "uid": f"owner-{owner}", "controller": True},
                                   {"kind": "Other", "name": "x", "uid": "not-the-controller"}]
    status: dict[str, Any] = {"phase": phase, "startTime": "2026-11-01T10:01:00Z"}
    if finished:
        status["containerStatuses"] = [{"name": "c", "state": {"terminated": {"finishedAt": finished}}}]
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "img:1",
                                                       "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": status}


def test_pods_group_by_controller_then_gang_then_alone() -> None:
    gang = {"kubecell.io/group": "g", "kubecell.io/group-size": "2"}
    jobs = group_pods([pod("a-0", owner="a"), pod("a-1", owner="a"), pod("g-0", annotations=gang),
                       pod("g-1", annotations=gang), pod("solo"), pod("g-0", namespace="other", annotations=gang)])
    by_name = {(job.namespace, job.owner_name): job for job in jobs}
    assert by_name[("ns", "a")].uid == "owner-a"
    assert by_name[("ns", "a")].pod_names == ("a-0", "a-1")
    assert by_name[("ns", "g")].owner_kind == "Gang"
    assert by_name[("ns", "g")].pod_names == ("g-0", "g-1")
    assert by_name[("other", "g")].uid != by_name[("ns", "g")].uid, "a gang never spans namespaces"
    assert by_name[("ns", "solo")].uid == "uid-ns-solo"
    assert by_name[("ns", "a")].gpus_per_pod == 1


def test_outcome_and_end_come_from_every_pod() -> None:
    done = [pod("a-0", owner="a", phase="Succeeded", finished="2026-11-01T11:00:00Z"),
            pod("a-1", owner="a", phase="Succeeded", finished="2026-11-01T11:30:00Z")]
    (job,) = group_pods(done)
    assert job.outcome == Outcome.SUCCEEDED
    assert job.finished is not None
    assert job.finished.isoformat() == "2026-11-01T11:30:00+00:00"
    assert job.started is not None
    assert job.started.isoformat() == "2026-11-01T10:01:00+00:00"
    (failed,) = group_pods([done[0], pod("a-1", owner="a", phase="Failed", finished="2026-11-01T11:10:00Z")])
    assert failed.outcome == Outcome.FAILED
    (running,) = group_pods([done[0], pod("a-1", owner="a", phase="Running")])
    assert running.outcome == Outcome.RUNNING
    assert running.finished is None


def test_a_pod_users_wrote_badly_still_lands_in_a_job_with_the_reason() -> None:
    forged = pod("x", annotations={"kubecell.io/topology": "bogus"})
    nameless = {"metadata": {"namespace": "ns"}}
    (job,) = group_pods([forged, nameless])
    assert job.gpus_per_pod == 0
    assert any("cannot be read" in problem for problem in job.problems)


def test_a_user_annotation_the_history_cannot_keep_falls_back_to_the_service_account() -> None:
    for stated in ("u" * 300, "alice\x00", ""):
        body = pod("x", annotations={"kubecell.io/user": stated})
        body["spec"]["serviceAccountName"] = "trainer"
        (job,) = group_pods([body])
        assert job.user == "trainer"
        assert any("kubecell.io/user" in problem for problem in job.problems)
    (kept,) = group_pods([pod("y", annotations={"kubecell.io/user": "alice"})])
    assert kept.user == "alice"
    assert kept.problems == ()


class NoSeries:
    """A Prometheus with no series at all (every pod becomes a problem, nothing raises)."""

    def raw(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []


def test_a_job_the_history_would_refuse_is_reported_and_the_pass_goes_on(tmp_path: Path) -> None:
    bad = pod("bad")
    bad["spec"]["containers"][0]["image"] = "img\x00:1"  # text PostgreSQL cannot store
    jobs = group_pods([bad, pod("good")])
    with JobHistory.open(f"sqlite:///{tmp_path}/h.db") as history:
        result = profile_jobs(jobs, NoSeries(), history)  # type: ignore[arg-type]
        assert [record.owner_name for record in result.saved] == ["good"]
        ((uid, why),) = result.refused
        assert uid == "uid-ns-bad"
        assert "NUL" in why
        assert history.get("uid-ns-good") is not None
