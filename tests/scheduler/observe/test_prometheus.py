"""A real Prometheus server (Debian's ``prometheus``) scrapes a running kubecell scheduler on the testbed, and a
PromQL query returns the per-VC GPUs the allocation records on the API server imply.

The scheduler's metrics are served here by a loopback ``http.server`` around ``Metrics.render`` (the
same bytes the scheduler's own ``/metrics`` returns), so the test depends on the metrics, not on the HTTP
stack in front of them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from kubecell.kube.rest import Kube
from kubecell.scheduler.observe.metrics import Metrics
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.observe.test_metrics import records, two_vc_scheduler

PROMETHEUS = "/usr/bin/prometheus"
QUERY_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def serve_metrics(metrics: Metrics) -> Iterator[int]:
    """``/metrics`` on a loopback port (yielded), stopped on exit."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = metrics.render() if self.path == "/metrics" else b"not found"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, name="test-metrics", daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def prometheus(directory: Path, target_port: int) -> Iterator[str]:
    """A Prometheus server on loopback scraping ``127.0.0.1:target_port`` every second; yields its URL."""
    port = free_port()
    config = directory / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: kubecell\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n")
    log = (directory / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def query(url: str, promql: str) -> list[dict[str, Any]] | None:
    """The instant vector of ``promql``, or None while Prometheus is not answering yet."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}",
                                    timeout=5) as answer:
            data = json.load(answer)
    except OSError:
        return None
    if data.get("status") != "success":
        return None
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


@pytest.mark.skipif(shutil.which(PROMETHEUS) is None,
                    reason=f"{PROMETHEUS} is absent: install Debian's 'prometheus' package to run this test")
def test_prometheus_scrapes_the_scheduler_and_promql_returns_the_per_vc_gpus(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler],
        tmp_path: Path) -> None:
    with two_vc_scheduler(testbed, kube, namespace, start_scheduler) as running:
        want: dict[str, float] = defaultdict(float)
        for record in records(kube, namespace):
            want[record.vc] += sum(gpu.milli for gpu in record.gpus) / 1000
        assert set(want) == {"alpha", "beta"}
        with serve_metrics(Metrics(running.scheduler, None)) as port, prometheus(tmp_path, port) as url:
            got: dict[str, float] = {}
            deadline = time.monotonic() + QUERY_TIMEOUT
            while time.monotonic() < deadline:
                result = query(url, "sum by (vc) (kubecell_vc_allocated_gpus)") or []
                got = {r["metric"]["vc"]: float(r["value"][1]) for r in result}
                if got.keys() == want.keys() and all(abs(got[vc] - want[vc]) < 1e-6 for vc in want):
                    break
                time.sleep(0.5)
            assert got == pytest.approx(dict(want)), (
                f"PromQL gave {got}, the records say {dict(want)}; Prometheus log:\n"
                + (tmp_path / "prometheus.log").read_text()[-3000:])
            guaranteed = {r["metric"]["vc"]: float(r["value"][1])
                          for r in query(url, "kubecell_vc_guaranteed_gpus") or []}
            assert guaranteed == {"alpha": 16.0, "beta": 8.0}
            up = query(url, 'up{job="kubecell"}') or []
            assert [float(r["value"][1]) for r in up] == [1.0]
