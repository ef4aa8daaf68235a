"""A real Prometheus holding series a test or a bench chose: written as OpenMetrics, backfilled into TSDB blocks
with ``promtool tsdb create-blocks-from openmetrics``, served by ``prometheus`` on 127.0.0.1 with no scrape
targets (or scraping the loopback targets given).

OpenMetrics as promtool reads it: a ``# TYPE`` line per family (a counter's family name without its ``_total``),
each family's samples together, each series' samples in time order, timestamps in seconds, a final ``# EOF``.
The server keeps blocks for 100 years: backfilled data is old by nature and the default 15 days would delete it
at start-up. Every wait is bounded; the server is terminated (``processes.terminate``) when the caller is
done. Where the binaries are absent, :class:`PrometheusMissingError` says which (the test suite turns it into a skip).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kubecell.core.errors import KubecellError
from kubecell.profiler.prometheus import Prometheus, Series
from kubecell.testbed.processes import TestbedError, free_port, terminate, wait_http

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
BACKFILL_TIMEOUT = 120.0
READY_TIMEOUT = 30.0
BASE_TIME = 1_767_225_600
"""2026-01-01T00:00:00Z: where tests and benches put the start of anonymized series (fixed, so runs are reproducible;
in the past, so Prometheus treats the blocks as history)."""


@dataclass(frozen=True)
class Family:
    """One metric family: its series' labels and ``(unix seconds, value)`` samples."""

    name: str
    kind: Literal["gauge", "counter"]
    series: Sequence[tuple[Mapping[str, str], Sequence[tuple[float, float]]]]


class PrometheusMissingError(KubecellError):
    """The prometheus or promtool binary is not installed."""


class PrometheusRunError(KubecellError):
    """promtool or prometheus ran and failed (the message holds their output's tail)."""


def binaries() -> tuple[str, str]:
    """The prometheus and promtool binaries; :class:`PrometheusMissingError` names the one absent."""
    for path in (PROMETHEUS, PROMTOOL):
        if shutil.which(path) is None:
            raise PrometheusMissingError(f"{path} absent: install Debian's prometheus package "
                                        "(apt-get install prometheus)")
    return PROMETHEUS, PROMTOOL


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))  # the shortest text that reads back as the same float


def write_openmetrics(path: Path, families: Iterable[Family]) -> None:
    with path.open("w") as out:
        for family in families:
            if family.kind == "counter" and not family.name.endswith("_total"):
                raise ValueError(f"a counter's samples end in _total: {family.name}")
            out.write(f"# TYPE {family.name.removesuffix('_total') if family.kind == 'counter' else family.name} "
                      f"{family.kind}\n")
            for labels, samples in family.series:
                text = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
                head = f"{family.name}{{{text}}}" if text else family.name
                for at, value in sorted(samples):
                    out.write(f"{head} {_number(value)} {at!r}\n")
        out.write("# EOF\n")


def backfill(openmetrics: Path, data: Path) -> None:
    """TSDB blocks in ``data`` from an OpenMetrics file (bounded: a hung promtool fails the caller)."""
    _, promtool = binaries()
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics),
                           str(data)], capture_output=True, text=True, timeout=BACKFILL_TIMEOUT, check=False)
    if done.returncode != 0:
        raise PrometheusRunError(f"promtool backfill of {openmetrics} failed ({done.returncode}): "
                             f"{done.stderr[-2000:]}{done.stdout[-2000:]}")


@contextmanager
def serve(data: Path, scrape: Sequence[str] = (), *, remote_read: str | None = None) -> Iterator[str]:
    """Prometheus over the TSDB in ``data`` on a free 127.0.0.1 port: yields its base URL once ready. With
    ``scrape`` (``127.0.0.1:PORT`` targets), it scrapes them every second, as it would a node agent. With
    ``remote_read`` (another Prometheus' base URL), it also answers from that one's samples, as a Prometheus in
    front of a long-term store (Thanos, Cortex) does."""
    prometheus, _ = binaries()
    config = data.parent / f"{data.name}-prometheus.yml"
    if scrape:
        targets = ", ".join(f"'{target}'" for target in scrape)
        text = ("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n"
                f"  - job_name: agents\n    static_configs: [{{targets: [{targets}]}}]\n")
    else:
        text = "global:\n  scrape_interval: 1m\nscrape_configs: []\n"
    if remote_read is not None:
        text += f"remote_read:\n  - url: {remote_read}/api/v1/read\n    read_recent: true\n    remote_timeout: 5s\n"
    config.write_text(text)
    log_path = data.parent / f"{data.name}-prometheus.log"
    for _attempt in range(3):  # another process may take the free port between the probe and the bind
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [prometheus, f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
                 f"--config.file={config}", "--storage.tsdb.retention.time=100y", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            try:
                wait_http(f"{url}/-/ready", process=process, log=log_path, timeout=READY_TIMEOUT)
            except TestbedError as error:
                if process.poll() is not None and "address already in use" in log_path.read_text(errors="replace"):
                    continue
                raise PrometheusRunError(f"prometheus not ready: {error}") from None
            yield url
            return
        finally:
            terminate(process)
    raise PrometheusRunError(f"prometheus found no free port: {log_path.read_text(errors='replace')[-2000:]}")


@contextmanager
def backfilled(directory: Path, families: Iterable[Family]) -> Iterator[str]:
    """A Prometheus holding ``families`` (written and backfilled under ``directory``): yields its base URL."""
    binaries()
    directory.mkdir(parents=True, exist_ok=True)
    source, data = directory / "series.om.txt", directory / "data"
    write_openmetrics(source, families)
    backfill(source, data)
    with serve(data) as url:
        yield url


class CountingPrometheus(Prometheus):
    """The profiler's client of a testbed Prometheus, keeping every query it sends (each ``raw`` chunk is one),
    so a test or bench can say how many queries a pass made, and which."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.queries: list[str] = []

    def query(self, promql: str, at: float | None = None, *, finite: bool = True) -> list[Series]:
        self.queries.append(promql)
        return super().query(promql, at, finite=finite)
