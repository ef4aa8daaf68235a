"""Fragmentation Gradient Descent (Weng et al., ATC'23): place where fragmentation grows least.

For each candidate node (and, for a share, each GPU that fits), compare the node's expected fragment
before and after the placement against the typical-pod distribution; score
``int(100 x sigmoid((F_before - F_after) / 1000))``. The GPU inside the node is the one with the best
score (lowest index on ties), as in the simulator's ``fgd_score.go`` (read, not copied).

The after-state is derived from per-typical-pod summary figures of the before-state (how many GPUs fit,
how much free share sits on too-small GPUs), so evaluating all GPUs of all candidate nodes is a few
array operations instead of a Python loop per GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.core.placement.frag import FloatArray, FragmentationMeasure, TypicalPod
from kubecell.core.placement.policy import MAX_NODE_SCORE, GpuScoringPolicy, IntArray, score_cpu_milli, truncate


def sigmoid_score(delta: FloatArray) -> IntArray:
    """int(100 x sigmoid(delta / 1000)), the FGD score of a fragmentation decrease ``delta``."""
    return truncate(1.0 / (1.0 + np.exp(-delta / 1000.0)) * float(MAX_NODE_SCORE))


class FragmentationGradientDescent(GpuScoringPolicy):
    """FGD with a fixed typical-pod distribution (computed from the workload in advance)."""

    name = "fgd"
    summary = "least growth of expected fragmentation (FGD, ATC'23)"

    def __init__(self, typical: Sequence[TypicalPod]) -> None:
        super().__init__()
        self.typical = tuple(typical)
        self.measure: FragmentationMeasure | None = None

    def attach(self, book: AllocationBook) -> None:
        self.measure = FragmentationMeasure(self.typical, book.model_names)

    def set_typical(self, typical: Sequence[TypicalPod], book: AllocationBook) -> None:
        """Replace the distribution (online variants); cached scores become stale."""
        self.typical = tuple(typical)
        self.measure = FragmentationMeasure(self.typical, book.model_names)
        self.cache_epoch += 1

    def _measure(self, book: AllocationBook) -> FragmentationMeasure:
        if self.measure is None or self.measure.model_names != book.model_names:
            self.attach(book)
        assert self.measure is not None
        return self.measure

    def gpu_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        """For a share request: FGD score per (node, GPU slot); -1 where the GPU cannot take it."""
        measure = self._measure(book)
        cpu = book.cpu_free[nodes]
        avail = book.gpu_avail[nodes]
        model = book.model_id[nodes]
        before, fit_count, small, total = measure.components(cpu, avail, model)
        cut = measure.milli
        after_avail = avail - request.gpu_milli
        was_fit = avail[:, :, None] >= cut
        now_fit = after_avail[:, :, None] >= cut
        fit_after = fit_count[:, None, :] - was_fit + now_fit
        small_after = (
            small[:, None, :]
            - np.where(was_fit, 0, avail[:, :, None])
            + np.where(now_fit, 0, after_avail[:, :, None])
        )
        total_after = np.broadcast_to((total - request.gpu_milli)[:, None], avail.shape)
        cpu_after = np.broadcast_to((cpu - score_cpu_milli(request))[:, None], avail.shape)
        after = measure.fragment(cpu_after, fit_after, small_after, total_after, model[:, None])
        delta = (before[:, None, :] - after).astype(np.float64) @ measure.share
        scores = sigmoid_score(delta)
        fits = book.gpu_fits(nodes, request)
        result: IntArray = np.where(fits, scores, -1)
        return result

    def node_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        measure = self._measure(book)
        cpu = book.cpu_free[nodes]
        model = book.model_id[nodes]
        before, fit_count, small, total = measure.components(cpu, book.gpu_avail[nodes], model)
        taken = request.gpu_count if request.is_whole else 0
        # Whole GPUs leave fully free GPUs (which fit every typical share) and become 0 free.
        fit_after = fit_count - taken * (measure.milli <= MILLI_PER_GPU)
        total_after = total - taken * MILLI_PER_GPU
        after = measure.fragment(cpu - score_cpu_milli(request), fit_after, small, total_after, model)
        delta = (before - after).astype(np.float64) @ measure.share
        return sigmoid_score(delta)
