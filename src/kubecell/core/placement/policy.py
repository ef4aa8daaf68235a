"""The Score extension point: a placement policy scores candidate nodes and picks GPUs inside one.

Scores are integers in 0..100 as in kube-scheduler's framework (``MaxNodeScore``); the scheduler keeps
the highest and breaks ties by a node rank (see ``kubecell.core.placement.placer``). A policy declares
whether a node's score depends only on that node's own state and the request (``node_local``): then
the placer may cache scores per request shape and recompute only the nodes that changed. A
``node_local`` score is a function of the node's resources (capacity and free amounts, per GPU
included) and the request, never of the node's name or position: equal nodes score equally.

Tenancy restricts some requests to some GPUs of a node (a virtual cluster's cells). Node scores that
depend on which GPU a share would take say so by overriding ``score_within``; every GPU rule takes the
allowed GPUs of the chosen node.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from kubecell.core.book import AllocationBook, BoolArray
from kubecell.core.model import Request
from kubecell.core.placement.gpu_choice import best_fit_gpu, whole_gpus

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

MAX_NODE_SCORE = 100
MAX_SPEC_CPU_MILLI = 128_000
"""Normalisers of the FGD simulator's packing baselines (a 128-vCPU, 8-GPU machine)."""
MAX_SPEC_GPU_MILLI = 8_000


def truncate(values: FloatArray) -> IntArray:
    """Float to integer toward zero, as Go's int64(x) conversion does."""
    out: IntArray = np.trunc(values).astype(np.int64)
    return out


def divide_toward_zero(numerator: IntArray, denominator: int) -> IntArray:
    """Integer division toward zero (Go semantics; numpy's // floors)."""
    quotient: IntArray = np.sign(numerator) * (np.abs(numerator) // denominator)
    return quotient


def score_cpu_milli(request: Request) -> int:
    """CPU as kube-scheduler's scoring sees it: a pod without a CPU request counts as 100m."""
    return request.cpu_milli or 100


class Policy(ABC):
    """A node-scoring rule plus a GPU-choosing rule."""

    name: ClassVar[str]
    summary: ClassVar[str]
    node_local: ClassVar[bool] = True
    normalize: ClassVar[bool] = False
    random_node: ClassVar[bool] = False

    def __init__(self) -> None:
        self.cache_epoch = 0
        """Bumped when the policy's own parameters change, so that cached scores are dropped."""

    def attach(self, book: AllocationBook) -> None:  # noqa: B027 - optional hook
        """Prepare per-cluster tables before the first decision on ``book``."""

    @abstractmethod
    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        """Integer scores (higher is better) for the feasible ``nodes``."""

    def score_within(self, book: AllocationBook, request: Request, nodes: IntArray, allowed: BoolArray) -> IntArray:
        """Scores for ``nodes`` when the request may take only the GPUs flagged in ``allowed`` (one row per
        node). Node-level rules (free totals, counts of whole GPUs) do not depend on which GPU is taken,
        so by default this is ``score``."""
        return self.score(book, request, nodes)

    def choose_gpus(
        self, book: AllocationBook, request: Request, node: int, rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> tuple[int, ...]:
        """The GPUs of ``node`` (among ``allowed``) the request gets; best fit unless the policy says otherwise."""
        return best_fit_gpu(book, request, node, allowed)

    def observe(self, request: Request, count: int = 1) -> None:  # noqa: B027 - optional hook
        """Called once per arrival of ``count`` identical requests (a gang's members), before they are
        placed (online policies learn here)."""


class GpuScoringPolicy(Policy):
    """A policy that scores every (node, GPU) pair for a share request: a node scores as its best GPU,
    and the GPU chosen inside the winning node is that best GPU, so node choice and GPU choice follow
    one measure (FGD and kubecell's own policy)."""

    @abstractmethod
    def gpu_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        """For a share request: score per (node, GPU slot); -1 where the GPU cannot take it."""

    @abstractmethod
    def node_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        """For a whole-GPU or CPU-only request: score per node."""

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        if request.is_share:
            best: IntArray = self.gpu_scores(book, request, nodes).max(axis=1)
            return best
        return self.node_scores(book, request, nodes)

    def score_within(self, book: AllocationBook, request: Request, nodes: IntArray, allowed: BoolArray) -> IntArray:
        if request.is_share:
            best: IntArray = np.where(allowed, self.gpu_scores(book, request, nodes), -1).max(axis=1)
            return best
        return self.node_scores(book, request, nodes)

    def choose_gpus(
        self, book: AllocationBook, request: Request, node: int, rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> tuple[int, ...]:
        if not request.wants_gpu:
            return ()
        if request.is_whole:
            return whole_gpus(book, request, node, allowed)
        scores = self.gpu_scores(book, request, np.array([node], np.int64))[0]
        if allowed is not None:
            scores = np.where(allowed, scores, -1)
        return (int(np.argmax(scores)),)
