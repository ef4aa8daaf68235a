"""Series and names the profiler cannot make sense of cost one pod's metric or one job's record, never the
pass: a node's exporter or a user's pod can write absurd values (1e308, a sum that overflows) or labels
PromQL cannot quote as JSON does, and every other job must still be profiled and saved."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kubecell.core.errors import KubecellError
from kubecell.profiler.collect import Job, collect
from kubecell.profiler.history import JobHistory
from kubecell.profiler.jobs import group_pods
from kubecell.profiler.prometheus import Prometheus, PrometheusError, Sample, Series, quote
from kubecell.profiler.run import profile_jobs
from kubecell.profiler.sources import GPU_UTILIZATION

T = 1_767_225_600.0
POD_LABEL = re.compile(r'pod=~"([^"]*)"')


def minutes(value: float, count: int = 30) -> tuple[Sample, ...]:
    return tuple((T + 60 * i, value) for i in range(count))


class CannedPrometheus(Prometheus):
    """Answers ``raw`` for the kubecell GPU gauge from canned series per pod; a pod in ``refuse`` makes its
    query fail as Prometheus refuses one (HTTP 400), and ``down`` fails every query as if it were unreachable."""

    def __init__(self, series: dict[str, tuple[Sample, ...]], refuse: frozenset[str] = frozenset(),
                 down: bool = False) -> None:
        super().__init__("http://127.0.0.1:9")
        self.canned, self.refuse, self.down = series, refuse, down

    def raw(self, selector: str, start: float, end: float, **_: Any) -> list[Series]:
        if self.down:
            raise PrometheusError(self.url, selector, "cannot reach Prometheus")
        if not selector.startswith(GPU_UTILIZATION.sources[0].name + "{"):
            return []
        match = POD_LABEL.search(selector)
        names = match.group(1).split("|") if match else []
        if self.refuse & set(names):
            raise PrometheusError(self.url, selector, "HTTP 400, bad_data: invalid escape", status=400)
        return [Series({"pod": name, "namespace": "ns"}, self.canned[name]) for name in names
                if name in self.canned]


def test_absurd_values_are_dropped_and_told_and_the_rest_of_the_job_is_profiled() -> None:
    client = CannedPrometheus({"a": minutes(1e308), "b": minutes(0.5), "c": minutes(0.4)[:10] + minutes(1e300)[10:]})
    profile = collect(client, Job("ns", ("a", "b", "c"), T, T + 1800), (GPU_UTILIZATION,))
    util = profile.metrics["gpu_utilization"]
    assert set(util.pods) == {"b", "c"}
    assert util.pods["c"].mean == pytest.approx(0.4), "c's absurd samples dropped, its others kept"
    assert util.job is not None
    reasons = {problem.pod: problem.reason for problem in profile.problems}
    assert "all 30 samples are NaN, infinite or beyond 1e+18" in reasons["a"]
    assert "dropped 20 of 30 samples" in reasons["c"]


def pod(name: str, namespace: str = "ns") -> dict[str, Any]:
    started = datetime.fromtimestamp(T, UTC).isoformat().replace("+00:00", "Z")
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "creationTimestamp": started},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "img:1", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "startTime": started}}


def test_a_query_prometheus_refuses_costs_that_job_alone(tmp_path: Path) -> None:
    jobs = group_pods([pod("victim"), pod("odd")])
    client = CannedPrometheus({"victim": minutes(0.5), "odd": minutes(0.5)}, refuse=frozenset({"odd"}))
    now = datetime.fromtimestamp(T, UTC) + timedelta(minutes=30)
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        done = profile_jobs(jobs, client, history, now=now)
        assert [record.owner_name for record in done.saved] == ["victim"]
        (uid, reason), = done.refused
        assert uid == "uid-odd"
        assert "HTTP 400" in reason
        with pytest.raises(PrometheusError, match="cannot reach"):
            profile_jobs(jobs, CannedPrometheus({}, down=True), history, now=now)


def test_labels_beyond_the_basic_plane_are_quoted_as_promql_reads_them() -> None:
    assert quote("GPU-\U0001f600") == '"GPU-\U0001f600"', "no surrogate pair escape: PromQL refuses those"
    assert quote('a"b\\c\n') == '"a\\"b\\\\c\\n"'
    with pytest.raises(KubecellError, match="not valid Unicode"):
        quote("GPU-\ud83d")


def owned(name: str, namespace: str, owner_uid: str, *, finished_minute: int | None = None) -> dict[str, Any]:
    body = pod(name, namespace)
    body["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "train", "uid": owner_uid, "controller": True}]
    if finished_minute is not None:
        done = datetime.fromtimestamp(T + 60 * finished_minute, UTC).isoformat().replace("+00:00", "Z")
        body["status"] = {"phase": "Succeeded", "startTime": body["status"]["startTime"], "containerStatuses": [
            {"name": "c", "state": {"terminated": {"exitCode": 0, "finishedAt": done}}}]}
    return body


def test_a_pod_naming_another_namespaces_owner_cannot_replace_that_jobs_record(tmp_path: Path) -> None:
    """Owner uids are unique in a cluster, but the API server checks no owner reference: a pod in 'attacker'
    naming the uid of a Job in 'victim' is refused, and the victim's record stays as it was saved."""
    client = CannedPrometheus({"v-0": minutes(0.5), "a-0": minutes(0.9)})
    now = datetime.fromtimestamp(T, UTC) + timedelta(minutes=30)
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        profile_jobs(group_pods([owned("v-0", "victim", "job-uid")]), client, history, now=now)
        done = profile_jobs(group_pods([owned("a-0", "attacker", "job-uid")]), client, history, now=now)
        assert done.saved == ()
        assert "keeps a job of namespace victim" in done.refused[0][1]
        kept = history.get("job-uid")
        assert kept is not None
        assert (kept.namespace, [p.name for p in kept.pods]) == ("victim", ["v-0"])


def test_a_finished_jobs_record_keeps_the_pods_the_garbage_collector_deleted(tmp_path: Path) -> None:
    client = CannedPrometheus({"p-0": minutes(0.5), "p-1": minutes(0.5)})
    now = datetime.fromtimestamp(T, UTC) + timedelta(hours=2)
    both = [owned("p-0", "ns", "job-uid", finished_minute=20), owned("p-1", "ns", "job-uid", finished_minute=29)]
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        assert len(profile_jobs(group_pods(both), client, history, now=now).saved) == 1
        first = history.get("job-uid")
        assert first is not None
        done = profile_jobs(group_pods(both[:1]), client, history, now=now)  # p-1, the latest, deleted
        assert done.unchanged == ("job-uid",)
        assert history.get("job-uid") == first


def test_a_job_name_matplotlib_would_read_as_maths_does_not_fail_the_report(tmp_path: Path) -> None:
    from kubecell.profiler.report import write_report
    from tests.profiler.test_knowledge import finished

    records = [finished("ns", "x$\\foo{$-1", 600, 0.3), finished("ns", "ok-1", 600, 0.5)]
    page = write_report(records, tmp_path / "report")
    assert (tmp_path / "report" / "usage.png").stat().st_size > 0
    assert page.is_file()


class Asked(CannedPrometheus):
    """Keeps the window of every ``raw`` call."""

    def __init__(self, series: dict[str, tuple[Sample, ...]]) -> None:
        super().__init__(series)
        self.windows: list[tuple[float, float]] = []

    def raw(self, selector: str, start: float, end: float, **more: Any) -> list[Series]:
        self.windows.append((start, end))
        return super().raw(selector, start, end, **more)


def test_a_pass_reads_a_running_jobs_last_day_and_nothing_for_pods_that_never_started(tmp_path: Path) -> None:
    """A pass runs every few minutes; a month-old job read whole each time, and pods that never started (or
    ask no GPU but carry a refused user annotation) read since their creation, would grow every pass."""
    week = pod("long")
    never = pod("never")
    never["status"] = {"phase": "Pending"}
    cpu = pod("cpu")
    cpu["spec"]["containers"][0]["resources"]["limits"] = {"cpu": "1"}
    cpu["metadata"]["annotations"] = {"kubecell.io/user": "x" * 10_000}
    client = Asked({"long": minutes(0.5)})
    now = datetime.fromtimestamp(T, UTC) + timedelta(days=7)
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        done = profile_jobs(group_pods([week, never, cpu]), client, history, now=now)
    assert sorted(record.owner_name for record in done.saved) == ["long", "never"]
    assert client.windows, "the running job was read"
    assert min(start for start, _ in client.windows) >= now.timestamp() - 86_400 - 1, "its last day only"


class TwoSeries(CannedPrometheus):
    """One pod's GPU gauge as two series (two GPUs) scraped every 60 s, stamped a second apart."""

    def raw(self, selector: str, start: float, end: float, **_: Any) -> list[Series]:
        if not selector.startswith(GPU_UTILIZATION.sources[0].name + "{"):
            return []
        first = tuple((T + 60 * i, 0.2) for i in range(60))
        second = tuple((T + 60 * i + 1, 0.8) for i in range(60))
        return [Series({"pod": "p", "namespace": "ns", "gpu": "0"}, first),
                Series({"pod": "p", "namespace": "ns", "gpu": "1"}, second)]


def test_series_stamped_apart_are_weighted_by_their_scrape_interval() -> None:
    """Merged, the two series' gaps alternate 1 s and 59 s; the pod's sum must still cover its hour, not the
    seconds a median of those gaps would cap it to."""
    profile = collect(TwoSeries({}), Job("ns", ("p",), T, T + 3600), (GPU_UTILIZATION,))
    series = profile.metrics["gpu_utilization"].series["p"]
    assert sum(series.weights) == pytest.approx(3600, abs=61)
    assert profile.metrics["gpu_utilization"].pods["p"].mean == pytest.approx(1.0, abs=0.02), "0.2 + 0.8 held"
