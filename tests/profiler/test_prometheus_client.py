"""The PromQL client against a real Prometheus (backfilled with a few series) and against servers that fail:
every failure is a PrometheusError naming the query, raw samples come back exactly as stored."""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest

from kubecell.core.errors import KubecellError
from kubecell.profiler.prometheus import Prometheus, PrometheusError, quote
from tests.profiler.prometheus_server import BASE_TIME, Family, backfilled
from tests.support import loopback_http

GAUGE = "kubecell_node_gpu_pod_utilization_ratio"
LABELS = {"pod": "p", "namespace": "ns", "node": "n1", "gpu": "GPU-0"}
MINUTES = 180
SAMPLES = [(float(BASE_TIME + 60 * i), (i % 17) / 16) for i in range(MINUTES)]
NAN_SERIES = [(float(BASE_TIME + 60 * i), math.nan) for i in range(5)]
ODD_LABELS = {"pod": "odd", "namespace": "elsewhere", "node": "n1", "gpu": "GPU-\ufffd"}
"""A label holding U+FFFD, which PromQL's lexer takes for a bad byte where it stands in a string literal."""


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    families = [Family(GAUGE, "gauge", [(LABELS, SAMPLES), ({**LABELS, "pod": "broken"}, NAN_SERIES),
                                        (ODD_LABELS, SAMPLES[:3])])]
    with backfilled(Path(tmp_path_factory.mktemp("client")), families) as url:
        yield url


def test_raw_samples_are_the_stored_ones_once_each_across_chunks(prometheus: str) -> None:
    client = Prometheus(prometheus)
    end = SAMPLES[-1][0]
    # chunks of 10 minutes: every chunk boundary falls on a sample, which must come back once
    (series,) = client.raw(f'{GAUGE}{{pod="p"}}', SAMPLES[0][0], end, chunk=600)
    assert list(series.samples) == SAMPLES
    assert series.labels == {"__name__": GAUGE, **LABELS}
    # a window is inclusive at both ends and holds nothing outside
    (window,) = client.raw(f'{GAUGE}{{pod="p"}}', SAMPLES[10][0], SAMPLES[20][0], chunk=7)
    assert list(window.samples) == SAMPLES[10:21]
    assert client.raw(f'{GAUGE}{{pod="p"}}', end + 1, end + 3600) == []


def test_instant_queries_and_series(prometheus: str) -> None:
    client = Prometheus(prometheus)
    (scalar,) = client.query("1 + 1")
    assert scalar.labels == {}
    assert scalar.samples[0][1] == 2.0
    at = SAMPLES[30][0]
    (vector,) = client.query(f'{GAUGE}{{pod="p"}}', at)
    assert vector.samples == ((at, SAMPLES[30][1]),)
    listed = client.series(f'{GAUGE}{{namespace="ns"}}', SAMPLES[0][0], SAMPLES[-1][0])
    assert sorted(s["pod"] for s in listed) == ["broken", "p"]


def test_a_label_holding_the_replacement_character_is_quoted_as_promql_reads_it(prometheus: str) -> None:
    (series,) = Prometheus(prometheus).raw(f"{GAUGE}{{gpu={quote(ODD_LABELS['gpu'])}}}", SAMPLES[0][0],
                                           SAMPLES[-1][0])
    assert series.labels == {"__name__": GAUGE, **ODD_LABELS}
    assert list(series.samples) == SAMPLES[:3]


def test_bad_promql_names_the_query(prometheus: str) -> None:
    with pytest.raises(PrometheusError, match=r"sum\(rate\(x\[5m\]\) by") as caught:
        Prometheus(prometheus).query("sum(rate(x[5m]) by")
    assert isinstance(caught.value, KubecellError)
    assert "HTTP 400" in caught.value.reason
    assert "bad_data" in caught.value.reason
    with pytest.raises(PrometheusError, match="not-a-selector"):
        Prometheus(prometheus).series("not-a-selector{")


def test_nan_and_infinite_values_are_refused_unless_asked_for(prometheus: str) -> None:
    client = Prometheus(prometheus)
    with pytest.raises(PrometheusError, match=r"\+Inf.*not a finite number"):
        client.query("1 / 0")
    with pytest.raises(PrometheusError, match="NaN"):
        client.raw(f'{GAUGE}{{pod="broken"}}', NAN_SERIES[0][0], NAN_SERIES[-1][0])
    (series,) = client.raw(f'{GAUGE}{{pod="broken"}}', NAN_SERIES[0][0], NAN_SERIES[-1][0], finite=False)
    assert len(series.samples) == 5
    assert all(math.isnan(v) for _, v in series.samples)


def test_a_closed_port_is_an_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # the port was free a moment ago and nothing listens on it now
    with pytest.raises(PrometheusError, match="cannot reach Prometheus") as caught:
        Prometheus(f"http://127.0.0.1:{port}", timeout=2).query("up")
    assert caught.value.query == "up"


def test_a_silent_server_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts the connection in the kernel, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(PrometheusError, match=r"no answer within 0\.5 s"):
            Prometheus(url, timeout=0.5).query("up")


class Canned(BaseHTTPRequestHandler):
    """Answers every POST with the status and body its path names."""

    ANSWERS: ClassVar[dict[str, tuple[int, str, bytes]]] = {
        "/unavailable/api/v1/query": (503, "text/plain", b"service unavailable"),
        "/broken/api/v1/query": (200, "application/json", b'{"status": "success", "data": {"resultT'),
        "/odd/api/v1/query": (200, "application/json",
                              b'{"status": "success", "data": {"resultType": "vector", '
                              b'"result": [{"metric": {}, "value": [1, "many"]}]}}'),
        "/error/api/v1/query": (422, "application/json",
                                b'{"status": "error", "errorType": "execution", "error": "too many samples"}'),
    }

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        status, kind, body = self.ANSWERS.get(self.path, (404, "text/plain", b"no such path"))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[str]:
    with loopback_http(Canned) as url:
        yield url


@pytest.mark.parametrize(("path", "reason"), [
    ("unavailable", r"HTTP 503, not the API's JSON: 'service unavailable'"),
    ("broken", "HTTP 200, not the API's JSON"),
    ("odd", r"malformed sample \[1, 'many'\]"),
    ("error", "HTTP 422, execution: too many samples"),
])
def test_server_errors_and_malformed_bodies(canned: str, path: str, reason: str) -> None:
    with pytest.raises(PrometheusError, match=reason) as caught:
        Prometheus(f"{canned}/{path}", timeout=5).query("up")
    assert "'up'" in str(caught.value)
