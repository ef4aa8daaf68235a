"""A Prometheus that answers only part of a query: its long-term store (``remote_read``: Thanos, Cortex, another
Prometheus) is down, so it answers ``success`` with what its local TSDB holds and a ``warnings`` list. A
finished job's record is made once and then kept as it is (``profile_jobs``), so a record made from such an
answer would keep half of the job's life for good: the job is not saved, and the next pass reads it again.

Two real Prometheus servers on loopback: the long-term one holds the job's first hour, the local one its second
hour and reads the first through ``remote_read``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kubecell.profiler.history import JobHistory
from kubecell.profiler.jobs import group_pods
from kubecell.profiler.prometheus import Prometheus, PrometheusError
from kubecell.profiler.run import profile_jobs
from kubecell.testbed import prometheus as real
from tests.profiler.prometheus_server import BASE_TIME, Family, backfilled

START = datetime.fromtimestamp(BASE_TIME, UTC)
GAUGE = "kubecell_node_gpu_pod_utilization_ratio"
LABELS = {"pod": "p", "namespace": "ns", "node": "n1", "gpu": "GPU-0"}
FIRST_HOUR = [(float(BASE_TIME + 60 * i), 0.25) for i in range(60)]
SECOND_HOUR = [(float(BASE_TIME + 3600 + 60 * i), 0.75) for i in range(60)]


def stamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def finished_pod() -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "creationTimestamp": stamp(START)},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "img:1", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Succeeded", "startTime": stamp(START),
                       "containerStatuses": [{"state": {"terminated": {
                           "finishedAt": stamp(START + timedelta(hours=2))}}}]}}


@contextlib.contextmanager
def reading_remotely(directory: Path, remote: str) -> Iterator[str]:
    """A Prometheus holding the job's second hour, reading the rest from ``remote`` (``remote_read``)."""
    directory.mkdir(parents=True, exist_ok=True)
    source, data = directory / "series.om.txt", directory / "data"
    real.write_openmetrics(source, [Family(GAUGE, "gauge", [(LABELS, SECOND_HOUR)])])
    real.backfill(source, data)
    with real.serve(data, remote_read=remote) as url:
        yield url


def test_a_job_answered_in_part_is_not_saved_and_is_read_again(tmp_path: Path) -> None:
    now = START + timedelta(hours=3)
    with contextlib.ExitStack() as long_term:
        remote = long_term.enter_context(
            backfilled(tmp_path / "long-term", [Family(GAUGE, "gauge", [(LABELS, FIRST_HOUR)])]))
        with reading_remotely(tmp_path / "local", remote) as url:
            # both stores up: the job's whole life, as the setup is meant to read it
            with JobHistory.open(f"sqlite:///{tmp_path / 'whole.db'}") as history:
                done = profile_jobs(group_pods([finished_pod()]), Prometheus(url), history, now=now)
            (whole,) = done.saved
            assert whole.metrics["gpu_utilization"].samples == 120

            long_term.close()  # the long-term store goes down: the local one answers its own hour, and warns
            with JobHistory.open(f"sqlite:///{tmp_path / 'partial.db'}") as history:
                done = profile_jobs(group_pods([finished_pod()]), Prometheus(url), history, now=now)
                assert done.saved == ()
                assert [uid for uid, _ in done.refused] == ["uid-p"]
                assert "remote_read" in done.refused[0][1]
                assert history.get("uid-p") is None, "nothing kept that a later pass would not read again"
            with pytest.raises(PrometheusError, match="remote_read") as caught:
                Prometheus(url).raw(f'{GAUGE}{{pod="p"}}', BASE_TIME, BASE_TIME + 7200)
            assert caught.value.refused, "a partial answer costs the job that asked, not the pass"
