"""The binpack and spread modes users of gpushare, KubeShare and Alnair know.

``binpack`` fills the most utilised node that fits (by GPU compute for GPU requests, by CPU for CPU-only
ones) and the tightest GPU inside it, leaving whole nodes free for large jobs. ``spread`` does the
opposite for latency-sensitive services that prefer an idle GPU to themselves.
"""

from __future__ import annotations

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.core.placement.gpu_choice import worst_fit_gpu
from kubecell.core.placement.policy import MAX_NODE_SCORE, IntArray, Policy, truncate


def _left_and_capacity(book: AllocationBook, request: Request, nodes: IntArray) -> tuple[IntArray, IntArray]:
    """Per node: GPU milli (or CPU milli, for CPU-only requests) left after placement, and the capacity."""
    if request.wants_gpu:
        capacity = np.maximum(book.gpu_count[nodes] * MILLI_PER_GPU, 1)
        left = book.total_avail[nodes] - request.total_gpu_milli
    else:
        capacity = np.maximum(book.cpu_capacity[nodes], 1)
        left = book.cpu_free[nodes] - request.cpu_milli
    return left, capacity


def utilisation_after(book: AllocationBook, request: Request, nodes: IntArray) -> np.ndarray:
    """Fraction (0..1) of the node's GPU compute (or CPU, for CPU-only requests) in use after placement."""
    left, capacity = _left_and_capacity(book, request, nodes)
    return 1.0 - left.astype(np.float64) / capacity


def _percent(amount: IntArray, capacity: IntArray) -> IntArray:
    # One correctly rounded division of exact integers, then truncation: a node at exactly 45 % scores 45
    # (``(1 - 0.55) * 100`` would give 44.999... and truncate to 44).
    return truncate(amount.astype(np.float64) * MAX_NODE_SCORE / capacity)


class Binpack(Policy):
    """Most utilised node first; best-fit GPU."""

    name = "binpack"
    summary = "fill the most utilised node and the tightest GPU"

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        left, capacity = _left_and_capacity(book, request, nodes)
        return _percent(capacity - left, capacity)


class Spread(Policy):
    """Least utilised node first; the GPU with the most free compute."""

    name = "spread"
    summary = "least utilised node and the emptiest GPU"

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        left, capacity = _left_and_capacity(book, request, nodes)
        return _percent(left, capacity)

    def choose_gpus(
        self, book: AllocationBook, request: Request, node: int, rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> tuple[int, ...]:
        return worst_fit_gpu(book, request, node, allowed)
