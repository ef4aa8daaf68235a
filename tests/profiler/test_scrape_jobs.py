"""A tenant's pod that exports the profiler's series under its own name, on a real Prometheus: where tenants'
pods are scraped too, the pod's usage reads as the higher of the node agent's and its own (the two are one
measurement read by two scrapes; or, without the agent, as its own alone). With ``--scrape-job``, only the named
scrape jobs' series are read, and every answer is checked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from kubecell.cli.main import app
from kubecell.core.errors import KubecellError
from kubecell.profiler.collect import Job, collect
from kubecell.profiler.prometheus import Prometheus
from kubecell.profiler.sources import GPU_UTILIZATION
from tests.profiler.prometheus_server import BASE_TIME, Family, backfilled
from tests.support import loopback_http

NS = "team-a"
AGENT = "kubecell-node-agent"
DCGM = "dcgm-exporter"
TENANT_PODS = "kubernetes-pods"  # the usual scrape job of annotated pods: the tenant's own exporter
T = [float(BASE_TIME + 60 * i) for i in range(10)]
END = T[-1]
GAUGE = GPU_UTILIZATION.sources[0].name
DCGM_GAUGE = GPU_UTILIZATION.sources[1].name


def families() -> list[Family]:
    gpu = {"node": "n1", "gpu": "GPU-0"}
    return [
        Family(GAUGE, "gauge", [
            # "measured": the agent's reading of the pod on its node
            ({"pod": "measured", "namespace": NS, **gpu, "job": AGENT}, [(t, 0.2) for t in T]),
            # the pod's own exporter, scraped as a target: its series say the same pod, another job
            ({"pod": "measured", "namespace": NS, **gpu, "job": TENANT_PODS, "instance": "10.0.0.9:8000"},
             [(t, 0.9) for t in T]),
            # "hiding": the pod's own exporter says it is idle, to look like a light partner
            ({"pod": "hiding", "namespace": NS, **gpu, "job": AGENT}, [(t, 0.8) for t in T]),
            ({"pod": "hiding", "namespace": NS, **gpu, "job": TENANT_PODS, "instance": "10.0.0.9:8000"},
             [(t, 0.0) for t in T]),
            # "dcgm-only": on a node without the agent, the pod's own series would come first
            ({"pod": "dcgm-only", "namespace": NS, **gpu, "job": TENANT_PODS, "instance": "10.0.0.9:8000"},
             [(t, 0.01) for t in T]),
            # a scrape job whose name a regex would match without being it
            ({"pod": "lookalike", "namespace": NS, **gpu, "job": "kubecell-node-agentX"}, [(t, 0.7) for t in T]),
            ({"pod": "lookalike", "namespace": NS, **gpu, "job": "a.b"}, [(t, 0.3) for t in T]),
        ]),
        Family(DCGM_GAUGE, "gauge", [
            ({"pod": "dcgm-only", "namespace": NS, **gpu, "job": DCGM}, [(t, 80.0) for t in T]),
        ]),
    ]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with backfilled(Path(tmp_path_factory.mktemp("scrape-jobs")), families()) as base:
        yield base


def utilization(client: Prometheus, pod: str) -> tuple[str, float]:
    profile = collect(client, Job(NS, (pod,), T[0], END), (GPU_UTILIZATION,), chunk=180)
    found = profile.metrics["gpu_utilization"]
    distribution = found.pods[pod]
    assert distribution is not None
    return found.series[pod].source, distribution.mean


def test_every_scrape_job_is_read_by_default_so_a_pod_can_raise_its_own_usage(url: str) -> None:
    """What the option is for: the exposure as it is without it. The agent's series and the pod's differ only
    in ``job`` and ``instance``: one measurement, the higher reading kept (summed, as before, it read 1.1). A
    pod cannot read lower than the agent says by exporting less."""
    assert utilization(Prometheus(url), "measured") == (GAUGE, pytest.approx(0.9))
    assert utilization(Prometheus(url), "hiding") == (GAUGE, pytest.approx(0.8))
    assert utilization(Prometheus(url), "dcgm-only") == (GAUGE, pytest.approx(0.01))


def test_only_the_named_scrape_jobs_are_read(url: str) -> None:
    client = Prometheus(url, scrape_jobs=(AGENT, DCGM))
    assert utilization(client, "measured") == (GAUGE, pytest.approx(0.2))
    assert utilization(client, "hiding") == (GAUGE, pytest.approx(0.8))
    # the pod's own kubecell series are not the agent's: dcgm-exporter's reading is the one kept
    assert utilization(client, "dcgm-only") == (DCGM_GAUGE, pytest.approx(0.8))
    listed = client.series(f'{GAUGE}{{namespace="{NS}"}}', T[0], END)
    assert {labels["job"] for labels in listed} == {AGENT}


def test_a_scrape_job_is_matched_whole_and_literally(url: str) -> None:
    assert Prometheus(url, scrape_jobs=(AGENT,)).raw(f'{GAUGE}{{pod="lookalike"}}', T[0], END) == []
    (series,) = Prometheus(url, scrape_jobs=("a.b",)).raw(f'{GAUGE}{{pod="lookalike"}}', T[0], END)
    assert series.labels["job"] == "a.b"
    assert Prometheus(url, scrape_jobs=("a.b",)).raw(f"{GAUGE}{{}}", T[0], END)[0].labels["job"] == "a.b"


class IgnoresMatchers(BaseHTTPRequestHandler):
    """A Prometheus behind a proxy that answers every query with one series of another scrape job."""

    answer: ClassVar[bytes] = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": GAUGE, "pod": "measured", "namespace": NS, "job": TENANT_PODS},
         "values": [[T[0], "0.9"]]}]}}).encode()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_answer_from_another_scrape_job_is_dropped_even_if_the_server_ignores_the_matcher() -> None:
    with loopback_http(IgnoresMatchers) as base:
        assert len(Prometheus(base).raw(f'{GAUGE}{{pod="measured"}}', T[0], T[0] + 60)) == 1
        assert Prometheus(base, scrape_jobs=(AGENT,)).raw(f'{GAUGE}{{pod="measured"}}', T[0], T[0] + 60) == []


@pytest.mark.parametrize("job", ["", "  ", "\ud800"])
def test_a_scrape_job_that_names_nothing_is_refused(job: str) -> None:
    with pytest.raises(KubecellError, match=r"scrape job|Unicode"):
        Prometheus("http://127.0.0.1:9", scrape_jobs=(job,))


def test_the_cli_refuses_an_empty_scrape_job_before_reading_anything(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["profile", "collect", "--prometheus", "http://127.0.0.1:9",
                                      "--db", f"sqlite:///{tmp_path / 'h.db'}", "--scrape-job", ""])
    assert result.exit_code != 0
    assert "--scrape-job" in result.output
    assert "non-empty" in result.output
    assert not (tmp_path / "h.db").exists()
