"""Interference-aware sharing as a placement filter: a share goes only to a GPU whose sharers, with it, pass
an admission rule (``kubecell.core.interference``: no sharing, blind, a summed-utilization threshold, or
predicted slowdown).

Why a filter on GPUs rather than a score on nodes: the harm is per GPU (two jobs time-slicing one device),
and a node with one GPU that must not take the share may have another that may. The filter narrows the GPUs
a share may take, the same mask tenancy uses for a VC's cells, so every policy, gang and GPU choice respects
it without knowing about it.

What a job uses comes from ``Request.profile`` (the job's solo profile from its history, as plain data). A
request without one is taken at its word: its share of compute is its utilization (300 milli-GPU: 30 %) and
of memory bandwidth alike, and its GPU memory what it asked. So with no history the rule still holds the
sum of what sharers asked to its limit, and with history it holds what they really use.
"""

from __future__ import annotations

import math

import numpy as np

from kubecell.core.book import AllocationBook, BoolArray
from kubecell.core.interference.admission import AdmissionRule, PressureAdaptive
from kubecell.core.interference.profile import JobKey, SoloProfile
from kubecell.core.model import MILLI_PER_GPU, Request


def as_asked(request: Request, key: JobKey | None = None) -> SoloProfile:
    """What ``request`` says it uses (see the module), under ``key`` (its family's, where a driver knows the
    family but not yet its use: a pair history can still know the family's pairs) or the request's name."""
    percent = 100.0 * min(request.gpu_milli, MILLI_PER_GPU) / MILLI_PER_GPU
    return SoloProfile(key or JobKey(request.name), percent, percent, float(request.gpu_memory_mib))


def usage_of(request: Request) -> SoloProfile:
    """The request's profile, or what its request says it uses (see the module)."""
    return request.profile if request.profile is not None else as_asked(request)


class SharersTable:
    """(node, GPU) -> the profiles of the shares on it, rebuilt when the book changed (its clock moved or a
    snapshot was restored), so a decision never reads a stale table."""

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None
        self._sharers: dict[tuple[int, int], list[SoloProfile]] = {}

    def of(self, book: AllocationBook) -> dict[tuple[int, int], list[SoloProfile]]:
        key = (book.clock, id(book.allocations))
        if key != self._key:
            table: dict[tuple[int, int], list[SoloProfile]] = {}
            for allocation in book.allocations.values():
                if allocation.request.is_share:
                    node = book.index[allocation.node]
                    for gpu in allocation.gpu_indices:
                        table.setdefault((node, gpu), []).append(usage_of(allocation.request))
            self._key, self._sharers = key, table
        return self._sharers


class ColocationGuard:
    """Narrows the GPUs a share may take to those where ``rule`` admits it beside the shares already there."""

    def __init__(self, rule: AdmissionRule) -> None:
        self.rule = rule
        self.table = SharersTable()

    def sharers(self, book: AllocationBook) -> dict[tuple[int, int], list[SoloProfile]]:
        return self.table.of(book)

    def restrict(self, book: AllocationBook, request: Request, allowed: BoolArray | None, *,
                 queued: bool = True) -> BoolArray | None:
        """``allowed`` (None: every GPU) without the GPUs where ``request``, a share, would break the rule;
        unchanged for whole-GPU and CPU requests (whole GPUs are never shared). ``queued``: other jobs wait for
        capacity (a :class:`PressureAdaptive` rule then applies its ``busy`` rule)."""
        if not request.is_share:
            return allowed
        rule = self.rule.under(queued) if isinstance(self.rule, PressureAdaptive) else self.rule
        table = self.sharers(book)
        if not table:
            return allowed
        mask = np.ones_like(book.gpu_present) if allowed is None else allowed.copy()
        own = usage_of(request)
        for (node, gpu), profiles in table.items():
            if not mask[node, gpu]:
                continue
            capacity = float(book.gpu_mem_capacity[node, gpu]) or math.inf  # unknown size: memory not judged here
            if not rule.admits([*profiles, own], capacity):
                mask[node, gpu] = False
        return mask
