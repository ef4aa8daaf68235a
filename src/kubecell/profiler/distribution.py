"""A metric's distribution over a pod's or a job's life, weighted by the time each sample stands for.

Scrapes are not evenly spaced (a restarted exporter, a missed scrape, pods of one job sampled by different
agents), so a plain percentile over samples over-weights the busy stretches. Each sample is weighted by the
seconds it covers; with equal weights the deciles are exactly numpy's ``percentile(..., method="inverted_cdf")``
(the smallest sample whose cumulative weight reaches the quantile), so a value in the store is always one the
series really took, and a test can recompute it from the raw data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kubecell.core.errors import KubecellError

QUANTILES: tuple[float, ...] = tuple(q / 10 for q in range(11))
"""p0, p10, ..., p100."""


class DistributionError(KubecellError):
    """Samples that cannot make a distribution (none, NaN, negative weights)."""


@dataclass(frozen=True)
class Distribution:
    """Deciles p0..p100 (11 values), the time-weighted mean, how many samples and how many seconds they cover."""

    deciles: tuple[float, ...]
    mean: float
    samples: int
    seconds: float

    def __post_init__(self) -> None:
        if len(self.deciles) != len(QUANTILES):
            raise DistributionError(f"a distribution has {len(QUANTILES)} deciles (p0..p100), got {len(self.deciles)}")
        if any(b < a for a, b in zip(self.deciles, self.deciles[1:], strict=False)):
            raise DistributionError(f"deciles must not decrease: {self.deciles}")
        if self.samples < 1 or self.seconds < 0 or not math.isfinite(self.mean):
            raise DistributionError(f"distribution of {self.samples} samples over {self.seconds} s, mean {self.mean}")

    def quantile(self, decile: int) -> float:
        """p{10 * decile}: ``quantile(5)`` is the median, ``quantile(9)`` p90."""
        return self.deciles[decile]


def distribution(values: Sequence[float], weights: Sequence[float] | None = None) -> Distribution:
    """The distribution of ``values``, each standing for ``weights`` seconds (1 s each when omitted).

    Raises :class:`DistributionError` for no samples, a NaN or infinite value, or a negative or non-finite
    weight, so that a bad series is reported for its job instead of landing in the history."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise DistributionError("no samples")
    if not np.all(np.isfinite(data)):
        raise DistributionError(f"{int(np.sum(~np.isfinite(data)))} of {data.size} samples are NaN or infinite")
    weight = np.ones_like(data) if weights is None else np.asarray(weights, dtype=np.float64)
    if weight.shape != data.shape:
        raise DistributionError(f"{data.size} samples but {weight.size} weights")
    if not np.all(np.isfinite(weight)) or np.any(weight < 0):
        raise DistributionError("weights must be finite seconds >= 0")
    total = float(weight.sum())
    if total <= 0:
        raise DistributionError("the samples cover no time (every weight is 0)")
    order = np.argsort(data, kind="stable")
    sorted_values, cumulative = data[order], np.cumsum(weight[order])
    deciles = []
    for q in QUANTILES:
        if q == 0:
            deciles.append(float(sorted_values[0]))
            continue
        # smallest value whose cumulative weight reaches q of the total (a tiny slack absorbs float sums)
        index = int(np.searchsorted(cumulative, q * total * (1 - 1e-12), side="left"))
        deciles.append(float(sorted_values[min(index, data.size - 1)]))
    return Distribution(tuple(deciles), float(np.dot(data, weight) / total), int(data.size), total)


def pooled(parts: Iterable[tuple[Sequence[float], Sequence[float]]]) -> Distribution:
    """One distribution over several pods' samples (each pod's ``(values, weights)``): a job's distribution,
    in which a pod that ran twice as long counts twice as much."""
    values: list[float] = []
    weights: list[float] = []
    for pod_values, pod_weights in parts:
        values.extend(pod_values)
        weights.extend(pod_weights)
    return distribution(values, weights)
