"""A score that prefers the GPU where a share would suffer and cause the least interference.

Why a score beside the co-location filter: the filter says where a share must not go; among the GPUs it
allows, a packing score alone still puts a share beside a busy one while an empty GPU is idle, and at low load
that costs speed for nothing (packing only pays when capacity is short). This score is the worst predicted
speed, in percent, of the share and the jobs already on the GPU (``core.interference``: an empty GPU scores
100, two always-busy jobs 50). Mixed with a packing score (``--placement kubecell:1+interference:1``), the
weights say how much speed a packed GPU is worth.

The predictor is the uncalibrated default (queueing 1, bandwidth 0: only GPU utilization counts), which needs
no measurements; profiles come from ``Request.profile``, else a request counts as using what it asked
(``placement.colocation.usage_of``). Whole-GPU and CPU requests score 100 everywhere: they share nothing.
"""

from __future__ import annotations

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.interference.predictor import InterferencePredictor
from kubecell.core.model import Request
from kubecell.core.placement.colocation import SharersTable, usage_of
from kubecell.core.placement.policy import MAX_NODE_SCORE, GpuScoringPolicy, IntArray


class InterferenceScore(GpuScoringPolicy):
    name = "interference"
    summary = "the worst predicted speed of a share and the jobs already on its GPU (an empty GPU: 100)"
    node_local = False  # which jobs share a GPU is not in a node's free amounts

    def __init__(self, predictor: InterferencePredictor | None = None) -> None:
        super().__init__()
        self.predictor = predictor or InterferencePredictor()
        self.table = SharersTable()

    def gpu_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        scores = np.full((nodes.size, book.max_gpus), -1, np.int64)
        sharers = self.table.of(book)
        own = usage_of(request)
        for row, node in enumerate(nodes.tolist()):
            fits = book.gpu_fits(node, request)
            for gpu in np.flatnonzero(fits).tolist():
                there = sharers.get((node, gpu))
                speed = self.predictor.worst_speed([*there, own]) if there else 1.0
                scores[row, gpu] = int(MAX_NODE_SCORE * speed)
        return scores

    def node_scores(self, book: AllocationBook, request: Request, nodes: IntArray) -> IntArray:
        return np.full(nodes.size, MAX_NODE_SCORE, np.int64)
