"""A job's profile: for each metric, a distribution per pod and one for the job, from the raw samples in
Prometheus.

Per metric and pod, the first of the metric's sources (:mod:`kubecell.profiler.sources`) with samples in the
window is read. A pod has several series where the metric is per GPU or per container; they are **summed**:
a pod on two GPUs uses the sum of their memory and of their busy time, a pod's CPU is its containers' CPU.
Series scraped together share timestamps and add up sample by sample; where they do not (cAdvisor stamps each
container itself), each timestamp of any series takes every series' latest sample at or before it, unless that
sample is older than the series' gap cap (the series had stopped).

A pod's GPU (or container) read by two scrapes (two scrape jobs listing the node agent or dcgm-exporter, a
target listed twice) is one measurement, not two: its series differ only in the labels of the scrape that read
them (:data:`SCRAPE_LABELS`), and are made one (:func:`one_per_measurement`) before anything is summed. Summed,
a pod on one GPU read twice used two.

A pod's samples from before its creation (``Job.created``) are not its own: they are a previous pod's of the
same name (a StatefulSet's pod made again, a gang run again under its pods' names), and are dropped.

Each sample is weighted by the seconds it stands for (:func:`sample_weights`): the gap to the next sample,
capped, so that an outage of the exporter or of Prometheus is not counted as hours at the last value seen.

One bad pod never fails the job: a pod without series, with only NaN, or with too few samples becomes a
:class:`Problem` and the job's distribution pools the others. So does a series answered with native histograms
instead of float samples (a tenant's pod exporting the series' name as one): it is skipped, and the pod's
next source read where it has no other series. Prometheus failing (down, refusing the query, answering it with
a series or sample that is no number) raises :class:`~kubecell.profiler.prometheus.PrometheusError`: the
caller tells whether that costs the job (:attr:`~kubecell.profiler.prometheus.PrometheusError.refused`) or
the pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from kubecell.core.errors import KubecellError
from kubecell.profiler.distribution import Distribution, DistributionError, distribution, pooled
from kubecell.profiler.prometheus import DEFAULT_CHUNK, Prometheus, Sample, Series
from kubecell.profiler.sources import METRICS, Metric, Source

DEFAULT_MAX_GAP_FACTOR = 2.0
"""A sample stands for at most twice the series' usual scrape interval: one missed scrape is still usage."""
DEFAULT_FALLBACK_INTERVAL = 60.0
"""Seconds a lone sample stands for (a series of one sample has no interval of its own)."""
DEFAULT_MIN_SAMPLES = 2
"""Fewer samples than this make no distribution: one sample says nothing about a spread."""
PODS_PER_QUERY = 100
"""Pods named in one selector's regex, so a large job's query stays a bounded size."""
MAX_MAGNITUDE = 1e18
"""The largest sample value believed, in the series' own unit: an exabyte of memory, a counter of 30 billion
CPU-years, far past any GPU ratio. Beyond it a value is no measurement (a broken exporter, or a series someone
wrote on purpose), and sums and means of such values overflow."""
SCRAPE_LABELS = frozenset({"job", "instance", "service", "endpoint", "metrics_path"})
"""The labels that say which scrape read a series, not what the series measures: Prometheus's own (the scrape
job, the target), those prometheus-operator's ServiceMonitors add to every series of a target (its Service, the
endpoint's port name; the exporter's own ``pod`` and ``namespace`` win with ``honorLabels``, as dcgm-exporter's
chart sets it), and the ``metrics_path`` kube-prometheus copies from the scrape. So dcgm-exporter listed by a
ServiceMonitor and by an annotation job is read once. Labels another relabelling adds make another measurement:
such series are still summed."""


def measurement(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What a series measures, as a key: its labels without :data:`SCRAPE_LABELS`."""
    return tuple(sorted((name, value) for name, value in labels.items() if name not in SCRAPE_LABELS))


def median_interval(timestamps: Sequence[float], fallback: float = DEFAULT_FALLBACK_INTERVAL) -> float:
    """The median of the gaps between successive samples (sorted, distinct timestamps), or ``fallback``
    where there is no gap (one sample)."""
    gaps = sorted(b - a for a, b in pairwise(timestamps))
    if not gaps:
        return fallback
    middle = len(gaps) // 2
    return gaps[middle] if len(gaps) % 2 else (gaps[middle - 1] + gaps[middle]) / 2


def sample_weights(timestamps: Sequence[float], *, max_gap_factor: float = DEFAULT_MAX_GAP_FACTOR,
                   fallback_interval: float = DEFAULT_FALLBACK_INTERVAL, interval: float | None = None) -> list[float]:
    """Seconds each sample stands for: the gap to the next one, at most ``max_gap_factor`` times the median
    gap; the last sample (whose next gap is unknown) the median gap; a lone sample ``fallback_interval``.
    ``interval``: the scrape interval to use instead of the median gap, for a sum of series each scraped at it
    but stamped apart (two containers a second apart: their merged gaps say nothing of the interval).

    Pure, so a test applies the very same rule to the raw data the series were made from."""
    if any(b <= a for a, b in pairwise(timestamps)):
        raise KubecellError("sample weights: timestamps must be strictly increasing")
    if not timestamps:
        return []
    usual = interval if interval is not None else median_interval(timestamps, fallback_interval)
    cap = max_gap_factor * usual
    return [min(b - a, cap) for a, b in pairwise(timestamps)] + [usual]


def counter_rates(samples: Sequence[Sample]) -> list[Sample]:
    """Per-second rates of a counter, one per sample after the first, at the later sample's time. A value
    below the previous one is a reset (the container restarted and its counter began again at 0): the rate
    over that interval is the new value itself over the interval, the least it can have grown."""
    rates: list[Sample] = []
    for (t0, v0), (t1, v1) in pairwise(samples):
        if t1 > t0:
            rates.append((t1, ((v1 - v0) if v1 >= v0 else v1) / (t1 - t0)))
    return rates


def summed(series: Sequence[Sequence[Sample]], *, max_gap_factor: float = DEFAULT_MAX_GAP_FACTOR,
           fallback_interval: float = DEFAULT_FALLBACK_INTERVAL) -> list[Sample]:
    """The sum of several series (each sorted by time): at each timestamp of any of them, every series'
    latest sample at or before it that is not older than that series' gap cap. One series is returned as is."""
    if len(series) == 1:
        return list(series[0])
    caps = [max_gap_factor * median_interval([t for t, _ in s], fallback_interval) for s in series]
    times = sorted({t for s in series for t, _ in s})
    cursors = [0] * len(series)
    total: list[Sample] = []
    for t in times:
        parts: list[float] = []
        for i, s in enumerate(series):
            while cursors[i] + 1 < len(s) and s[cursors[i] + 1][0] <= t:
                cursors[i] += 1
            if s and s[cursors[i]][0] <= t and t - s[cursors[i]][0] <= caps[i]:
                parts.append(s[cursors[i]][1])
        total.append((t, math.fsum(parts)))
    return total


def one_per_measurement(series: Iterable[Series], *,
                        fallback_interval: float = DEFAULT_FALLBACK_INTERVAL) -> list[Series]:
    """``series`` with one series per :func:`measurement`, in the order each measurement was first given. The
    series of a measurement read by several scrapes become one: the timestamps of the scrape with the most
    finite samples (ties: the first given), each with the highest finite value among that scrape's sample and
    every other scrape's latest one at or before it that is less than that scrape's usual interval old (its
    reading of the same round; a scrape that stopped or missed one is not carried on).

    Why one scrape's timestamps: two scrapes of one target are stamped apart (each scrape job has its own
    offset), so their samples merged by time alternate short and long gaps, and a weight capped at twice their
    median gap would drop most of the time between. Why the highest value: the scrapes of one exporter read the
    same value, and where Prometheus also scrapes tenants' pods, a pod exporting the series under its own name
    can raise its usage as read (as before, when it was summed) but never lower it below the exporter's
    (``--scrape-job`` leaves it out altogether). The profile and the sharing observed
    (:mod:`kubecell.profiler.pairs`) both read through this."""
    groups: dict[tuple[tuple[str, str], ...], list[Series]] = {}
    for one in series:
        groups.setdefault(measurement(one.labels), []).append(one)
    return [group[0] if len(group) == 1 else _highest(group, fallback_interval) for group in groups.values()]


def _highest(group: Sequence[Series], fallback_interval: float) -> Series:
    """One measurement's scrapes as one series (see :func:`one_per_measurement`); a sample no scrape has a
    finite value for keeps its own (NaN stays NaN, for the caller to tell)."""
    # max keeps the first of equals: the tie goes to the first given
    base = max(group, key=lambda one: sum(1 for _, value in one.samples if math.isfinite(value)))
    others = [[(t, v) for t, v in one.samples if math.isfinite(v)] for one in group if one is not base]
    usual = [median_interval([t for t, _ in other], fallback_interval) for other in others]
    cursors = [-1] * len(others)
    merged: list[Sample] = []
    for t, value in base.samples:
        best = value if math.isfinite(value) else None
        for i, other in enumerate(others):
            at = cursors[i]
            while at + 1 < len(other) and other[at + 1][0] <= t:
                at += 1
            cursors[i] = at
            if at >= 0 and t - other[at][0] < usual[i] and (best is None or other[at][1] > best):
                best = other[at][1]
        merged.append((t, value if best is None else best))
    return Series(base.labels, tuple(merged))


@dataclass(frozen=True)
class Job:
    """The pods of one job (all in ``namespace``) and the window to profile, in unix seconds. ``created``: each
    pod's creation time (the API server's), where known; a pod's samples before it are a previous pod's of the
    same name, never its own, and are left out."""

    namespace: str
    pods: tuple[str, ...]
    start: float
    end: float
    created: Mapping[str, float] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Problem:
    """Why a pod has no distribution of a metric, or what was dropped from it."""

    pod: str
    metric: str
    reason: str


@dataclass(frozen=True)
class PodSeries:
    """A pod's series of one metric in its canonical unit, the source it came from and each sample's weight."""

    source: str
    samples: tuple[Sample, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class MetricProfile:
    """One metric of a job: each pod's series and distribution (pods with a problem left out) and the job's
    distribution pooled over its pods in the job's order (None where no pod has one)."""

    metric: str
    unit: str
    series: Mapping[str, PodSeries]
    pods: Mapping[str, Distribution]
    job: Distribution | None


@dataclass(frozen=True)
class Profile:
    job: Job
    metrics: Mapping[str, MetricProfile]
    problems: tuple[Problem, ...]


def _batches(pods: Sequence[str]) -> Iterable[tuple[str, ...]]:
    for i in range(0, len(pods), PODS_PER_QUERY):
        yield tuple(pods[i:i + PODS_PER_QUERY])


def _fetch(client: Prometheus, source: Source, job: Job, pods: Sequence[str], chunk: float, metric: str,
           problems: list[Problem]) -> dict[str, list[Series]]:
    """Pod -> its raw series of ``source`` (sorted by labels), for the pods that have float samples in the window
    since their creation. A series' native-histogram samples there are skipped, one problem per pod told."""
    found: dict[str, list[Series]] = {}
    for batch in _batches(pods):
        skipped: dict[str, int] = {}
        for series in client.raw(source.selector(job.namespace, batch), job.start, job.end, chunk=chunk,
                                 finite=False):
            pod = series.labels.get(source.pod_label, "")
            if pod not in batch or not source.keeps(series.labels):
                continue
            since = job.created.get(pod)
            samples = series.samples if since is None else tuple((t, v) for t, v in series.samples if t >= since)
            histograms = sum(1 for t in series.histograms if since is None or t >= since)
            if histograms:
                skipped[pod] = skipped.get(pod, 0) + histograms
            if samples:
                found.setdefault(pod, []).append(Series(series.labels, samples))
        for pod, count in skipped.items():
            problems.append(Problem(pod, metric, f"{source.name}: {count} native-histogram sample(s), not the "
                                                 "exporter's float samples: skipped"))
    return found


def _pod_series(source: Source, raw: Sequence[Series], pod: str, metric: Metric, *, fallback_interval: float,
                problems: list[Problem]) -> list[list[Sample]] | None:
    """One pod's series in canonical units, to be summed: NaN dropped (and told), counters turned into rates,
    one per measurement (:func:`one_per_measurement`, on rates: a counter's scrapes read it at other times). None
    where every sample was NaN (the problem told already)."""
    clean: list[Series] = []
    dropped = total = 0
    for series in raw:
        # finite in the canonical unit too (MiB x 2**20 can overflow), and counted where a rate or a sum
        # could not be finite: a series is a node's or a user's to write
        finite = [(t, source.canonical(v)) for t, v in series.samples
                  if math.isfinite(v) and abs(v) <= MAX_MAGNITUDE]
        dropped, total = dropped + len(series.samples) - len(finite), total + len(series.samples)
        if source.kind == "counter":
            finite = counter_rates(finite)
        if finite:
            clean.append(Series(series.labels, tuple(finite)))
    if dropped == total:
        problems.append(Problem(pod, metric.name, f"{source.name}: all {total} samples are NaN, infinite or "
                                                  f"beyond {MAX_MAGNITUDE:g}"))
        return None
    if dropped:
        problems.append(Problem(pod, metric.name, f"{source.name}: dropped {dropped} of {total} samples "
                                                  f"(NaN, infinite or beyond {MAX_MAGNITUDE:g})"))
    return [list(series.samples) for series in one_per_measurement(clean, fallback_interval=fallback_interval)]


def scrape_interval(raw: Sequence[Sequence[Sample]], fallback: float) -> float | None:
    """The interval a pod's summed series stands at: the longest median interval of the series summed (None for
    one series: its own gaps say it)."""
    if len(raw) < 2:
        return None
    return max(median_interval(sorted({t for t, _ in samples}), fallback) for samples in raw)


def collect(client: Prometheus, job: Job, metrics: Sequence[Metric] = METRICS, *, chunk: float = DEFAULT_CHUNK,
            max_gap_factor: float = DEFAULT_MAX_GAP_FACTOR, fallback_interval: float = DEFAULT_FALLBACK_INTERVAL,
            min_samples: int = DEFAULT_MIN_SAMPLES) -> Profile:
    """The profile of ``job`` over its window: per metric, per-pod and pooled distributions, and the pods'
    problems. Raises :class:`~kubecell.profiler.prometheus.PrometheusError` only when Prometheus fails or
    answers with a series or sample that is no number (see the module)."""
    if len(set(job.pods)) != len(job.pods):
        raise KubecellError(f"job in {job.namespace}: a pod is named twice in {job.pods}")
    problems: list[Problem] = []
    profiles: dict[str, MetricProfile] = {}
    for metric in metrics:
        chosen: dict[str, tuple[Source, list[Series]]] = {}
        for source in metric.sources:
            left = [pod for pod in job.pods if pod not in chosen]
            if not left:
                break
            for pod, raw in _fetch(client, source, job, left, chunk, metric.name, problems).items():
                chosen[pod] = (source, raw)
        series: dict[str, PodSeries] = {}
        for pod in job.pods:
            if pod not in chosen:
                if metric.optional:
                    continue
                names = ", ".join(s.name for s in metric.sources)
                problems.append(Problem(pod, metric.name, f"no samples in the window in any of: {names}"))
                continue
            source, raw = chosen[pod]
            parts = _pod_series(source, raw, pod, metric, fallback_interval=fallback_interval, problems=problems)
            if parts is None:
                continue
            samples = summed(parts, max_gap_factor=max_gap_factor, fallback_interval=fallback_interval) if parts \
                else []
            if len(samples) < min_samples:
                problems.append(Problem(pod, metric.name, f"{source.name}: {len(samples)} sample(s), "
                                                          f"at least {min_samples} needed"))
                continue
            weights = sample_weights([t for t, _ in samples], max_gap_factor=max_gap_factor,
                                     fallback_interval=fallback_interval,
                                     interval=scrape_interval(parts, fallback_interval))
            series[pod] = PodSeries(source.name, tuple(samples), tuple(weights))
        pods: dict[str, Distribution] = {}
        for pod, s in list(series.items()):
            try:
                pods[pod] = distribution([v for _, v in s.samples], s.weights)
            except DistributionError as error:
                problems.append(Problem(pod, metric.name, f"{s.source}: {error}"))
                del series[pod]
        job_distribution = None
        if series:
            try:
                job_distribution = pooled(([v for _, v in s.samples], s.weights) for s in series.values())
            except DistributionError as error:
                problems.append(Problem("(job)", metric.name, str(error)))
        profiles[metric.name] = MetricProfile(metric.name, metric.unit, series, pods, job_distribution)
    return Profile(job, profiles, tuple(problems))
