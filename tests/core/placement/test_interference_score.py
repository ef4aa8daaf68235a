"""The interference score: an empty GPU scores 100, a GPU beside a busy share less (the predicted worst speed of
the two); mixed with a packing score it sends a share to an idle GPU when the busy one would slow it, and beside
a light one when that costs little."""

from __future__ import annotations

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.interference import JobKey, SoloProfile
from kubecell.core.model import Request, make_node
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.policies.interference import InterferenceScore
from kubecell.core.placement.registry import make_policy
from tests.core.placement.test_placer import TYPICAL


def share(name: str, util: float, milli: int = 400) -> Request:
    return Request(name, gpu_count=1, gpu_milli=milli, gpu_memory_mib=1000,
                   profile=SoloProfile(JobKey(name), util, util, 1000.0))


def book_with(util_on_gpu0: float) -> AllocationBook:
    book = AllocationBook([make_node("n0", cpu_milli=64_000, memory_mib=1 << 18, gpu_count=2, gpu_model="A100")])
    book.allocate(share("there", util_on_gpu0), 0, [0])
    return book


def test_an_empty_gpu_scores_100_and_a_busy_neighbour_less() -> None:
    scores = InterferenceScore().gpu_scores(book_with(80.0), share("new", 80.0), np.array([0]))[0]
    # default model, two sharers: 1 / (1 + 0.8 * 0.8) = 0.609 -> 60
    assert scores.tolist()[:2] == [60, 100]
    full = InterferenceScore().gpu_scores(book_with(80.0), share("big", 80.0, milli=700), np.array([0]))[0]
    assert full.tolist()[:2] == [-1, 100], "GPU 0 has 600 milli left: it cannot take 700"


def test_mixed_with_packing_a_share_avoids_a_busy_gpu_but_joins_a_light_one() -> None:
    # FGD (given typical shares) prefers packing beside the existing share: 52 for GPU 0, 48 for the empty GPU 1.
    def placed(util: float, policy: str) -> tuple[int, ...]:
        found = Placer(book_with(util), make_policy(policy, TYPICAL)).decide(share("new", util))
        assert found is not None
        return found.gpus

    assert placed(90.0, "fgd") == (0,), "the packing score alone packs regardless"
    assert placed(90.0, "fgd:1+interference:1") == (1,), "beside a 90 % job both would run at 55 %"
    assert placed(50.0, "fgd:1+interference:1") == (1,), "at 80 %, 20 points of speed outweigh 4 of packing"
    assert placed(10.0, "fgd:1+interference:1") == (0,), "beside a 10 % job the loss is 1 %: packing wins"
