"""The gradient noise a simulated job really has, in place of the one its goodput model learns (a diagnostic).

Why: kubecell's online goodput model (``OnlineGoodput``) can be wrong in two places, the throughput it fits
from step times and the gradient noise it smooths from the statistics the job reports. Running the same
policy three ways (``kubecell``: both learned; ``kubecell-true-noise``: throughput learned, noise true;
``kubecell-oracle``: the true goodput) tells how much of the gap to the truth each half costs, per
application (docs/elastic.md, "Where the online model loses"). Never used by the product's own policies.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kubecell.core.elastic.efficiency import PHI_MAX, PHI_MIN, GradientNoise
from kubecell.sim.elastic.applications import ApplicationModel


class TrueNoise(GradientNoise):
    """``GradientNoise`` answering from the application's validation curves at the job's current epoch."""

    def __init__(self, app: ApplicationModel, epoch: Callable[[], int]) -> None:
        super().__init__()
        self.app = app
        self.epoch = epoch
        self._sizes = np.asarray(app.batch_sizes, dtype=np.float64)
        self._curves: tuple[int, NDArray[np.float64], NDArray[np.float64]] | None = None

    def _at_epoch(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Squared gradient norm and variance of every validated batch size in the current epoch (cached)."""
        epoch = min(max(self.epoch(), 0), self.app.epochs - 1)
        if self._curves is None or self._curves[0] != epoch:
            self._curves = (epoch, np.array([curve.grad_sqr[epoch] for curve in self.app.curves], dtype=np.float64),
                            np.array([curve.grad_var[epoch] for curve in self.app.curves], dtype=np.float64))
        return self._curves[1], self._curves[2]

    def update(self, grad_sqr: float, grad_var: float, global_bsz: float = 1.0) -> None:
        """Reports teach nothing: the truth is read at every question."""

    @property
    def known(self) -> bool:
        return True

    def phi_at(self, global_bsz: float) -> float | None:
        return float(self.phi_many(np.array([global_bsz], dtype=np.float64))[0])

    def phi_many(self, global_bsz: ArrayLike) -> NDArray[np.float64]:
        """``grad_var / grad_sqr``, each linear in the batch size between the validated ones and held at the
        ends, as ``ApplicationModel.grad_stats`` reads them."""
        sizes = np.asarray(global_bsz, dtype=np.float64)
        sqr_curve, var_curve = self._at_epoch()
        sqr = np.interp(sizes, self._sizes, sqr_curve)
        var = np.interp(sizes, self._sizes, var_curve)
        ratio = np.where(sqr > 0, var / np.where(sqr > 0, sqr, 1.0), PHI_MAX)
        result: NDArray[np.float64] = np.clip(ratio, PHI_MIN, PHI_MAX)
        return result
