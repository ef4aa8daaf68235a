"""How long a new job will run, from how long its family's finished jobs ran.

Why: a VC's queue ordered shortest-expected-first lowers its average wait (Shortest Job First), and backfill
needs run times; users' own estimates are notoriously poor (and a user who knows the queue prefers short jobs
writes short ones), while the history of a family of jobs (same VC, user and name family) is measured. The
estimate is the median of the family's last ``keep`` run times once it has ``min_samples`` of them; keys are
tried from the most specific to the least (e.g. VC+user+family, then VC+family), so a new user of a known
workload gets the workload's history. Plain data in, plain numbers out: the simulator feeds it the jobs it
finishes, a cluster driver the profiler's job history.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Hashable, Sequence

from kubecell.core.errors import InvalidInputError


class DurationHistory:
    """Run times by family key, and the estimate for a job of those keys."""

    def __init__(self, *, keep: int = 50, min_samples: int = 3) -> None:
        if keep < 1 or not 1 <= min_samples <= keep:
            raise InvalidInputError(f"keep {keep}, min_samples {min_samples}", field="duration history",
                                    accepted="keep >= 1 and 1 <= min_samples <= keep")
        self.keep = keep
        self.min_samples = min_samples
        self._runs: dict[Hashable, deque[float]] = {}

    def record(self, keys: Sequence[Hashable], seconds: float) -> None:
        """A job of ``keys`` (every level it belongs to) ran ``seconds``; a non-finite or negative time is
        ignored, so one broken clock does not poison a family."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        for key in keys:
            self._runs.setdefault(key, deque(maxlen=self.keep)).append(seconds)

    def estimate(self, keys: Sequence[Hashable]) -> float | None:
        """The median run time at the most specific key with enough history, or None."""
        for key in keys:
            runs = self._runs.get(key)
            if runs is not None and len(runs) >= self.min_samples:
                return float(statistics.median(runs))
        return None

    def __len__(self) -> int:
        return len(self._runs)
