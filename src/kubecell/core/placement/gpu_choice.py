"""The choose-GPU extension point: once a node is picked, which of its GPUs the request gets.

gpushare, KubeShare and the FGD simulator all separate the node decision from the device decision;
these are the device rules they use. Whole-GPU requests take completely free GPUs; with a topology
constraint they take them inside the fullest NVLink group (or NUMA node) that still fits, which keeps
larger groups intact for later multi-GPU requests.

Every rule takes an optional ``allowed`` row (one flag per GPU slot of the node): the GPUs tenancy
lets this request use (its virtual cluster's cells, or capacity nobody has bound). A rule never picks
a GPU outside it.
"""

from __future__ import annotations

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray
from kubecell.core.errors import AllocationError
from kubecell.core.model import Request, TopologyLevel


def fitting_gpus(book: AllocationBook, request: Request, node: int, allowed: BoolArray | None = None) -> np.ndarray:
    """Indices of the GPUs of ``node`` that could take one GPU's worth of ``request``."""
    fits = book.gpu_fits(node, request)
    if allowed is not None:
        fits &= allowed
    return np.flatnonzero(fits)


def whole_gpus(book: AllocationBook, request: Request, node: int, allowed: BoolArray | None = None) -> tuple[int, ...]:
    """The first free GPUs by index, or, with a topology constraint, the tightest group that fits."""
    full = book.gpu_full[node]
    if allowed is not None:
        full = full & allowed
    k = request.gpu_count
    level = request.topology
    if level is not None and level in (TopologyLevel.NVLINK, TopologyLevel.NUMA):
        groups = book.nvlink_group[node] if level == TopologyLevel.NVLINK else book.numa_group[node]
        best_group, best_free = -1, 1 << 30
        for group in range(book.max_gpus):
            free = int((full & (groups == group)).sum())
            if k <= free < best_free:
                best_group, best_free = group, free
        if best_group < 0:
            raise AllocationError(f"no {level.name} group of node {book.nodes[node].name!r} has {k} free GPUs")
        full = full & (groups == best_group)
    chosen = np.flatnonzero(full)[:k]
    if len(chosen) < k:
        raise AllocationError(f"node {book.nodes[node].name!r} has fewer than {k} free GPUs")
    return tuple(int(i) for i in chosen)


def _share_candidates(book: AllocationBook, request: Request, node: int, allowed: BoolArray | None) -> np.ndarray:
    candidates = fitting_gpus(book, request, node, allowed)
    if candidates.size == 0:
        raise AllocationError(f"no GPU of node {book.nodes[node].name!r} fits {request.name!r}")
    return candidates


def best_fit_gpu(book: AllocationBook, request: Request, node: int,
                 allowed: BoolArray | None = None) -> tuple[int, ...]:
    """Shares go to the fitting GPU with the least free compute (lowest index on ties)."""
    if not request.wants_gpu:
        return ()
    if request.is_whole:
        return whole_gpus(book, request, node, allowed)
    candidates = _share_candidates(book, request, node, allowed)
    free = book.gpu_avail[node, candidates]
    return (int(candidates[int(np.argmin(free))]),)


def worst_fit_gpu(book: AllocationBook, request: Request, node: int,
                  allowed: BoolArray | None = None) -> tuple[int, ...]:
    """Shares go to the fitting GPU with the most free compute (spreads load over GPUs)."""
    if not request.wants_gpu:
        return ()
    if request.is_whole:
        return whole_gpus(book, request, node, allowed)
    candidates = _share_candidates(book, request, node, allowed)
    free = book.gpu_avail[node, candidates]
    return (int(candidates[int(np.argmax(free))]),)


def random_gpu(book: AllocationBook, request: Request, node: int, rng: np.random.Generator,
               allowed: BoolArray | None = None) -> tuple[int, ...]:
    """Shares go to a uniformly random fitting GPU."""
    if not request.wants_gpu:
        return ()
    if request.is_whole:
        return whole_gpus(book, request, node, allowed)
    candidates = _share_candidates(book, request, node, allowed)
    return (int(candidates[int(rng.integers(candidates.size))]),)
