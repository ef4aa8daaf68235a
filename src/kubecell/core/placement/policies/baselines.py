"""The packing baselines of the FGD paper, faithful to the FGD simulator's score plugins.

Each rule is reproduced with its integer arithmetic, because scores are truncated to 0..100 and the
truncation decides which nodes tie. Sources (read, not copied): ``random_score.go``,
``dot_product_score.go``, ``gpu_clustering_score.go``, ``gpu_packing_score.go`` and ``best_fit_score.go``
in hkust-adsl/kubernetes-scheduler-simulator, ``pkg/simulator/plugin``.
"""

from __future__ import annotations

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray, affinity_class
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.core.placement.gpu_choice import random_gpu
from kubecell.core.placement.policy import (
    MAX_NODE_SCORE,
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    IntArray,
    Policy,
    divide_toward_zero,
    score_cpu_milli,
    truncate,
)


class RandomFit(Policy):
    """A uniformly random feasible node; a uniformly random fitting GPU inside it."""

    name = "random"
    summary = "uniformly random feasible node and GPU"
    node_local = False
    random_node = True

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        return np.zeros(len(nodes), np.int64)

    def choose_gpus(
        self, book: AllocationBook, request: Request, node: int, rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> tuple[int, ...]:
        return random_gpu(book, request, node, rng, allowed)


class DotProduct(Policy):
    """Tetris: prefer the node whose free (CPU, GPU) vector aligns least with the request.

    Score = 100 x (1 - (free . request) / 2) with both vectors divided by a 128-vCPU, 8-GPU machine
    and the GPU dimension merged over the node (the simulator's ``merge``/``max`` options).
    """

    name = "dotprod"
    summary = "Tetris dot product of free and requested (CPU, GPU)"

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        node_cpu = book.cpu_free[nodes].astype(np.float64) / MAX_SPEC_CPU_MILLI
        node_gpu = book.total_avail[nodes].astype(np.float64) / MAX_SPEC_GPU_MILLI
        pod_cpu = float(score_cpu_milli(request)) / MAX_SPEC_CPU_MILLI
        pod_gpu = float(request.total_gpu_milli) / MAX_SPEC_GPU_MILLI
        dot = node_cpu * pod_cpu + node_gpu * pod_gpu
        return truncate(float(MAX_NODE_SCORE) * (1.0 - dot / 2.0))


class GpuClustering(Policy):
    """Keep requests of one kind (shares, 1-GPU, 2-GPU, ...) together, then prefer fuller nodes.

    75..100: every GPU request on the node is of the same kind; 50..75: the kind is among several;
    25..50: an idle node; 0..25: other kinds only. Inside each band, less free GPU scores higher.
    CPU-only requests score 0 everywhere.
    """

    name = "gpuclustering"
    summary = "cluster requests of the same GPU kind, then fuller nodes"

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        if not request.wants_gpu:
            return np.zeros(len(nodes), np.int64)
        kind = affinity_class(request)
        counts = book.affinity[nodes]
        kinds_present = (counts > 0).sum(axis=1)
        has_kind = counts[:, kind] > 0
        band = divide_toward_zero(
            (MAX_NODE_SCORE // 4) * (MAX_SPEC_GPU_MILLI - book.total_avail[nodes]), MAX_SPEC_GPU_MILLI
        )
        offset = np.where(
            has_kind,
            np.where(kinds_present == 1, MAX_NODE_SCORE * 3 // 4, MAX_NODE_SCORE * 2 // 4),
            np.where(kinds_present == 0, MAX_NODE_SCORE // 4, 0),
        )
        result: IntArray = band + offset
        return result


class GpuPacking(Policy):
    """Prefer shared GPUs, then free GPUs on used nodes, then idle nodes (gpushare-style packing).

    100 - (free share of the GPUs used)/10, at least 50, when the request fits on partly used GPUs;
    50 - (free GPUs it must open), at least 33, on a used node; 33 - free GPUs on an idle node.
    CPU-only requests score 0 everywhere.
    """

    name = "gpupacking"
    summary = "shared GPUs first, then used nodes, then idle nodes"

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        return self._score(book, request, nodes, None)

    def score_within(self, book: AllocationBook, request: Request, nodes: IntArray, allowed: BoolArray) -> IntArray:
        return self._score(book, request, nodes, allowed)

    def _score(self, book: AllocationBook, request: Request, nodes: IntArray, allowed: BoolArray | None) -> IntArray:
        if not request.wants_gpu:
            return np.zeros(len(nodes), np.int64)
        fully_free = (book.gpu_avail[nodes] == MILLI_PER_GPU).sum(axis=1)
        idle_node = fully_free == book.gpu_count[nodes]
        idle_score = np.maximum(MAX_NODE_SCORE // 3 - fully_free, fully_free)
        if request.is_whole:
            used_score = np.full(
                len(nodes), max(MAX_NODE_SCORE // 2 - request.gpu_count, MAX_NODE_SCORE // 3), np.int64
            )
        else:
            avail = book.gpu_avail[nodes]
            fits = (avail >= max(request.gpu_milli, 1)) & (book.gpu_mem_free[nodes] >= request.gpu_memory_mib)
            if allowed is not None:
                fits &= allowed
            tightest = np.where(fits, avail, MILLI_PER_GPU + 1).min(axis=1)
            opens_free_gpu = tightest == MILLI_PER_GPU
            shared = np.maximum(MAX_NODE_SCORE - (tightest * 100 // MILLI_PER_GPU) // 10, MAX_NODE_SCORE // 2)
            used_score = np.where(opens_free_gpu, max(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3), shared)
        result: IntArray = np.where(idle_node, idle_score, used_score)
        return result


class BestFit(Policy):
    """Minimise the weighted leftover 0.5 x CPU/128 vCPU + 0.5 x GPU/8 GPUs after placement.

    Raw scores are min-max normalised over the feasible nodes with integer arithmetic, exactly as the
    simulator's ``NormalizeScore`` does, which merges nearby raw scores into ties.
    """

    name = "bestfit"
    summary = "least weighted CPU+GPU leftover after placement"
    normalize = True

    def score(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        cpu_left = (book.cpu_free[nodes].astype(np.float64) - score_cpu_milli(request)) / MAX_SPEC_CPU_MILLI
        gpu_left = (book.total_avail[nodes].astype(np.float64) - request.total_gpu_milli) / MAX_SPEC_GPU_MILLI
        leftover = cpu_left * 0.5 + gpu_left * 0.5
        return truncate((1.0 - leftover) * float(MAX_NODE_SCORE))
