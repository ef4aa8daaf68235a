"""Statistical efficiency: how much training progress one example buys at a global batch size, from the
gradient noise scale (Pollux, OSDI '21, Sec. 3.2; McCandlish et al. 2018).

Why: more GPUs raise examples per second, but only a larger batch uses them well, and past the gradient noise
scale a larger batch needs proportionally more examples for the same progress. Goodput = throughput x
efficiency is what a sizing policy should maximise, not throughput.

With ``M0`` the job's initial batch size, ``M`` the global batch size, ``sqr`` the squared norm of the true
gradient and ``var`` the variance of the gradient estimate at ``M0``, Pollux's efficiency relative to ``M0`` is

    E(M) = (phi + 1) / (phi + M / M0),   phi = var / sqr,

so ``E(M0) = 1``, ``E`` falls towards ``M0 / M`` when the gradient is not noisy (phi small: a larger batch is
wasted) and stays near 1 while ``M / M0`` is below ``phi`` (noise dominates: a larger batch is as good as more
steps). Efficiency is capped at 1: below ``M0`` the learning-rate rules the job was tuned with do not hold.

The statistics a job reports are noisy and drift over training (the noise scale grows as the loss falls), so
they are smoothed by exponentially weighted least squares (recent reports dominate, one outlier does not
swing the batch size), as a function of the batch they were measured at (``GradientNoise``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

PHI_MAX = 1e9
"""Bound on the relative noise scale, so that a report with a vanishing gradient norm cannot overflow."""
PHI_MIN = 1e-6
"""Lower bound (a report of zero variance), so that its logarithm exists."""


def efficiency(global_bsz: ArrayLike, initial_bsz: float, phi: ArrayLike | None) -> NDArray[np.float64]:
    """Pollux's statistical efficiency of ``global_bsz`` relative to ``initial_bsz``, in (0, 1].

    ``phi`` is ``grad_var / grad_sqr`` (a number, or one per batch size); ``None`` (no gradient statistics
    yet) is read as ``phi = 0``: no benefit from a larger batch, so an unknown job is scaled by splitting its
    batch, never by growing it.
    """
    m = np.asarray(global_bsz, dtype=np.float64)
    scale = np.maximum(m / float(initial_bsz), 1.0)
    p = np.zeros_like(m) if phi is None else np.clip(np.asarray(phi, dtype=np.float64), 0.0, PHI_MAX)
    result: NDArray[np.float64] = (p + 1.0) / (p + scale)
    return result


class GradientNoise:
    """The noise ratio ``phi = grad_var / grad_sqr`` a job reports, smoothed over time and modelled as a power of
    the global batch it was measured at: ``phi(B) = exp(a) * B ** slope``.

    Why the batch: the statistics are measured while training at some batch ``B``, and in Sia's profiles
    (``validation-<B>.csv``) the ratio measured at a larger batch is larger, by ``B ** 0.1`` to ``B ** 0.5`` once
    training is under way. A model that kept one ``phi`` would learn it at the small batch a job starts
    with and keep under-pricing larger batches (and so more GPUs) for the rest of the job. Each report adds a
    point ``(log B, log phi)`` to exponentially weighted least squares (recent reports dominate, as phi drifts
    over training), with a ridge pull of the slope towards ``slope_prior``: with reports at one batch only,
    the slope is the prior; with reports at several, the data.
    """

    def __init__(self, *, smoothing: float = 0.9, slope_prior: float = 0.0, slope_strength: float = 0.25,
                 prior_phi: float | None = None, prior_bsz: float = 1.0) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing {smoothing} must be in [0, 1)")
        if not slope_strength > 0:
            raise ValueError(f"slope_strength {slope_strength} must be positive")
        if prior_phi is not None and not (math.isfinite(prior_phi) and prior_phi > 0):
            raise ValueError(f"prior_phi {prior_phi} must be a positive number or None")
        self.smoothing = smoothing
        self.slope_prior = slope_prior
        self.slope_strength = slope_strength
        self.prior: tuple[float, float] | None = None
        """``(a, slope)`` of ``log phi`` used until the first report: ``prior_phi`` at ``prior_bsz``, growing with
        ``slope_prior``. None: no answer before a report (``efficiency`` then reads phi as 0)."""
        if prior_phi is not None:
            self.prior = (math.log(prior_phi) - slope_prior * math.log(max(prior_bsz, 1.0)), slope_prior)
        self._s = [0.0] * 5
        """Weighted sums: weight, x, x^2, y, x*y (x = log batch, y = log phi)."""
        self._fit: tuple[float, float] | None = None

    def update(self, grad_sqr: float, grad_var: float, global_bsz: float = 1.0) -> None:
        """Fold in one report (already checked: finite, non-negative, not both zero) measured at ``global_bsz``."""
        ratio = grad_var / grad_sqr if grad_sqr > 0 else PHI_MAX
        y = math.log(min(max(ratio, PHI_MIN), PHI_MAX))
        x = math.log(max(global_bsz, 1.0))
        decay, w = self.smoothing, 1.0 - self.smoothing
        for i, value in enumerate((1.0, x, x * x, y, x * y)):
            self._s[i] = decay * self._s[i] + w * value
        self._fit = None

    @property
    def sums(self) -> tuple[float, float, float, float, float]:
        """The weighted sums the fit is solved from (weight, x, x^2, y, x*y): all the reports folded in so far
        come down to them, so they are what a saved model keeps (``saved_model``)."""
        w, sx, sxx, sy, sxy = self._s
        return (w, sx, sxx, sy, sxy)

    def restore(self, sums: Sequence[float]) -> None:
        """Take up the sums another model saved (checked by the caller: ``saved_model`` reads them)."""
        if len(sums) != 5:
            raise ValueError(f"{len(sums)} sums, not 5")
        self._s = [float(value) for value in sums]
        self._fit = None

    @property
    def known(self) -> bool:
        """Whether any report was folded in (the prior alone does not count)."""
        return self._s[0] > 0.0

    @property
    def slope(self) -> float | None:
        fit = self._solve()
        return None if fit is None else fit[1]

    def _solve(self) -> tuple[float, float] | None:
        if self._s[0] <= 0:
            return self.prior
        if self._fit is None:
            w, sx, sxx, sy, sxy = self._s
            xm, ym = sx / w, sy / w
            var_x = max(sxx / w - xm * xm, 0.0)
            cov = sxy / w - xm * ym
            slope = (cov + self.slope_strength * self.slope_prior) / (var_x + self.slope_strength)
            self._fit = (ym - slope * xm, slope)
        return self._fit

    def phi_at(self, global_bsz: float) -> float | None:
        """The noise ratio expected at ``global_bsz`` (before any report: the prior, or None without one;
        within ``[PHI_MIN, PHI_MAX]``)."""
        fit = self._solve()
        if fit is None:
            return None
        log_phi = fit[0] + fit[1] * math.log(max(global_bsz, 1.0))
        return min(max(math.exp(min(log_phi, 700.0)), PHI_MIN), PHI_MAX)

    def phi_many(self, global_bsz: ArrayLike) -> NDArray[np.float64] | None:
        """``phi_at`` of each batch size, vectorised."""
        fit = self._solve()
        if fit is None:
            return None
        log_phi = fit[0] + fit[1] * np.log(np.maximum(np.asarray(global_bsz, dtype=np.float64), 1.0))
        result: NDArray[np.float64] = np.clip(np.exp(np.minimum(log_phi, 700.0)), PHI_MIN, PHI_MAX)
        return result
