"""What becomes of a GPU's free share: the expected share that is never allocated, per free amount.

FGD scores a placement by one step of look-ahead: is the free share of a GPU big enough for the *next*
request? A GPU left with 530 milli free looks like a fragment to every request above 530, although a
470 will take it soon; one left with 190 free looks almost fine, because a few small requests fit,
although thousands of such slivers compete for those few requests and most stay idle. What a cluster
owner pays for is the share that is *never* allocated, so kubecell weighs every free amount ``g`` by
``W(g)``, the expected part of it still idle when the cluster is full.

``W`` solves a Markov chain over free amounts: a GPU with ``g`` free is filled down to ``g'`` at some
rate per arrival, or stays as it is until the cluster is full, which happens at rate ``h0`` per
arrival::

    W(g) = (h0 * g + sum_g' rate(g -> g') * W(g')) / (h0 + sum_g' rate(g -> g'))

``h0`` is the inverse of the arrivals the cluster's free capacity can still absorb at the current mean
request size, so the chain looks as far ahead as the cluster has room for. The rates are *learned from
the cluster itself* (``GapFateModel``): every allocation that lowers a GPU's free share from ``g`` to
``g'`` is one observed fill, and the exposure of amount ``g`` is how many arrivals GPUs spent with ``g``
free. Rates therefore include everything the cluster does: how often small requests arrive, how many
other slivers compete for them, which gaps hosts without CPU left can never fill. Where little has been
seen, a prior takes over: the chain in which a gap is filled by each request type of the demand
estimate at its arrival share, against a fixed hazard (``static_waste_table``); with no data at all the
learned table equals it.

A fully free GPU is the exception: its value comes from the prior only. How fast whole free GPUs get
taken depends on how long the overload lasts, which the past does not predict; learning it makes the
policy break free GPUs for small requests after a run of big ones, which pays only if the overload
continues (on the openb traces it cost more at 100 % arrived load than it gained at 130 %).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

GAPS = MILLI_PER_GPU + 1
"""Free amounts 0..1000 milli, one table entry each."""


def static_waste_table(sizes: Sequence[int], rates: Sequence[float], hazard: float) -> FloatArray:
    """The prior chain: a GPU with ``g`` free is filled by a request of size ``s <= g`` at rate
    ``rates[s]`` (arrival shares), and left as it is at rate ``hazard``. Requests of whole GPUs count as
    size 1000. Returns ``W`` over 0..1000; with no size at most ``g``, ``W(g) = g``."""
    if not hazard > 0:
        raise InvalidInputError(f"hazard {hazard} is not positive", field="prior_hazard", accepted="a number > 0")
    size = np.asarray(sizes, np.int64)
    rate = np.asarray(rates, np.float64)
    if size.shape != rate.shape:
        raise ValueError("sizes and rates must have the same length")
    keep = (size > 0) & (size <= MILLI_PER_GPU) & (rate > 0)
    order = np.argsort(size[keep], kind="stable")
    size, rate = size[keep][order], rate[keep][order]
    cumulative = np.cumsum(rate)
    table = np.arange(GAPS, dtype=np.float64)
    for gap in range(GAPS):
        k = int(np.searchsorted(size, gap, side="right"))
        if k:
            table[gap] = (hazard * gap + rate[:k] @ table[gap - size[:k]]) / (hazard + cumulative[k - 1])
    return table


class GapFateModel:
    """Learned fill rates of free GPU shares, and the waste table they imply.

    ``sync`` compares the book with what it saw last (only the nodes whose version changed) and counts
    every decrease of a GPU's free share as a fill from the old amount to the new one; increases
    (releases) and health changes move the GPU to its new amount without counting a fill. ``tick``
    lets one arrival pass: every GPU adds one arrival of exposure at its current free amount. Counts
    and exposure decay with ``half_life`` arrivals, so the rates follow a cluster whose workload
    changes. A sync costs O(changed nodes), a tick O(1001), a table O(1001 x observed amounts).
    """

    def __init__(self, *, half_life: float | None = 10_000.0, prior_strength: float = 50.0) -> None:
        if half_life is not None and not half_life > 0:
            raise InvalidInputError(
                f"fate half-life {half_life} is not positive", field="fate_half_life",
                accepted="a number of arrivals > 0, or none",
            )
        if not prior_strength > 0:
            raise InvalidInputError(
                f"prior strength {prior_strength} is not positive", field="prior_strength",
                accepted="a number of GPU-arrivals > 0",
            )
        self.half_life = half_life
        self.prior_strength = float(prior_strength)
        self.arrivals = 0
        self.count = np.zeros(GAPS, np.float64)
        """GPUs with each free amount now."""
        self.exposure = np.zeros(GAPS, np.float64)
        """Arrivals spent by GPUs at each free amount (decayed)."""
        self.fills = np.zeros((GAPS, GAPS), np.float32)
        """fills[g, g'] = observed fills from g free down to g' free (decayed)."""
        self._book: AllocationBook | None = None
        self._seen = np.zeros((0, 0), np.int64)
        self._clock = -1
        self._decayed_at = 0

    def _usable_free(self, book: AllocationBook, rows: IntArray | slice) -> IntArray:
        """Free milli per GPU slot, -1 where there is no usable GPU."""
        usable = book.gpu_present[rows] & book.gpu_healthy[rows]
        result: IntArray = np.where(usable, book.gpu_milli_free[rows], -1)
        return result

    def sync(self, book: AllocationBook) -> None:
        """Catch up with the book: count fills on the nodes that changed since the last sync."""
        if book is not self._book:
            self._book = book
            self._seen = self._usable_free(book, slice(None))
            self._clock = book.clock
            self.count = np.bincount(self._seen[self._seen >= 0], minlength=GAPS).astype(np.float64)
            return
        if book.clock == self._clock:
            return
        rows = book.changed_since(self._clock)
        self._clock = book.clock
        old, new = self._seen[rows], self._usable_free(book, rows)
        moved = old != new
        before, after = old[moved], new[moved]
        np.subtract.at(self.count, before[before >= 0], 1.0)
        np.add.at(self.count, after[after >= 0], 1.0)
        filled = (before >= 0) & (after >= 0) & (after < before)
        np.add.at(self.fills, (before[filled], after[filled]), 1.0)
        self._seen[rows] = new

    def tick(self, count: int = 1) -> None:
        """``count`` arrivals pass (while no GPU changes its free amount)."""
        self.exposure += self.count * count
        self.arrivals += count

    def _decay(self) -> None:
        if self.half_life is None:
            return
        factor = 0.5 ** ((self.arrivals - self._decayed_at) / self.half_life)
        self.exposure *= factor
        self.fills *= np.float32(factor)
        self._decayed_at = self.arrivals

    def table(
        self,
        prior_sizes: Sequence[int],
        prior_rates: Sequence[float],
        prior_hazard: float,
        horizon: float,
        free_value: float,
    ) -> FloatArray:
        """``W`` over 0..1000 from the learned rates, with the prior chain (``prior_rates`` against
        ``prior_hazard``) weighted by ``prior_strength`` GPU-arrivals of pseudo-exposure at every
        amount. ``horizon`` is the number of arrivals the cluster can still absorb (``h0 = 1 /
        horizon``); ``free_value`` is ``W(1000)``, which is not learned (see the module docstring)."""
        self._decay()
        h0 = 1.0 / max(horizon, 1.0)
        size = np.asarray(prior_sizes, np.int64)
        keep = (size > 0) & (size <= MILLI_PER_GPU)
        size = size[keep]
        # Prior rates per GPU and arrival, scaled so that with no data the chain is the static one.
        prior = np.asarray(prior_rates, np.float64)[keep] * (h0 / prior_hazard)
        weight = self.prior_strength / (self.exposure + self.prior_strength)
        observed_rows = self.fills.sum(axis=1) > 0
        table = np.arange(GAPS, dtype=np.float64)
        for gap in range(MILLI_PER_GPU):
            fits = size <= gap
            prior_rate = prior[fits] * weight[gap]
            total = float(prior_rate.sum())
            numerator = h0 * gap + float(prior_rate @ table[gap - size[fits]])
            if observed_rows[gap]:
                learned = self.fills[gap, :gap].astype(np.float64) / (self.exposure[gap] + self.prior_strength)
                total += float(learned.sum())
                numerator += float(learned @ table[:gap])
            if total > 0:
                table[gap] = numerator / (h0 + total)
        table[MILLI_PER_GPU] = free_value
        return table
