"""The job history as the scheduler's knowledge (``scheduler.knowledge.Knowledge``): a family's median run time,
what its jobs use alone per GPU, and the share it needs (``core.rightsizing``); and, for the co-location rule
(``core.interference.KnownPairs``), how fast each family ran beside each other one on a shared GPU
(``kubecell.profiler.pairs``), read again at most once per ``ttl_seconds``.

A family's solo GPU utilization is its busy fraction while alone on a time-sliced GPU, where the profiler saw it
alone long enough (``pair_min_seconds``): a run that shared a GPU reads lower, its partner having taken part of
the GPU's time, so on a cluster that shares much, the runs' whole means would make every family look lighter
than it is, and the summed-utilization rules would pack more than they mean to. Elsewhere (never alone on a
shared GPU: whole GPUs, MPS) it is the median of its runs' mean use.

A pod's family is its controller owner's name family (else its own name's) **in its own namespace**: another
team's jobs, whatever they are named, never change what the scheduler expects of this one. A run time comes from
the user's own runs of the family where there are enough of them (``kubecell.io/user``, else the service
account), else from the family's. Answers are cached for ``ttl_seconds``: a family's (its jobs read with their
distributions, the costly part) per (namespace, family), a user's own run time apart per (namespace, family,
user), one small query; so the scheduling thread reads a family's jobs at most once per period however many
user names its pods state, and a namespace stating ever new ones never pushes another's families out. A
database error, or rows that fail a check (they are made of what kubelets and node agents wrote), is logged and
answered with None (no knowledge), never raised into the scheduler. Each cache holds at most ``MAX_CACHED``
entries, the one asked least recently let go first: names and users come from pods, and the admission webhook is
asked for every pod a namespace creates.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.interference.history import PairHistory
from kubecell.core.interference.profile import JobKey, SoloProfile
from kubecell.core.rightsizing import recommend
from kubecell.profiler.history import JobHistory, JobRecord, Outcome, ProfilerStoreError
from kubecell.profiler.identity import family_of
from kubecell.profiler.jobs import user_of
from kubecell.profiler.pairs import ALONE, MIN_SECONDS, MIN_SOLO_BUSY, pair_history
from kubecell.profiler.recommend import usage_profile
from kubecell.profiler.sources import GPU_MEMORY_UTILIZATION, GPU_UTILIZATION

log = logging.getLogger("kubecell.profiler.knowledge")

Answers = tuple[float | None, SoloProfile | None, int | None]
"""(expected run time, solo profile, advised share per GPU) of a family."""
FamilyKey = tuple[str, str, str | None]
"""(namespace, family, user) of a pod."""
NOTHING: Answers = (None, None, None)

MIN_JOBS = 3
"""Finished jobs a family needs before anything is said of it (as ``core.rightsizing``)."""
RECENT_JOBS = 50
MAX_CACHED = 4096
"""Families whose answers are held (a few hundred bytes each)."""
PAIR_MEMORY = timedelta(days=30)
"""Pairs are read from the jobs created this recently: a family's code and data change, and what it did beside
another a season ago says little of what it does now."""


class HistoryKnowledge:
    """Answers from a :class:`JobHistory` (see the module)."""

    def __init__(self, history: JobHistory, *, ttl_seconds: float = 300.0,
                 clock: Callable[[], float] = time.monotonic, pair_min_seconds: float = MIN_SECONDS) -> None:
        """``pair_min_seconds``: the observed time a pair (and a family alone) needs before its speed counts
        (``profiler.pairs``); a bench that runs jobs for seconds instead of hours scales it down with them."""
        if not (math.isfinite(pair_min_seconds) and pair_min_seconds >= 0):
            raise InvalidInputError(f"pair_min_seconds {pair_min_seconds} is not a time", field="pair_min_seconds")
        self.history = history
        self.ttl_seconds = ttl_seconds
        self.pair_min_seconds = pair_min_seconds
        self.clock = clock
        self._families: OrderedDict[tuple[str, str], tuple[float, Answers]] = OrderedDict()
        self._users: OrderedDict[FamilyKey, tuple[float, Answers]] = OrderedDict()
        """A user's own run time of a family (first of its answers; the others unused)."""
        self._pairs = PairHistory()
        self._alone: dict[str, float] = {}
        """``namespace/family`` -> its busy fraction of a GPU while alone on it (time-sliced shares only)."""
        self._pairs_read: float | None = None
        self._last_key: tuple[Mapping[str, Any], FamilyKey] | None = None

    def _key(self, pod: Mapping[str, Any]) -> FamilyKey:
        """(namespace, family, user) of ``pod``. The scheduler asks up to four things of one pod object in a row
        (``scheduler.knowledge.informed``), and an owner-less pod's family means reading its gang's demand, so the
        key of the pod object asked last is kept (by identity: a pod read again from the API is a new object)."""
        last = self._last_key
        if last is not None and last[0] is pod:
            return last[1]
        key = (*family_of(pod), user_of(pod))
        self._last_key = (pod, key)
        return key

    def _answers(self, pod: Mapping[str, Any]) -> Answers:
        namespace, family, user = self._key(pod)
        answers = self._cached(self._families, (namespace, family), lambda: self._read_family(namespace, family))
        if user:
            own = self._cached(self._users, (namespace, family, user),
                               lambda: (self._run_time(namespace, family, user), None, None))[0]
            if own is not None:
                return own, answers[1], answers[2]
        return answers

    def _cached(self, cache: OrderedDict[Any, tuple[float, Answers]], key: Any,
                read: Callable[[], Answers]) -> Answers:
        now = self.clock()
        cached = cache.get(key)
        if cached is not None and now - cached[0] < self.ttl_seconds:
            cache.move_to_end(key)
            return cached[1]
        try:
            answers = read()
        except ProfilerStoreError as error:
            log.warning("job history unreadable for %s: %s", "/".join(filter(None, key)), error)
            answers = NOTHING
        except KubecellError as error:  # rows made of what kubelets and node agents wrote: that family goes
            log.warning("job history of %s not used: %s", "/".join(filter(None, key)), error)  # uninformed alone
            answers = NOTHING
        cache[key] = (now, answers)
        cache.move_to_end(key)
        while len(cache) > MAX_CACHED:
            cache.popitem(last=False)
        return answers

    def _run_time(self, namespace: str, family: str, user: str | None) -> float | None:
        """The median of the recent successful runs of the family (``user``'s alone, where given), or None below
        ``MIN_JOBS`` of them."""
        runs = self.history.durations(namespace=namespace, family=family, user=user, limit=RECENT_JOBS,
                                      outcomes=(Outcome.SUCCEEDED,))
        return float(statistics.median(runs)) if len(runs) >= MIN_JOBS else None

    def _read_family(self, namespace: str, family: str) -> Answers:
        expected = self._run_time(namespace, family, None)
        jobs = [job for job in self.history.jobs(namespace=namespace, family=family, limit=RECENT_JOBS)
                if job.outcome in (Outcome.SUCCEEDED, Outcome.FAILED)]
        profiles = [p for p in (usage_profile(job) for job in jobs) if p is not None]
        if len(profiles) < MIN_JOBS:
            return expected, None, None
        advice = recommend(family, profiles)
        share = advice.milli if advice.milli is not None and not advice.whole_gpu else None
        self._read_sharing()
        alone = self._alone.get(f"{namespace}/{family}")
        if alone is None:  # never observed alone under time-slicing: its runs' own use, shared or not
            alone = statistics.median(statistics.fmean(p.gpu_utilization) for p in profiles)  # decile mean ~ time mean
        util = 100.0 * min(1.0, alone)
        peak = max(p.gpu_memory_mib[-1] for p in profiles)
        controller = min(100.0, max(0.0, util * _controller_per_compute(jobs)))  # node-written series: bounded
        return expected, SoloProfile(JobKey(f"{namespace}/{family}"), util, controller, peak), share  # as family()

    def expected_seconds(self, pod: Mapping[str, Any]) -> float | None:
        return self._answers(pod)[0]

    def profile(self, pod: Mapping[str, Any]) -> SoloProfile | None:
        return self._answers(pod)[1]

    def share_milli(self, pod: Mapping[str, Any]) -> int | None:
        return self._answers(pod)[2]

    def family(self, pod: Mapping[str, Any]) -> JobKey | None:
        """``namespace/family``: the key of the family's profile here and of its pairs (``profiler.pairs``)."""
        return JobKey("/".join(self._key(pod)[:2]))

    def speed(self, own: JobKey, partner: JobKey) -> float | None:
        """How fast ``own``'s family ran beside ``partner``'s on a shared GPU (None: not observed long enough),
        from the jobs of the last ``PAIR_MEMORY``."""
        self._read_sharing()
        return self._pairs.speed(own, partner)

    def _read_sharing(self) -> None:
        """The sharing rows, read again once ``ttl_seconds`` have passed: each pair's speed, and each family's
        busy fraction alone. While the database fails, what was read last is kept (a pair once seen does not turn
        unknown because a read failed)."""
        now = self.clock()
        if self._pairs_read is not None and now - self._pairs_read < self.ttl_seconds:
            return
        self._pairs_read = now
        try:
            recent = self.history.sharing(created_since=datetime.now(UTC) - PAIR_MEMORY)
        except ProfilerStoreError as error:
            log.warning("job history unreadable for the pairs that shared a GPU: %s", error)
            return
        self._pairs = pair_history(recent, min_seconds=self.pair_min_seconds)
        self._alone = {row.family: row.busy_seconds / row.seconds for row in recent
                       if row.partner == ALONE and row.seconds > 0 and row.seconds >= self.pair_min_seconds}


def _controller_per_compute(jobs: Sequence[JobRecord]) -> float:
    """The family's memory-controller time per unit of SM time: the median over its jobs with both series. The
    ratio is the kernels' own (time-slicing scales both alike), so it carries over to the utilization read from
    time alone. Without the series (an exporter that does not give it) 1.0: the controller taken as busy as the
    SMs, the side on which a calibrated bandwidth term predicts more slowdown, never less. That side costs: on
    ``bench/colocation_live.py``'s workload the adaptive rule then shares too little while jobs queue. A job that
    barely used the SMs (under ``MIN_SOLO_BUSY``) has no ratio worth reading: noise over noise."""
    ratios = [controller.mean / compute.mean for job in jobs
              if (compute := job.metrics.get(GPU_UTILIZATION.name)) is not None and compute.mean >= MIN_SOLO_BUSY
              and (controller := job.metrics.get(GPU_MEMORY_UTILIZATION.name)) is not None]
    return float(statistics.median(ratios)) if ratios else 1.0
