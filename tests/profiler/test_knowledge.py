"""The job history as the scheduler's knowledge: a family's median run time and solo use from its finished jobs
in the pod's own namespace only; nothing before three jobs; answers cached for a while; a broken history answers
nothing instead of failing the scheduler."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference.profile import JobKey
from kubecell.profiler.distribution import distribution
from kubecell.profiler.history import JobHistory, JobRecord, Outcome, SharedUse
from kubecell.profiler.identity import family_of
from kubecell.profiler.knowledge import HistoryKnowledge
from kubecell.profiler.pairs import ALONE
from kubecell.profiler.recommend import MIB

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def finished(namespace: str, name: str, seconds: float, util: float, *, milli: int = 500,
             user: str | None = None) -> JobRecord:
    return JobRecord(uid=f"{namespace}-{name}", namespace=namespace, owner_kind="Job", owner_name=name, created=T0,
                     user=user,
                     gpus_per_pod=1, milli_gpu_per_pod=milli, started=T0, finished=T0 + timedelta(seconds=seconds),
                     outcome=Outcome.SUCCEEDED,
                     metrics={"gpu_utilization": distribution([util] * 5),
                              "gpu_memory": distribution([2000.0 * MIB] * 5)})


def pod(namespace: str, owner: str, user: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": f"{owner}-abcde", "namespace": namespace,
                         "annotations": {"kubecell.io/user": user} if user else {},
                         "ownerReferences": [{"kind": "Job", "name": owner, "uid": "u", "controller": True}]}}


@pytest.fixture
def history(tmp_path: Path) -> JobHistory:
    opened = JobHistory.open(f"sqlite:///{tmp_path}/h.db")
    for i, (seconds, util) in enumerate([(100, 0.2), (200, 0.3), (300, 0.4)]):
        opened.save(finished("team-a", f"bert-{i}", seconds, util))
    for i in range(3):  # another team's jobs of the same name family
        opened.save(finished("team-b", f"bert-{i}", 99_999, 1.0))
    return opened


def test_a_family_in_its_own_namespace(history: JobHistory) -> None:
    knowledge = HistoryKnowledge(history)
    assert family_of(pod("team-a", "bert-7")) == ("team-a", "bert")
    assert knowledge.expected_seconds(pod("team-a", "bert-7")) == 200
    profile = knowledge.profile(pod("team-a", "bert-7"))
    assert profile is not None
    assert profile.gpu_util == pytest.approx(30.0)
    assert profile.memory_mib == 2000.0
    # per-job p90 0.2, 0.3, 0.4 -> p90 across the three 0.4, +25 % = 500 milli
    assert knowledge.share_milli(pod("team-a", "bert-7")) == 500
    assert knowledge.share_milli(pod("team-b", "bert-7")) is None, "team b's jobs need whole GPUs"
    assert knowledge.expected_seconds(pod("team-b", "bert-7")) == 99_999, "team b's own history"
    assert knowledge.expected_seconds(pod("team-c", "bert-7")) is None, "no history in team c"


@pytest.mark.parametrize(("alone_seconds", "expected"), [(600.0, 60.0), (100.0, 27.5)], ids=["seen-alone", "too-short"])
def test_a_familys_utilization_is_read_from_its_time_alone_on_a_shared_gpu(history: JobHistory, alone_seconds: float,
                                                                           expected: float) -> None:
    """Its runs' means (0.2, 0.3, 0.4, and 0.25 for a run that shared its GPU with gpt) include time a partner
    took part of the GPU; 300 s or more alone at 0.6 is what it uses by itself. Less than that says nothing, and
    the runs' median (0.275) stands."""
    history.save(replace(finished("team-a", "bert-9", 400, 0.25), created=datetime.now(UTC) - timedelta(days=1),
                         sharing=(SharedUse(ALONE, alone_seconds, 0.6 * alone_seconds),
                                  SharedUse("team-a/gpt", 900.0, 0.2 * 900.0))))
    profile = HistoryKnowledge(history).profile(pod("team-a", "bert-7"))
    assert profile is not None
    assert profile.gpu_util == pytest.approx(expected)
    other = HistoryKnowledge(history).profile(pod("team-b", "bert-7"))
    assert other is not None
    assert other.gpu_util == pytest.approx(100.0), "another namespace's family keeps its own"


def test_a_familys_memory_controller_time_is_its_kernels_share_of_its_compute(history: JobHistory) -> None:
    """Without a memory-controller series the controller is taken as busy as the SMs; with one, the family's
    controller time per SM time (0.5 here, the median over its jobs) scales whatever its utilization is."""
    knowledge = HistoryKnowledge(history)
    profile = knowledge.profile(pod("team-a", "bert-7"))
    assert profile is not None
    assert profile.gmem_util == profile.gpu_util == pytest.approx(30.0)
    for i, (util, controller) in enumerate([(0.4, 0.2), (0.6, 0.3), (0.2, 0.2)]):
        job = finished("team-c", f"gpt-{i}", 100, util)
        history.save(replace(job, metrics={**job.metrics, "gpu_memory_utilization": distribution([controller] * 5)}))
    profile = HistoryKnowledge(history).profile(pod("team-c", "gpt-7"))
    assert profile is not None
    assert profile.gpu_util == pytest.approx(40.0)
    assert profile.gmem_util == pytest.approx(20.0)


def test_answers_are_cached_for_the_ttl(history: JobHistory) -> None:
    now = [0.0]
    knowledge = HistoryKnowledge(history, ttl_seconds=60, clock=lambda: now[0])
    assert knowledge.expected_seconds(pod("team-a", "gpt-1")) is None
    for i in range(3):
        history.save(finished("team-a", f"gpt-{i}", 50, 0.1))
    assert knowledge.expected_seconds(pod("team-a", "gpt-1")) is None, "cached"
    now[0] = 61
    assert knowledge.expected_seconds(pod("team-a", "gpt-1")) == 50


def test_the_cache_holds_a_bounded_number_of_families(history: JobHistory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Names and users come from pods: a namespace creating pods of ever new names must not grow the cache
    without end. The family asked least recently goes first; one asked again stays."""
    monkeypatch.setattr("kubecell.profiler.knowledge.MAX_CACHED", 3)
    knowledge = HistoryKnowledge(history, ttl_seconds=3600)
    reads: list[str] = []
    read = knowledge._read_family

    def counted(namespace: str, family: str) -> Any:
        reads.append(family)
        return read(namespace, family)

    monkeypatch.setattr(knowledge, "_read_family", counted)
    for owner in ("bert-1", "a-1", "bert-1", "b-1", "c-1", "bert-1", "a-1"):
        knowledge.share_milli(pod("team-a", owner))
    assert reads == ["bert", "a", "b", "c", "a"], "bert stayed held (asked again), a was let go"
    assert len(knowledge._families) == 3


def test_new_user_names_cost_one_small_query_each_and_push_no_family_out(
        history: JobHistory, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kubecell.io/user`` is the pod's to state: a namespace stating a new one on every pod made the scheduling
    thread read the family's jobs with their distributions again each time, and pushed other namespaces'
    families out of the cache. A family's jobs are read once per period; a user's own run time is one query."""
    monkeypatch.setattr("kubecell.profiler.knowledge.MAX_CACHED", 3)
    knowledge = HistoryKnowledge(history, ttl_seconds=3600)
    jobs_read: list[str | None] = []
    real = history.jobs

    def counted(**query: Any) -> Any:
        jobs_read.append(query.get("family"))
        return real(**query)

    monkeypatch.setattr(history, "jobs", counted)
    assert knowledge.share_milli(pod("team-b", "bert-1")) is None
    for i in range(10):
        assert knowledge.expected_seconds(pod("team-a", "bert-7", user=f"user-{i}")) == 200
    assert knowledge.share_milli(pod("team-b", "bert-1")) is None
    assert jobs_read == ["bert", "bert"], "team b's family and team a's, once each"


def test_a_broken_history_answers_nothing(history: JobHistory, tmp_path: Path) -> None:
    knowledge = HistoryKnowledge(history)
    history.close()
    (tmp_path / "h.db").write_bytes(b"not a database" * 100)
    assert knowledge.expected_seconds(pod("team-a", "bert-1")) is None
    assert knowledge.profile(pod("team-a", "bert-1")) is None


def test_a_users_own_runs_of_the_family_come_first(history: JobHistory) -> None:
    for i, seconds in enumerate((1000, 1100, 1200)):
        history.save(finished("team-a", f"bert-alice-run{i}", seconds, 0.3, user="alice"))
    knowledge = HistoryKnowledge(history)
    assert family_of(pod("team-a", "bert-alice-run7")) == ("team-a", "bert-alice")
    assert knowledge.expected_seconds(pod("team-a", "bert-alice-run7", user="alice")) == 1100
    assert knowledge.expected_seconds(pod("team-a", "bert-alice-run7", user="bob")) == 1100, \
        "bob has no runs of his own: the family's (alice's are all there is)"
    for i, seconds in enumerate((10, 20, 30)):
        history.save(finished("team-a", f"bert-{i + 10}", seconds, 0.3, user="carol"))
    fresh = HistoryKnowledge(history)
    assert fresh.expected_seconds(pod("team-a", "bert-9", user="carol")) == 20, "carol's own runs"
    assert fresh.expected_seconds(pod("team-a", "bert-9", user="dave")) == 65, "the family's six runs: 10..300"


def test_a_bare_pod_is_read_once_per_object(history: JobHistory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler asks four things of one pod in a row; an owner-less pod's family means parsing its gang's
    demand, so that is done once per pod object. A new object (the pod read again, renamed) is read anew."""
    parsed: list[str] = []
    from kubecell.kube.dialects.pod import pod_demand as real

    def counted(pod: Any) -> Any:
        parsed.append(pod["metadata"]["name"])
        return real(pod)

    monkeypatch.setattr("kubecell.profiler.identity.pod_demand", counted)
    knowledge = HistoryKnowledge(history)
    bare = {"metadata": {"name": "bert-9", "namespace": "team-a"}}
    assert knowledge.expected_seconds(bare) == 200
    assert knowledge.profile(bare) is not None
    assert knowledge.share_milli(bare) == 500
    assert knowledge.family(bare) == JobKey("team-a/bert")
    assert parsed == ["bert-9"]
    other = {"metadata": {"name": "gpt-9", "namespace": "team-a"}}
    assert knowledge.family(other) == JobKey("team-a/gpt")
    assert knowledge.family(bare) == JobKey("team-a/bert")
    assert parsed == ["bert-9", "gpt-9", "bert-9"]


def test_a_forged_controller_series_cannot_raise_past_its_family(history: JobHistory) -> None:
    """The controller's time comes from node-written series: a negative or absurd one is bounded, not raised."""
    for i, controller in enumerate([-0.5, -0.5, 50.0]):
        job = finished("team-d", f"llm-{i}", 100, 0.4)
        history.save(replace(job, metrics={**job.metrics, "gpu_memory_utilization": distribution([controller] * 5)}))
    profile = HistoryKnowledge(history).profile(pod("team-d", "llm-7"))
    assert profile is not None
    assert profile.gmem_util == 0.0


def test_runs_that_finished_before_they_started_are_not_run_times(history: JobHistory) -> None:
    """Start and finish are the times a kubelet wrote: a clock stepped back (or a forged status) gives a job that
    finished before it started. Its run time is unknown; before, the family's median went negative, the solo
    profile refused it, and the error reached the scheduler at every reconcile: nobody was scheduled."""
    for i in range(3):
        history.save(finished("team-e", f"gpt-{i}", -60, 0.3))
    history.save(finished("team-e", "gpt-3", 120, 0.3))
    knowledge = HistoryKnowledge(history)
    assert knowledge.expected_seconds(pod("team-e", "gpt-9")) is None, "one run time known: fewer than three"
    profile = knowledge.profile(pod("team-e", "gpt-9"))
    assert profile is not None
    assert profile.gpu_util == pytest.approx(30.0), "its use is still what it used"
    assert knowledge.expected_seconds(pod("team-a", "bert-7")) == 200, "other families as before"


def test_a_family_whose_history_fails_a_check_goes_uninformed(history: JobHistory,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever check a family's rows fail, that family gets no answer, and the scheduler no exception."""
    knowledge = HistoryKnowledge(history)

    def refuse(*args: Any) -> Any:
        raise InvalidInputError("-5.0", location="job team-a/bert-0", field="seconds")

    monkeypatch.setattr("kubecell.profiler.knowledge.usage_profile", refuse)
    assert knowledge.profile(pod("team-a", "bert-7")) is None
    assert knowledge.expected_seconds(pod("team-a", "bert-7")) is None
