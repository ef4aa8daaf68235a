"""A small PromQL client over Prometheus' HTTP API: instant queries, raw samples, series listings.

The profiler needs the samples a series really has, at the times they were taken: ``query_range`` would
resample every step with the lookback delta (5 min by default), so it repeats a sample across a missed scrape,
invents samples for the minutes after a pod stopped, and weights every step equally. So raw samples are read
with a range-vector selector (``metric{...}[1h]``) evaluated as an instant query, one window at a time so that
no response grows with the job's length; neighbouring windows overlap by a millisecond (Prometheus 2 includes
the range's left edge, Prometheus 3 does not) and a sample seen twice is kept once.

Where the series a tenant's own pods export are scraped too (a ``kubernetes-pods`` scrape job), a tenant could
export the profiler's series under its own pod's name: its usage would read as the higher of the node agent's
series and its own at each scrape (``collect.one_per_measurement`` counts one measurement scraped twice once), or,
on a cluster without the agent, as its own alone. ``scrape_jobs`` names the scrape jobs
the profiler believes (the ``job`` label Prometheus sets on every series of a target, which a target cannot
set unless its scrape job honours its labels): every selector is read within them, and every answer is checked
against them.

Every call has a timeout, and every failure (no connection, an HTTP error with Prometheus' ``error`` field, a
body that is not the API's JSON, an answer too large to hold, an answer with ``warnings`` (a store failed, so it is
partial), a series or sample that is not what the API gives, a NaN or infinite value where a number was needed)
is a :class:`PrometheusError` naming the query, so a caller can report it for the job it was profiling; those
that are this query's answer's fault, not Prometheus', are :attr:`PrometheusError.refused`.

Only float samples are read. A series answered with native histograms (``histograms``, not ``values``: a
tenant's pod can export one of the profiler's series names as a native histogram) is no error: it comes back
with its histograms' times (:attr:`Series.histograms`) and no samples, for the caller to tell.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from kubecell.core.errors import KubecellError

DEFAULT_TIMEOUT = 10.0
"""Seconds for connecting and for each read of one call: a local Prometheus answers in milliseconds."""
DEFAULT_CHUNK = 3600.0
"""Seconds of samples fetched per query: an hour of 15-s scrapes is 240 samples per series."""
MAX_ANSWER_BYTES = 32 * 2**20
"""The largest answer read (after decompression). A query of 100 pods on 8 GPUs each for an hour of 15-s scrapes
is about 5 MB; a series set far larger is a label-cardinality bomb (an exporter, or a tenant's pod scraped under
these names, writing a million label values for one pod), and parsed it would take several times its size in
memory: the profiler's Deployment (512 MiB) would be killed at every pass, and no job profiled. Over this, the
query is refused as Prometheus refuses one (:attr:`PrometheusError.refused`): that job alone is not saved."""

Sample = tuple[float, float]
"""(unix seconds, value)."""


class PrometheusError(KubecellError):
    """A query Prometheus did not answer, refused, or answered with something that is not a usable number."""

    def __init__(self, url: str, query: str, reason: str, *, status: int | None = None,
                 too_large: bool = False, partial: bool = False, malformed: bool = False) -> None:
        self.url = url
        self.query = query
        self.reason = reason
        self.status = status
        """The HTTP status of Prometheus' answer (None: no answer). A 4xx is this query's fault (a value in it,
        or its answer too large), not Prometheus': the caller may go on with other queries."""
        self.too_large = too_large
        """The answer was over :data:`MAX_ANSWER_BYTES`: this query's series, not Prometheus', are at fault."""
        self.partial = partial
        """Prometheus answered with warnings: a store it reads (``remote_read``, a Thanos store) failed, so the
        samples may be only part of what it keeps. Another query (another time range) may be answered whole."""
        self.malformed = malformed
        """The answer was the API's JSON, but a series or sample in it was not what the API gives (a value that is
        not a number, or not a finite one where one was needed; a series without labels or samples): the series
        this query matched are at fault (a broken exporter or proxy), not Prometheus'."""
        super().__init__(f"prometheus {url}: query {query!r}: {reason}")

    @property
    def refused(self) -> bool:
        """Whether Prometheus answered and refused this query (400, 422), its answer was too large to read, it
        answered only in part, or its answer held a series or sample that is no usable number: another query
        may still be answered."""
        return self.too_large or self.partial or self.malformed or \
            (self.status is not None and 400 <= self.status < 500)


@dataclass(frozen=True)
class Series:
    """One series' labels (``__name__`` included) and its float samples, in time order, and the times of its
    native-histogram samples, which are not read (:attr:`histograms`)."""

    labels: Mapping[str, str]
    samples: tuple[Sample, ...]
    histograms: tuple[float, ...] = ()
    """The times (unix seconds, in order) of the series' native-histogram samples: no float to read. A series
    the profiler reads answered so is not the exporter's gauge (a tenant's pod exporting its name as a native
    histogram, say): the caller skips them and says so."""


def quote(text: str) -> str:
    """``text`` as a PromQL string literal (JSON's escapes are a subset of what PromQL accepts).

    Characters beyond ASCII are written as themselves: JSON would write one outside the Basic Multilingual
    Plane as a surrogate pair (``\\ud83d\\ude00``), which PromQL's lexer refuses, failing the whole query. All
    but U+FFFD, which the lexer takes for a byte that is not UTF-8 ("invalid UTF-8 rune") where it stands as
    itself, so it is escaped. Text that is not valid Unicode (a lone surrogate, from a hand-edited annotation)
    cannot be any label's value, and is refused here with a :class:`~kubecell.core.errors.KubecellError`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise KubecellError(f"not valid Unicode, so no series' label: {text!r}") from None
    return json.dumps(text, ensure_ascii=False).replace("\ufffd", "\\ufffd")


def regex_literal(text: str) -> str:
    """``text`` matched literally by an RE2 regex (pod names may hold dots)."""
    return "".join(f"\\{c}" if c in r"\.+*?()|[]{}^$" else c for c in text)


def duration(seconds: float) -> str:
    """A PromQL duration in whole milliseconds (the TSDB's resolution): ``3600000ms``."""
    millis = round(seconds * 1000)
    if millis <= 0:
        raise ValueError(f"a range must be at least 1 ms, got {seconds} s")
    return f"{millis}ms"


class Prometheus:
    """The HTTP API at ``url`` (``http://host:9090``, a path prefix allowed)."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT, session: requests.Session | None = None,
                 max_answer_bytes: int = MAX_ANSWER_BYTES, scrape_jobs: Sequence[str] = ()) -> None:
        if timeout <= 0:
            raise KubecellError(f"prometheus {url}: timeout must be > 0 seconds, got {timeout}")
        for job in scrape_jobs:
            if not job.strip():
                raise KubecellError(f"prometheus {url}: a scrape job is named by a non-empty text, got {job!r}")
            quote(job)  # valid Unicode, or no series' label
        self.scrape_jobs = frozenset(scrape_jobs)
        """The scrape jobs whose series are read (empty: every job's)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()
        self.max_answer_bytes = max_answer_bytes

    # ---------------------------------------------------------------------------------------- the API
    def _call(self, path: str, query: str, form: Sequence[tuple[str, str]]) -> Any:
        """POST ``form`` to ``/api/v1/<path>`` (a form body: a job's pod regex can be longer than a URL may be)
        and return the ``data`` of a successful answer."""
        try:
            with self.session.post(f"{self.url}/api/v1/{path}", data=list(form), timeout=self.timeout,
                                   stream=True) as response:
                content = self._body(response, query)
        except requests.Timeout:
            raise PrometheusError(self.url, query, f"no answer within {self.timeout} s") from None
        except requests.RequestException as error:
            raise PrometheusError(self.url, query, f"cannot reach Prometheus: {error}") from None
        try:
            body = json.loads(content)
        except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep, no API's answer
            body = None
        if not isinstance(body, dict):
            snippet = content[:200].decode("utf-8", "replace").strip()
            raise PrometheusError(self.url, query, f"HTTP {response.status_code}, not the API's JSON: {snippet!r}")
        if response.status_code != 200 or body.get("status") != "success":
            kind, reason = body.get("errorType", "error"), body.get("error", "no error given")
            raise PrometheusError(self.url, query, f"HTTP {response.status_code}, {kind}: {reason}",
                                  status=response.status_code)
        if "data" not in body:
            raise PrometheusError(self.url, query, "a successful answer without data")
        warnings = body.get("warnings")
        if warnings:
            # samples as stored are all this client reads, and a raw selector draws no PromQL warning: one here is
            # a store that failed (Prometheus' remote_read, a Thanos store with partial responses), and an answer
            # without its samples would be kept as the job's whole life
            said = "; ".join(str(warning) for warning in warnings) if isinstance(warnings, list) else str(warnings)
            raise PrometheusError(self.url, query, f"a partial answer, Prometheus warns: {said[:1000]}",
                                  status=response.status_code, partial=True)
        return body["data"]

    def _body(self, response: requests.Response, query: str) -> bytes:
        """The answer's body (decompressed, so a gzip bomb counts at its real size), at most
        :attr:`max_answer_bytes` of it; a larger one is a :class:`PrometheusError` (see :data:`MAX_ANSWER_BYTES`)."""
        parts: list[bytes] = []
        size = 0
        for part in response.iter_content(chunk_size=65536):
            size += len(part)
            if size > self.max_answer_bytes:
                raise PrometheusError(self.url, query, f"HTTP {response.status_code}, an answer over "
                                      f"{self.max_answer_bytes} bytes (too many series or samples for one query): "
                                      "not read", status=response.status_code, too_large=True)
            parts.append(part)
        return b"".join(parts)

    def _number(self, query: str, pair: Any, *, finite: bool) -> Sample:
        """A ``[<unix seconds>, "<value>"]`` pair; NaN and infinities refused unless ``finite`` is False."""
        try:
            at, text = pair
            value = float(text)
            sample = (float(at), value)
        except (TypeError, ValueError):
            raise PrometheusError(self.url, query, f"malformed sample {str(pair)[:200]}",
                                  malformed=True) from None
        if finite and not math.isfinite(value):
            raise PrometheusError(self.url, query, f"value {text} at {at} is not a finite number", malformed=True)
        return sample

    def _histogram_times(self, query: str, pairs: list[Any]) -> tuple[float, ...]:
        """The times of native-histogram samples (``[<unix seconds>, {...}]``; the histogram is not read)."""
        try:
            times = tuple(float(at) for at, _ in pairs)
        except (TypeError, ValueError):
            raise PrometheusError(self.url, query, f"malformed histogram samples {str(pairs)[:200]}",
                                  malformed=True) from None
        if not all(math.isfinite(at) for at in times):
            raise PrometheusError(self.url, query, f"malformed histogram samples {str(pairs)[:200]}",
                                  malformed=True)
        return times

    def _labels(self, query: str, item: Any) -> dict[str, str]:
        labels = item.get("metric") if isinstance(item, dict) else None
        if not isinstance(labels, dict):
            raise PrometheusError(self.url, query, f"malformed result {str(item)[:200]}", malformed=True)
        return {str(k): str(v) for k, v in labels.items()}

    def query(self, promql: str, at: float | None = None, *, finite: bool = True) -> list[Series]:
        """An instant query: a vector gives one single-sample series per element, a scalar one series without
        labels, a matrix (a range selector) every sample of each series. A native histogram's samples are not
        read: their times are its series' :attr:`Series.histograms`."""
        form = [("query", promql)] + ([("time", f"{at:.3f}")] if at is not None else [])
        data = self._call("query", promql, form)
        kind = data.get("resultType") if isinstance(data, dict) else None
        result = data.get("result") if isinstance(data, dict) else None
        if kind == "scalar":
            return [Series({}, (self._number(promql, result, finite=finite),))]
        if kind not in ("vector", "matrix") or not isinstance(result, list):
            raise PrometheusError(self.url, promql, f"result of type {kind!r}, expected a vector, matrix or scalar")
        found: list[Series] = []
        for item in result:
            labels = self._labels(promql, item)
            if kind == "vector":
                pairs = [item["value"]] if "value" in item else None
                histograms = [item["histogram"]] if "histogram" in item else None
            else:
                pairs, histograms = item.get("values"), item.get("histograms")
            if (pairs is None and histograms is None) or not all(isinstance(part, list | None)
                                                                 for part in (pairs, histograms)):
                raise PrometheusError(self.url, promql, f"malformed result {str(item)[:200]}", malformed=True)
            found.append(Series(labels, tuple(self._number(promql, p, finite=finite) for p in pairs or ()),
                                self._histogram_times(promql, histograms or [])))
        return found

    def raw(self, selector: str, start: float, end: float, *, chunk: float = DEFAULT_CHUNK,
            finite: bool = True) -> list[Series]:
        """Every sample of the series ``selector`` matches with ``start <= time <= end``, as stored (no
        resampling, no lookback), sorted by labels and time. ``finite=False`` keeps NaN and infinities for a
        caller that reports them per series instead of failing the whole query. A series with native-histogram
        samples in the window comes back with their times (:attr:`Series.histograms`), without samples where
        it has no float ones: the caller skips it and tells."""
        if end < start or chunk <= 0:
            raise PrometheusError(self.url, selector, f"window [{start}, {end}] in chunks of {chunk} s is empty")
        selector = self._within_scrape_jobs(selector)
        merged: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], dict[float, float], set[float]]] = {}
        at = start
        while True:
            at = min(at + chunk, end)
            width = min(chunk, at - start) + 0.001  # overlap the previous window (and reach back to ``start``)
            for series in self.query(f"{selector}[{duration(width)}]", at, finite=finite):
                if not self._believed(series.labels):
                    continue
                key = tuple(sorted(series.labels.items()))
                _, samples, histograms = merged.setdefault(key, (dict(series.labels), {}, set()))
                for t, v in series.samples:
                    if start <= t <= end:
                        samples.setdefault(t, v)
                histograms.update(t for t in series.histograms if start <= t <= end)
            if at >= end:
                break
        return [Series(labels, tuple(sorted(samples.items())), tuple(sorted(histograms)))
                for _, (labels, samples, histograms) in sorted(merged.items()) if samples or histograms]

    def series(self, selector: str, start: float | None = None, end: float | None = None) -> list[dict[str, str]]:
        """The label sets of the series ``selector`` matches (with samples in the blocks overlapping
        ``[start, end]``, a block's granularity, where given)."""
        selector = self._within_scrape_jobs(selector)
        form = [("match[]", selector)]
        form += [("start", f"{start:.3f}")] if start is not None else []
        form += [("end", f"{end:.3f}")] if end is not None else []
        data = self._call("series", selector, form)
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise PrometheusError(self.url, selector, f"malformed series list {str(data)[:200]!r}", malformed=True)
        listed = [{str(k): str(v) for k, v in item.items()} for item in data]
        return [labels for labels in listed if self._believed(labels)]

    def _within_scrape_jobs(self, selector: str) -> str:
        """``selector`` (``name{matchers}``, the only form the profiler writes) with a matcher on the believed
        scrape jobs added; unchanged where every job is believed."""
        if not self.scrape_jobs:
            return selector
        if not selector.endswith("}") or "{" not in selector:
            raise KubecellError(f"prometheus {self.url}: {selector!r} is not a selector name{{matchers}}, so "
                                "it cannot be kept to the believed scrape jobs")
        jobs = "|".join(regex_literal(job) for job in sorted(self.scrape_jobs))
        inner = selector[selector.index("{") + 1:-1].strip()
        return f"{selector[:-1]}{', ' if inner else ''}job=~{quote(jobs)}}}"

    def _believed(self, labels: Mapping[str, str]) -> bool:
        """Whether a series comes from a believed scrape job (checked on the answer too: a selector is text,
        and a Prometheus behind a proxy may not apply it as written)."""
        return not self.scrape_jobs or labels.get("job") in self.scrape_jobs
