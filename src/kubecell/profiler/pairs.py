"""What sharing a GPU did to each family, observed on the cluster: the pair history the scheduler admits by.

Why: a prediction from solo profiles ranks pairs of models it was never calibrated on no better than summed
utilization does, yet a cluster runs the same families again and again, and the node agent already measures
every pod's own share of each GPU (``kubecell_node_gpu_pod_utilization_ratio``, per process, labels ``pod``,
``namespace``, ``node``, ``gpu``). Under time-slicing (kubecell's ``accounting`` isolation) the driver gives
each context the whole GPU in turns, so a job whose kernels kept the GPU busy a fraction ``u`` of the time
alone, and ``u'`` beside a partner, got ``u' / u`` of the GPU time it wanted: that ratio is its speed beside
the partner, to the extent its speed follows its GPU time (a job bound by its input pipeline loses less).
Under MPS kernels of both run at once and each one's busy time says nothing of its progress, and a MIG
instance is never shared: pods under those isolations are neither observed nor counted as partners.

**Observing** (:func:`observe_sharing`, one profiling pass): for each GPU a share pod of the job used, every
pod's series on that GPU is read; at each of the pod's samples (weighted as the profile weighs them) the pod
was *alone* (no other pod sampled in that scrape interval), *beside* one partner, or among three or more (not
kept: a pair is what the history knows). Per partner family (``namespace/family``, as the scheduler keys
a pod's profile) and alone, the job keeps the seconds and the integral of its own utilization
(:class:`~kubecell.profiler.history.SharedUse`), replaced with the job at each pass. Two jobs on one GPU
need the same series: a pass reads each GPU once (:class:`GpuSeries`), widening what it holds only by the
time a later job lived beyond it.

**Reading** (:func:`pair_speeds`, :func:`pair_history`): per family, its solo busy fraction over all its jobs'
time alone; per ordered pair, its busy fraction beside the partner over that, as a speed capped at 1 (a job is
not faster beside another by this measure; more busy time beside one is a phase of the job, not a gain). Only pairs and
solo baselines observed long enough (``min_seconds``) count, and a family that barely uses the GPU alone
(``MIN_SOLO_BUSY``) has no speed to lose: nothing is said of it.

Untrusted input: the series are what a node wrote. A sample that is not a ratio of one GPU (not finite, below
0, above 1) is dropped, and whatever the history is told stays within :class:`PairHistory`'s checks.

Nor is a series' ``node`` and ``gpu`` believed on its own word. Where Prometheus also scrapes tenants' pods (and
``--scrape-job`` is not given), a pod can export the agent's series for itself: Prometheus writes its own
``namespace`` and ``pod`` over the ones it exports, but not ``node`` and ``gpu``, so it could say it sat on
another tenant's GPU and write itself into that tenant's sharing as a partner (and that tenant into its own).
So a pod is taken to be on a GPU only where the pass's pod list puts it (:class:`Place`): where its allocation
record grants it that GPU, or, for a pod without a record (no partner: it is never named), on its own node.
A series elsewhere is no pod's presence, and is left out (``observe_sharing``'s ``present``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubecell.core.interference.history import PairHistory
from kubecell.core.interference.profile import JobKey
from kubecell.profiler.collect import (
    DEFAULT_FALLBACK_INTERVAL,
    DEFAULT_MAX_GAP_FACTOR,
    median_interval,
    one_per_measurement,
    sample_weights,
)
from kubecell.profiler.history import FamilySharing, SharedUse
from kubecell.profiler.prometheus import DEFAULT_CHUNK, Prometheus, Sample, quote
from kubecell.profiler.sources import Source

UTILIZATION: Source = Source("kubecell_node_gpu_pod_utilization_ratio")
"""The only series that splits a shared GPU between its pods (dcgm-exporter gives each the device's total)."""
ALONE = ""
"""The partner of the time a job's pod had its GPU to itself."""
MAX_GPUS_PER_JOB = 16
"""GPUs whose neighbours are read per job and pass: each is one query, and a share job has a few pods."""
MIN_SECONDS = 300.0
"""Observed time below which a pair (or a family's time alone) says nothing: a few samples of one phase."""
MIN_SOLO_BUSY = 0.05
"""A family busy less than this alone has no GPU time to lose: its ratio would be noise over noise."""

MAX_HELD_SAMPLES = 1_000_000
"""Samples a pass keeps of the GPUs it read (about 100 MB), the GPU read least recently let go first."""

PodId = tuple[str, str]
"""(namespace, pod name)."""


@dataclass(frozen=True)
class Place:
    """Where the API server's objects put a pod: its node, and the GPUs (UUIDs, as the node agent labels them)
    its allocation record grants it there; ``gpus`` None for a pod without a record that names them (none, an
    unreadable one, a MIG instance's, whose UUID is not its GPU's): any GPU of its node."""

    node: str
    gpus: frozenset[str] | None = None

    def holds(self, node: str, gpu: str) -> bool:
        """Whether a series of the pod on ``gpu`` of ``node`` can be the node agent's."""
        return bool(self.node) and node == self.node and (self.gpus is None or gpu in self.gpus)


def use_beside(own: Sequence[Sample], others: Mapping[PodId, Sequence[Sample]], *,
               max_gap_factor: float = DEFAULT_MAX_GAP_FACTOR,
               fallback_interval: float = DEFAULT_FALLBACK_INTERVAL) -> dict[PodId | None, tuple[float, float]]:
    """(seconds, busy seconds) of ``own`` (one pod's utilization of one GPU, sorted by time, each sample
    weighted as the profile weighs it) alone (key None) and beside each pod of ``others`` (their series on the
    same GPU) while it was the only other one there.

    Another pod is there at ``t`` when its latest sample at or before ``t`` is less than one of its usual
    scrape intervals old: the agent exports every pod of a GPU in one scrape, so a pod still there has a
    sample of the very same scrape, and one that left stops counting at once. Pure: a test applies it to the
    raw data a Prometheus was filled with."""
    own = [(t, v) for t, v in own if math.isfinite(t)]
    if not own:
        return {}
    weights = sample_weights([t for t, _ in own], max_gap_factor=max_gap_factor, fallback_interval=fallback_interval)
    series = {pod: [(t, v) for t, v in samples if math.isfinite(t)] for pod, samples in others.items()}
    usual = {pod: median_interval([t for t, _ in s], fallback_interval) for pod, s in series.items()}
    cursors = dict.fromkeys(series, -1)
    found: dict[PodId | None, tuple[list[float], list[float]]] = {}
    for (t, value), weight in zip(own, weights, strict=True):
        there: list[PodId] = []
        for pod, samples in series.items():
            at = cursors[pod]
            while at + 1 < len(samples) and samples[at + 1][0] <= t:
                at += 1
            cursors[pod] = at
            if at >= 0 and t - samples[at][0] < usual[pod]:
                there.append(pod)
        if len(there) > 1 or not (math.isfinite(value) and 0.0 <= value <= 1.0):
            continue  # three sharers are not a pair; a sample that is not a ratio of one GPU is no measurement
        seconds, busy = found.setdefault(there[0] if there else None, ([], []))
        seconds.append(weight)
        busy.append(weight * value)
    return {partner: (math.fsum(seconds), math.fsum(busy)) for partner, (seconds, busy) in found.items()}


@dataclass(frozen=True)
class Observed:
    """A job's sharing as one pass saw it, and the GPUs it could not read (one message each)."""

    sharing: tuple[SharedUse, ...]
    problems: tuple[str, ...]


class GpuSeries:
    """Every pod's utilization samples on each GPU, read from ``client`` once per pass.

    Why: the jobs sharing a GPU each need every pod's series on it over their own lives, which overlap. The
    first job's window is read; a later job's is served from it, and only the time it lived beyond what is
    held is read (before it, after it, or both). A window that does not meet what is held (a job of another
    day on the same GPU) replaces it instead, so the time between them is never read. Held samples are
    bounded (``max_samples``): the GPU read least recently is let go first, and read again if a job asks for
    it later; a GPU whose window alone holds more is answered and not kept."""

    def __init__(self, client: Prometheus, *, chunk: float = DEFAULT_CHUNK,
                 max_samples: int = MAX_HELD_SAMPLES) -> None:
        self.client = client
        self.chunk = chunk
        self.max_samples = max_samples
        self._held: OrderedDict[tuple[str, str], tuple[float, float, dict[PodId, dict[float, float]], int]] = (
            OrderedDict())
        """(node, GPU) -> (from, to, each pod's samples by time, how many), the GPU asked for last at the end."""
        self._total = 0

    def on(self, node: str, gpu: str, start: float, end: float) -> dict[PodId, list[Sample]]:
        """Each pod's samples on ``gpu`` of ``node`` with ``start <= time <= end``, in time order (a pod
        scraped twice: one series, :func:`~kubecell.profiler.collect.one_per_measurement`; a pod without
        samples then: absent)."""
        key = (node, gpu)
        held = self._held.pop(key, None)
        if held is not None:
            self._total -= held[3]
        if held is None or end < held[0] or start > held[1]:
            low, high, pods = start, end, self._read(node, gpu, start, end, {})
        else:
            low, high, pods, _ = held
            if start < low:
                self._read(node, gpu, start, low, pods)
            if end > high:
                self._read(node, gpu, high, end, pods)
            low, high = min(low, start), max(high, end)
        count = sum(len(samples) for samples in pods.values())
        if count <= self.max_samples:
            self._held[key] = (low, high, pods, count)
            self._total += count
            while self._total > self.max_samples:
                self._total -= self._held.popitem(last=False)[1][3]
        within = {pod: sorted((t, v) for t, v in samples.items() if start <= t <= end)
                  for pod, samples in pods.items()}
        return {pod: samples for pod, samples in within.items() if samples}

    def _read(self, node: str, gpu: str, start: float, end: float,
              into: dict[PodId, dict[float, float]]) -> dict[PodId, dict[float, float]]:
        selector = f"{UTILIZATION.name}{{node={quote(node)}, gpu={quote(gpu)}}}"
        for series in one_per_measurement(self.client.raw(selector, start, end, chunk=self.chunk, finite=False)):
            seen = into.setdefault((series.labels.get("namespace", ""), series.labels.get("pod", "")), {})
            for t, v in series.samples:  # a window read before: a sample on its edge once
                seen.setdefault(t, v)
        return into


def observe_sharing(client: Prometheus, namespace: str, pods: Sequence[str], start: float, end: float,
                    family_key: Callable[[PodId], str | None], *, chunk: float = DEFAULT_CHUNK,
                    gpus: GpuSeries | None = None, placed: Mapping[str, tuple[str, str]] | None = None,
                    created: Mapping[str, float] | None = None,
                    present: Callable[[PodId, str, str], bool] | None = None) -> Observed:
    """How ``pods`` (of one job in ``namespace``) used their GPUs alone and beside each partner family over
    ``[start, end]`` (see the module). ``family_key`` names a pod's family (``namespace/family``), or None for
    a pod that is not to be counted (unknown, or under MPS): time beside it is dropped. ``gpus`` is the pass's
    reader of whole GPUs, shared between its jobs (one of its own otherwise).

    ``placed`` names the (node, GPU UUID) a pod was given (its allocation record): its samples are then read
    with its GPU's. A pod not placed, or without samples there, is looked up by its own series' labels.

    ``created`` gives a pod's creation time: its samples before it are a previous pod's of the same name (as in
    :class:`~kubecell.profiler.collect.Job`), not observed.

    ``present(pod, node, gpu)`` says whether a pod's series on that GPU can be the node agent's (see the module:
    False where the pass's pod list puts the pod elsewhere); a series it says not is left out, as if it were
    not there: neither a partner of the job's pods, nor a GPU of their own. None: every series is believed.

    Raises :class:`~kubecell.profiler.prometheus.PrometheusError` only when Prometheus fails or answers with a
    series or sample that is no number."""
    if not pods:
        return Observed((), ())
    gpus = gpus or GpuSeries(client, chunk=chunk)
    since = created or {}
    by_gpu: dict[tuple[str, str], dict[str, dict[float, float]]] = {}
    unplaced: list[str] = []
    for pod in pods:
        where = (placed or {}).get(pod)
        found = gpus.on(*where, start, end).get((namespace, pod)) if where and len(by_gpu) < MAX_GPUS_PER_JOB \
            else None
        found = [(t, v) for t, v in found if t >= since[pod]] if found and pod in since else found
        if where and found:
            by_gpu.setdefault(where, {})[pod] = dict(found)
        else:
            unplaced.append(pod)
    problems: list[str] = []
    own = one_per_measurement(client.raw(UTILIZATION.selector(namespace, tuple(unplaced)), start, end, chunk=chunk,
                                         finite=False)) if unplaced else []
    for series in own:
        pod, node, gpu = (series.labels.get(label, "") for label in ("pod", "node", "gpu"))
        if pod not in unplaced:
            continue
        if series.histograms:
            problems.append(f"pod {pod}: {len(series.histograms)} native-histogram sample(s) of {UTILIZATION.name}, "
                            "not the agent's float samples: skipped")
        if not series.samples:
            continue
        if not node or not gpu:
            problems.append(f"pod {pod}: a {UTILIZATION.name} series without node or gpu label: not observed")
            continue
        if present is not None and not present((namespace, pod), node, gpu):
            problems.append(f"pod {pod}: a {UTILIZATION.name} series on GPU {gpu[:80]} of node {node[:80]}, "
                            "where its allocation record does not put it: not observed")
            continue
        merged = by_gpu.setdefault((node, gpu), {}).setdefault(pod, {})
        for t, v in series.samples:
            if t >= since.get(pod, t):
                merged.setdefault(t, v)
    if len(by_gpu) > MAX_GPUS_PER_JOB:
        problems.append(f"{len(by_gpu)} GPUs; sharing observed on the first {MAX_GPUS_PER_JOB}")
    sums: dict[str, list[float]] = {}
    for node, gpu in sorted(by_gpu)[:MAX_GPUS_PER_JOB]:
        everyone = gpus.on(node, gpu, start, end)
        for pod, samples in by_gpu[(node, gpu)].items():
            # a pod the pod list puts elsewhere was never on this GPU: its series here is a forgery, left out
            others = {pod_id: s for pod_id, s in everyone.items() if pod_id != (namespace, pod)
                      and (present is None or present(pod_id, node, gpu))}
            for partner, (seconds, busy) in use_beside(sorted(samples.items()), others).items():
                key = ALONE if partner is None else family_key(partner)
                if key is None:
                    continue
                total = sums.setdefault(key, [0.0, 0.0])
                total[0] += seconds
                total[1] += busy
    sharing = tuple(SharedUse(key, seconds, min(busy, seconds)) for key, (seconds, busy) in sorted(sums.items())
                    if seconds > 0)
    return Observed(sharing, tuple(problems))


@dataclass(frozen=True)
class PairSpeed:
    """What the history says of one ordered pair: ``family``'s busy fraction beside ``partner`` over the
    ``seconds`` observed, its busy fraction alone (None: not observed long enough), and the speed read from
    them (None, with ``why``, where nothing is said)."""

    family: str
    partner: str
    seconds: float
    busy_beside: float
    busy_alone: float | None
    speed: float | None
    why: str


def pair_speeds(rows: Iterable[FamilySharing], *, min_seconds: float = MIN_SECONDS) -> list[PairSpeed]:
    """Every ordered pair the sharing rows name, with its speed where the history says one (see the module),
    the longest observed first."""
    rows = list(rows)
    alone = {row.family: row for row in rows if row.partner == ALONE}
    found = []
    for row in rows:
        if row.partner == ALONE:
            continue
        solo = alone.get(row.family)
        beside = row.busy_seconds / row.seconds
        fraction = None if solo is None or solo.seconds < min_seconds else solo.busy_seconds / solo.seconds
        speed = None
        if row.seconds < min_seconds:
            why = f"observed {row.seconds:.0f} s together, {min_seconds:.0f} s needed"
        elif fraction is None:
            why = f"alone {0 if solo is None else solo.seconds:.0f} s, {min_seconds:.0f} s needed"
        elif fraction < MIN_SOLO_BUSY:
            why = f"busy {fraction:.0%} alone: no GPU time to lose"
        else:
            speed = max(min(1.0, beside / fraction), 1e-6)
            why = "busy beside it / busy alone" + (", capped at 1" if beside > fraction else "")
        found.append(PairSpeed(row.family, row.partner, row.seconds, beside, fraction, speed, why))
    return sorted(found, key=lambda pair: (-pair.seconds, pair.family, pair.partner))


def pair_history(rows: Iterable[FamilySharing], *, min_seconds: float = MIN_SECONDS,
                 max_pairs: int = 100_000) -> PairHistory:
    """The speeds the history's sharing rows say each family ran at beside each partner (see the module)."""
    history = PairHistory(max_pairs)
    for pair in reversed(pair_speeds(rows, min_seconds=min_seconds)):  # the best observed last: kept at the bound
        if pair.speed is not None:
            history.observe(JobKey(pair.family), JobKey(pair.partner), pair.speed, pair.seconds)
    return history
