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


def test_a_job_that_finished_before_it_started_has_no_start_and_says_why() -> None:
    """Both times are a kubelet's: a node whose clock stepped back writes a finish before the start."""
    (job,) = group_pods([pod("a-0", owner="a", phase="Succeeded", finished="2026-11-01T09:00:00Z")])
    assert job.outcome == Outcome.SUCCEEDED
    assert job.started is None, "its run time is unknown, never negative"
    assert job.finished is not None
    assert any("before it started" in problem for problem in job.problems), job.problems


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


GANG = {"kubecell.io/group": "nightly", "kubecell.io/group-size": "2"}


def gang_pod(name: str, created: str, started: str | None, finished: str | None = None) -> dict[str, Any]:
    body = pod(name, annotations=GANG, phase="Succeeded" if finished else "Running", finished=finished)
    body["metadata"]["creationTimestamp"] = created
    body["metadata"]["uid"] = f"uid-{name}-{created}"
    if started is None:
        del body["status"]["startTime"]
        body["status"]["phase"] = "Pending"
    else:
        body["status"]["startTime"] = started
    return body


def run_one(finished: bool = True) -> list[dict[str, Any]]:
    end = "2026-11-01T11:00:00Z" if finished else None
    return [gang_pod("w-0", "2026-11-01T10:00:00Z", "2026-11-01T10:01:00Z", end),
            gang_pod("w-1", "2026-11-01T10:00:00Z", "2026-11-01T10:01:00Z", end)]


def run_two() -> list[dict[str, Any]]:
    """The same gang name and pod names a day later (the user deleted the first run's pods, or not yet)."""
    return [gang_pod("w-0", "2026-11-02T10:00:00Z", "2026-11-02T10:02:00Z"),
            gang_pod("w-1", "2026-11-02T10:00:00Z", "2026-11-02T10:02:00Z")]


def test_an_owner_less_gang_run_again_is_another_job() -> None:
    first, second = group_pods([*run_one(), *run_two()])
    assert first.run_of == second.run_of is not None
    assert first.uid != second.uid
    assert first.outcome == Outcome.SUCCEEDED
    assert second.outcome == Outcome.RUNNING
    assert first.started is not None
    assert first.started.day == 1
    assert second.started is not None
    assert second.started.day == 2
    assert first.finished is not None
    assert second.finished is None
    # a member replaced while its run goes on stays in that run, and so does a pod with no creation time
    replaced = gang_pod("w-1", "2026-11-01T10:30:00Z", "2026-11-01T10:31:00Z")
    undated = gang_pod("w-2", "2026-11-01T10:30:00Z", None)
    del undated["metadata"]["creationTimestamp"]
    (one,) = group_pods([run_one()[0], replaced, undated])
    assert len(one.pods) == 3


def test_a_gang_run_again_keeps_its_first_run_in_the_history(tmp_path: Path) -> None:
    with JobHistory.open(f"sqlite:///{tmp_path}/h.db") as history:
        profile_jobs(group_pods(run_one()), NoSeries(), history)  # type: ignore[arg-type]
        (first,) = history.jobs()
        # the first run's pods deleted, the gang started again under the same pod names
        profile_jobs(group_pods(run_two()), NoSeries(), history)  # type: ignore[arg-type]
        uids = {record.uid for record in history.jobs()}
        assert len(uids) == 2
        assert first.uid in uids
        kept = history.get(first.uid)
        assert kept is not None
        assert kept.finished == first.finished
        assert len(history.durations()) == 1, "the second run has not ended: one run time, the first run's"


def test_a_run_whose_first_pod_is_gone_is_saved_in_place(tmp_path: Path) -> None:
    early = gang_pod("w-0", "2026-11-01T09:59:00Z", "2026-11-01T10:01:00Z")
    late = gang_pod("w-1", "2026-11-01T10:00:00Z", "2026-11-01T10:01:00Z")
    with JobHistory.open(f"sqlite:///{tmp_path}/h.db") as history:
        profile_jobs(group_pods([early, late]), NoSeries(), history)  # type: ignore[arg-type]
        (saved,) = history.jobs()
        # w-0 deleted and made again: the run's first creation time moves, its key in the history does not
        again = gang_pod("w-0", "2026-11-01T10:20:00Z", "2026-11-01T10:21:00Z")
        (seen,) = group_pods([late, again])
        assert seen.uid != saved.uid
        result = profile_jobs([seen], NoSeries(), history)  # type: ignore[arg-type]
        assert [record.uid for record in result.saved] == [saved.uid]
        (only,) = history.jobs()
        assert sorted(pod.name for pod in only.pods) == ["w-0", "w-1"]


def test_a_run_saved_before_runs_were_told_apart_is_found_by_its_pods(tmp_path: Path) -> None:
    from dataclasses import replace

    (job,) = group_pods(run_one(finished=False))
    assert job.run_of is not None
    with JobHistory.open(f"sqlite:///{tmp_path}/h.db") as history:
        profile_jobs([replace(job, uid=job.run_of, run_of=None)], NoSeries(), history)  # type: ignore[arg-type]
        result = profile_jobs(group_pods(run_one()), NoSeries(), history)  # type: ignore[arg-type]
        assert [record.uid for record in result.saved] == [job.run_of]
        (only,) = history.jobs()
        assert only.finished is not None


def squatter(uid: str, *, kind: str = "Job", namespace: str = "mallory", name: str = "squatter") -> dict[str, Any]:
    """A pod of another namespace whose owner reference names ``uid`` as its controller's (the API server checks
    no owner reference)."""
    body = pod(name, namespace=namespace)
    body["metadata"]["ownerReferences"] = [{"kind": kind, "name": "nightly", "uid": uid, "controller": True}]
    return body


def test_an_owner_uid_shaped_as_a_gang_key_is_not_a_key() -> None:
    """A gang's key is anyone's to compute (a digest of its namespace and name, and its run's creation second):
    an owner uid that begins as one does is no API server's, and is not taken for the pod's key."""
    (victim,) = group_pods(run_two())
    (job,) = group_pods([squatter(victim.uid)])
    assert job.uid == "uid-mallory-squatter", "keyed as if it had no owner: by the pod's own uid"
    assert job.owner_kind == "Pod"
    assert any("begins as kubecell's keys of gangs do" in problem for problem in job.problems)
    member = gang_pod("w-9", "2026-11-02T10:00:00Z", "2026-11-02T10:02:00Z")
    member["metadata"]["ownerReferences"] = [{"kind": "Gang", "name": "x", "uid": "gang-x", "controller": True}]
    (gang,) = group_pods([member])
    assert (gang.owner_kind, gang.run_of) == ("Gang", victim.run_of), "with a gang, keyed by its gang"


def test_another_namespace_cannot_squat_a_gangs_next_run(tmp_path: Path) -> None:
    """The hostile review's case: a pod of 'mallory' naming the key of the next run of a gang of 'ns' as its
    controller's uid is profiled before that run exists; the run is still saved, in its own namespace."""
    (victim,) = group_pods(run_two())
    with JobHistory.open(f"sqlite:///{tmp_path}/h.db") as history:
        profile_jobs(group_pods([squatter(victim.uid)]), NoSeries(), history)  # type: ignore[arg-type]
        result = profile_jobs(group_pods([*run_two(), squatter(victim.uid)]), NoSeries(),  # type: ignore[arg-type]
                              history)
        assert result.refused == ()
        kept = history.get(victim.uid)
        assert kept is not None
        assert (kept.namespace, kept.owner_kind) == ("ns", "Gang")


def test_a_squat_saved_before_the_fix_gives_way_to_the_gang(tmp_path: Path) -> None:
    """A history written by an earlier kubecell may keep a squatter's job under a gang's key, as finished and
    holding pods named as the gang's: the gang's run is saved over it, not skipped as unchanged nor refused."""
    from dataclasses import replace

    (victim,) = group_pods(run_one())
    (squat,) = group_pods([squatter("owner-x", name="w-0"), squatter("owner-x", name="w-1")])
    squat = replace(squat, uid=victim.uid, finished=victim.finished, outcome=Outcome.SUCCEEDED)
    with JobHistory.open(f"sqlite:///{tmp_path}/h.db") as history:
        profile_jobs([squat], NoSeries(), history)  # type: ignore[arg-type]
        squatted = history.get(victim.uid)
        assert squatted is not None
        assert squatted.namespace == "mallory"
        result = profile_jobs(group_pods(run_one()), NoSeries(), history)  # type: ignore[arg-type]
        assert (result.unchanged, result.refused) == ((), ())
        kept = history.get(victim.uid)
        assert kept is not None
        assert (kept.namespace, kept.owner_kind) == ("ns", "Gang")
        assert history.jobs(namespace="mallory") == []
