"""What a node, a tenant's exporter or a broken Prometheus can hand the profiler, found by a hostile review: each
costs one job (or one query) a clear error and never the pass, nor a pass that runs for hours.

- A pod's start and finish are what its node's kubelet wrote: 1970 or 9999 must not make a finished job's
  window decades long (one query per hour of it).
- An answer is read at most ``MAX_ANSWER_BYTES`` (after decompression): a label-cardinality bomb (or a gzip
  bomb) is that job's refusal, not the profiler killed for its memory.
- A body nested thousands deep is "not the API's JSON", not a RecursionError that stops the pass.
- The HTML report is UTF-8, as it declares, whatever the locale: a user's name in any script cannot fail it.

Every server here listens on loopback and every loop in it is bounded."""

from __future__ import annotations

import contextlib
import gzip
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from kubecell.profiler.history import JobHistory
from kubecell.profiler.jobs import group_pods
from kubecell.profiler.prometheus import MAX_ANSWER_BYTES, Prometheus, PrometheusError, Series
from kubecell.profiler.run import profile_jobs
from tests.support import loopback_http

T = datetime(2026, 1, 1, tzinfo=UTC)
EMPTY_MATRIX = b'{"status": "success", "data": {"resultType": "matrix", "result": []}}'
QUERY_BUDGET = 200
"""Queries a one-pod job may cost before a test calls it runaway (it needs about 10: a few per metric)."""


def stamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def finished_pod(name: str, started: str, finished: str, *, created: datetime = T) -> dict[str, Any]:
    """A GPU pod that ran and succeeded, its start and finish as a kubelet wrote them."""
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "creationTimestamp": stamp(created)},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "img:1", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Succeeded", "startTime": started,
                       "containerStatuses": [{"state": {"terminated": {"finishedAt": finished}}}]}}


class Counting(Prometheus):
    """Answers every query with no series, counting them; past ``QUERY_BUDGET`` it fails the test at once
    (a runaway window would otherwise ask millions)."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")
        self.windows: list[float] = []

    def query(self, promql: str, at: float | None = None, *, finite: bool = True) -> list[Series]:
        self.windows.append(at or 0.0)
        if len(self.windows) > QUERY_BUDGET:
            raise AssertionError(f"{len(self.windows)} queries for one pod: the window is not bounded")
        return []


@pytest.mark.parametrize(("started", "finished"), [
    ("1970-01-01T00:00:01Z", stamp(T + timedelta(hours=1))),
    (stamp(T), "9999-12-31T23:59:59Z"),
], ids=["start-in-1970", "finish-in-9999"])
def test_a_kubelets_start_or_finish_does_not_stretch_the_window(tmp_path: Path, started: str,
                                                                 finished: str) -> None:
    client = Counting()
    now = T + timedelta(hours=2)
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        done = profile_jobs(group_pods([finished_pod("p", started, finished)]), client, history, now=now)
    assert [record.uid for record in done.saved] == ["uid-p"]
    # every window lies between the pod's creation (the API server's clock) and now (the profiler's)
    assert all(T.timestamp() <= at <= now.timestamp() for at in client.windows), client.windows


def test_a_kubelets_finish_does_not_stretch_the_run_time(tmp_path: Path) -> None:
    """The record's run time is what a family's expected run time and the report's GPU-hours are made of: a pod
    has finished before the pass that sees it finished, whatever year its node's clock wrote."""
    now = T + timedelta(hours=2)
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        done = profile_jobs(group_pods([finished_pod("p", stamp(T), "9999-12-31T23:59:59Z")]), Counting(), history,
                            now=now)
        (saved,) = done.saved
        assert saved.seconds is not None
        assert 0 <= saved.seconds <= (now - T).total_seconds(), saved.seconds
        assert history.durations() == [saved.seconds]
    assert any("clock" in problem for problem in saved.problems), saved.problems


class Hostile(BaseHTTPRequestHandler):
    """A Prometheus whose answer depends on the pod a query names: ``bomb`` gets 40 MB of JSON (whitespace,
    gzipped to a few kB), ``deep`` arrays nested 100,000 deep, any other an empty matrix."""

    def do_POST(self) -> None:
        form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        query = " ".join(form.get("query", []) + form.get("match[]", []))
        if "bomb" in query:
            self._send(gzip.compress(EMPTY_MATRIX + b" " * (MAX_ANSWER_BYTES + 8 * 2**20), compresslevel=1),
                       gzipped=True)
        elif "deep" in query:
            self._send(b"[" * 100_000)
        else:
            self._send(EMPTY_MATRIX)

    def _send(self, body: bytes, *, gzipped: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client stopped reading: what a cap is for
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def hostile() -> Iterator[str]:
    with loopback_http(Hostile) as url:
        yield url


def test_an_answer_over_the_cap_is_refused_not_parsed(hostile: str) -> None:
    with pytest.raises(PrometheusError, match=f"an answer over {MAX_ANSWER_BYTES} bytes") as caught:
        Prometheus(hostile, timeout=5).query('up{pod="bomb"}')
    assert caught.value.refused, "the query's own series are too many: another query may still be answered"


def test_a_cardinality_bomb_costs_its_job_alone(hostile: str, tmp_path: Path) -> None:
    started, finished = stamp(T), stamp(T + timedelta(minutes=30))
    pods = [finished_pod("bomb", started, finished), finished_pod("victim", started, finished)]
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        done = profile_jobs(group_pods(pods), Prometheus(hostile, timeout=5), history, now=T + timedelta(hours=1))
    assert [record.uid for record in done.saved] == ["uid-victim"]
    (uid, reason), = done.refused
    assert uid == "uid-bomb"
    assert "too many series or samples" in reason


def test_json_nested_too_deep_is_not_the_apis_json(hostile: str) -> None:
    with pytest.raises(PrometheusError, match="not the API's JSON"):
        Prometheus(hostile, timeout=5).query('up{pod="deep"}')


REPORT = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from kubecell.profiler.history import JobRecord
from kubecell.profiler.report import write_report
record = JobRecord(uid="u", namespace="ns", owner_kind="Job", owner_name="\\u8bad\\u7ec3-\\u00eb",
                   created=datetime(2026, 1, 1, tzinfo=UTC), problems=("pod \\u8bad\\u7ec3-0: no series",))
write_report([record], Path(sys.argv[1]))
"""


def test_the_report_is_utf8_whatever_the_locale(tmp_path: Path) -> None:
    # an ASCII locale, with neither UTF-8 mode nor locale coercion to rescue it (as on a host without C.UTF-8)
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run([sys.executable, "-c", REPORT, str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "out" / "index.html").read_bytes().decode("utf-8")
    assert "ns/训练-ë: pod 训练-0: no series" in page


def test_a_tenants_absurd_utilization_moves_only_its_own_bar_within_what_its_gpus_could_show() -> None:
    """A pod exports its own series (where tenants' pods are scraped): a mean of 1e18 cut its VC's used GPU-hours
    to nothing useful and squashed every other job's bar. The report reads a pod's utilization within 0 to one
    per GPU."""
    from kubecell.profiler.distribution import distribution
    from kubecell.profiler.history import JobRecord
    from kubecell.profiler.report import gpu_hours

    def job(mean: float) -> JobRecord:
        return JobRecord(uid="u", namespace="ns", owner_kind="Job", owner_name="x", created=T, pod_count=2,
                         gpus_per_pod=4, milli_gpu_per_pod=1000, started=T, finished=T + timedelta(hours=1),
                         metrics={"gpu_utilization": distribution([mean], [1.0])})

    assert gpu_hours(job(1e18)) == (8.0, 8.0), "two pods of four GPUs, busy at most"
    assert gpu_hours(job(-5.0)) == (8.0, 0.0)
    assert gpu_hours(job(0.5)) == (8.0, 1.0)


def test_a_history_of_many_families_plots_those_that_asked_the_most(tmp_path: Path) -> None:
    """One row per family made a history of 1,700 families a 990 x 65,653 pixel image (about 260 MB raster)."""
    import matplotlib.pyplot as plt

    from kubecell.profiler.distribution import distribution
    from kubecell.profiler.history import JobRecord
    from kubecell.profiler.report import MAX_GROUPS_PLOTTED, write_report

    records = [JobRecord(uid=f"u{i}", namespace="ns", owner_kind="Job", owner_name=f"family{i}-x", created=T,
                         pod_count=1 + i % 3, gpus_per_pod=1, milli_gpu_per_pod=1000, started=T,
                         finished=T + timedelta(hours=1), vc="a",
                         metrics={"gpu_utilization": distribution([0.5], [1.0])})
               for i in range(3 * MAX_GROUPS_PLOTTED)]
    page = write_report(records, tmp_path / "report")
    height = plt.imread(tmp_path / "report" / "asked-used.png").shape[0]
    assert height <= (0.35 * (MAX_GROUPS_PLOTTED + 1) + 1.5) * 110 + 1, height
    assert "asked the most" in page.read_text()
