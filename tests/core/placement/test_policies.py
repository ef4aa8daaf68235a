"""Placement policies: hand-checked scores, node and GPU choices, tie-breaking and the registry.

Every expected number below is worked out by hand from the formula in the policy's docstring, with Go's
truncation toward zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError, UnknownPolicyError
from kubecell.core.model import MILLI_PER_GPU, Request, make_node
from kubecell.core.placement.frag import PodShape, TypicalPod
from kubecell.core.placement.gpu_choice import best_fit_gpu
from kubecell.core.placement.placer import Placement, Placer, normalize_scores
from kubecell.core.placement.policies.baselines import BestFit, DotProduct, GpuClustering, GpuPacking, RandomFit
from kubecell.core.placement.policies.fgd import FragmentationGradientDescent, sigmoid_score
from kubecell.core.placement.policies.utilization import Binpack, Spread
from kubecell.core.placement.policy import Policy, divide_toward_zero, score_cpu_milli, truncate
from kubecell.core.placement.registry import (
    FGD_BASELINES,
    PolicyContext,
    canonical_policy_name,
    make_policy,
    parse_policy_list,
    policy_names,
    policy_summaries,
)

ALL_POLICIES = ["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "binpack", "spread", "kubecell",
                "interference"]


def share(name: str = "s", milli: int = 0, memory: int = 0, cpu: int = 0, **kw: Any) -> Request:
    return Request(name, cpu_milli=cpu, gpu_count=1, gpu_milli=milli, gpu_memory_mib=memory, **kw)


def whole(name: str = "w", count: int = 1, cpu: int = 0, **kw: Any) -> Request:
    return Request(name, cpu_milli=cpu, gpu_count=count, gpu_milli=MILLI_PER_GPU, **kw)


def typical(*items: tuple[int, int, int, float]) -> list[TypicalPod]:
    """(cpu, per-GPU milli, GPU count, share) -> typical pods."""
    return [TypicalPod(PodShape(cpu, milli, count), s) for cpu, milli, count, s in items]


def scenario() -> AllocationBook:
    """idle8: 8 idle A100, 64 vCPU; half: 2 T4, GPU0 600 milli used (free 400), 16 vCPU;
    whole: 4 T4, GPUs 0-1 held by one 2-GPU job (free [0, 0, 1000, 1000]), 32 vCPU."""
    book = AllocationBook(
        [
            make_node("idle8", cpu_milli=64000, memory_mib=256000, gpu_count=8, gpu_model="A100"),
            make_node("half", cpu_milli=16000, memory_mib=64000, gpu_count=2, gpu_model="T4"),
            make_node("whole", cpu_milli=32000, memory_mib=64000, gpu_count=4, gpu_model="T4"),
        ]
    )
    book.allocate(share("x", milli=600), 1, [0])
    book.allocate(whole("y", 2), 2, [0, 1])
    return book


SCENARIO_REQUEST = share("req", milli=300, cpu=1000)

# policy -> (raw scores of idle8, half, whole), chosen node, chosen GPUs
SCENARIO_EXPECTED: dict[str, tuple[list[int], int, tuple[int, ...]]] = {
    # dot = cpu_free/128k * 1000/128k + gpu_free/8k * 300/8k; 100 * (1 - dot/2):
    # idle8 0.5*0.0078125 + 1*0.0375 -> 97.93; half 0.125*.. + 0.175*0.0375 -> 99.62; whole -> 99.43.
    # half and whole tie at 99: the node-name order puts "half" first.
    "dotprod": ([97, 99, 99], 1, (0,)),
    # idle: 25 + 0; half: same kind only, 75 + int(25 * 6600 / 8000) = 75 + 20; whole: other kind, int(18.75).
    "gpuclustering": ([25, 95, 18], 1, (0,)),
    # idle: max(33 - 8, 8); half: tightest fitting GPU has 400 free: 100 - 40 // 10; whole: opens a free GPU: 49.
    "gpupacking": ([25, 96, 49], 1, (0,)),
    # 100 * (1 - (0.5 (cpu_free - 1000)/128k + 0.5 (gpu_free - 300)/8k)): 27.27, 87.27, 77.27.
    "bestfit": ([27, 87, 77], 1, (0,)),
    # GPU utilisation after placement: 300/8000 -> 3.75, 900/2000 -> 45, 2300/4000 -> 57.5 (57.4999.. in floats).
    "binpack": ([3, 45, 57], 2, (2,)),
    # 100 - the above: 96.25, 55, 42.5.
    "spread": ([96, 55, 42], 0, (0,)),
}


@pytest.mark.parametrize("name", sorted(SCENARIO_EXPECTED))
def test_scenario_scores_and_choices(name: str) -> None:
    book = scenario()
    policy = make_policy(name)
    raw, node, gpus = SCENARIO_EXPECTED[name]
    assert policy.score(book, SCENARIO_REQUEST, np.arange(book.size)).tolist() == raw
    placement = Placer(book, policy).place(SCENARIO_REQUEST)
    assert placement == Placement(node, gpus)
    # Committing the decision is accepted by the book.
    book.allocate(SCENARIO_REQUEST, placement.node, placement.gpus)
    book.check_invariants()


def test_dotprod_tie_goes_to_the_smaller_rank() -> None:
    book = scenario()
    # Same scores (99, 99) for half and whole; rank whole before half.
    placer = Placer(book, DotProduct(), tie_rank=np.array([0, 2, 1]))
    assert placer.place(SCENARIO_REQUEST) == Placement(2, (2,))


def test_bestfit_normalised_scores() -> None:
    book = scenario()
    raw = BestFit().score(book, SCENARIO_REQUEST, np.arange(3))
    # (77 - 27) * 100 // (87 - 27) = 83
    assert normalize_scores(raw).tolist() == [0, 100, 83]


# ------------------------------------------------------------------------------- per-policy details


@pytest.mark.parametrize(
    ("setup", "request_", "expected"),
    [
        # Same kind alongside another kind: 50 + int(25 * (8000 - 6500) / 8000) = 50 + 4.
        pytest.param([("s", 0), ("w", 1)], share(milli=100), 54, id="mixed-kinds"),
        pytest.param([("w", 1)], whole(count=1), 75 + 3, id="same-whole-kind"),
        pytest.param([("w", 1)], whole(count=2), 0 + 3, id="other-kind-only"),
        pytest.param([], whole(count=8), 25 + 0, id="idle"),
        pytest.param([("s", 0)], Request("c", cpu_milli=10), 0, id="cpu-only-request"),
    ],
)
def test_gpuclustering_bands(setup: list[tuple[str, int]], request_: Request, expected: int) -> None:
    book = AllocationBook([make_node("n", cpu_milli=1000, memory_mib=1000, gpu_count=8, gpu_model="T4")])
    for name, gpu in setup:
        book.allocate(share(name, milli=500) if name.startswith("s") else whole(name), 0, [gpu])
    assert GpuClustering().score(book, request_, np.array([0])).tolist() == [expected]


def test_gpuclustering_band_truncates_toward_zero_on_big_nodes() -> None:
    # Ten GPUs with 9900 milli free: 25 * (8000 - 9900) / 8000 = -5.94 -> -5 (Go), not -6 (floor).
    book = AllocationBook([make_node("n", cpu_milli=1000, memory_mib=1000, gpu_count=10, gpu_model="T4")])
    book.allocate(share("s", milli=100), 0, [0])
    assert GpuClustering().score(book, share(milli=100), np.array([0])).tolist() == [75 - 5]
    assert divide_toward_zero(np.array([-47500, 47500, -8000, 0]), 8000).tolist() == [-5, 5, -1, 0]


@pytest.mark.parametrize(
    ("gpus", "used", "request_", "expected"),
    [
        pytest.param(1, [], share(milli=100), 32, id="idle-1-gpu"),
        pytest.param(8, [], whole(count=2), 25, id="idle-8-gpus"),
        pytest.param(4, [1], whole(count=2), 48, id="whole-on-used-node"),
        pytest.param(4, [1], whole(count=3), 47, id="whole-3-on-used-node"),
        pytest.param(4, [1], share(milli=100), 100 - 99 // 10, id="share-on-gpu-with-999-free"),
        pytest.param(4, [900], share(milli=100), 100 - 10 // 10, id="share-fills-gpu"),
        pytest.param(4, [500], share(milli=600), 49, id="share-opens-free-gpu"),
        pytest.param(4, [1, 500], share(milli=400), 100 - 50 // 10, id="tightest-fitting-gpu"),
        pytest.param(4, [500], Request("c", cpu_milli=1), 0, id="cpu-only-request"),
    ],
)
def test_gpupacking_cases(gpus: int, used: list[int], request_: Request, expected: int) -> None:
    book = AllocationBook([make_node("n", cpu_milli=1000, memory_mib=1000, gpu_count=gpus, gpu_model="T4")])
    for i, milli in enumerate(used):
        book.allocate(share(f"u{i}", milli=milli), 0, [i])
    assert GpuPacking().score(book, request_, np.array([0])).tolist() == [expected]


def test_gpupacking_whole_score_has_a_floor() -> None:
    book = AllocationBook([make_node("n", cpu_milli=1000, memory_mib=1000, gpu_count=24, gpu_model="T4")])
    book.allocate(share("u", milli=1), 0, [0])
    assert GpuPacking().score(book, whole(count=20), np.array([0])).tolist() == [33]


def test_dotprod_counts_missing_cpu_request_as_100m() -> None:
    book = AllocationBook([make_node("n", cpu_milli=128000, memory_mib=1000, gpu_count=8, gpu_model="T4")])
    assert score_cpu_milli(Request("c")) == 100
    assert score_cpu_milli(Request("c", cpu_milli=7)) == 7
    # dot = 1 * 100/128000 + 1 * 8000/8000 = 1.00078125 -> 100 * (1 - 0.500390625) = 49.96
    assert DotProduct().score(book, whole(count=8), np.array([0])).tolist() == [49]
    # dot = 1 * 128000/128000 + 1 * 8000/8000 = 2 -> 0
    assert DotProduct().score(book, whole(count=8, cpu=128000), np.array([0])).tolist() == [0]


def test_binpack_and_spread_use_cpu_for_cpu_only_requests() -> None:
    book = AllocationBook(
        [
            make_node("a", cpu_milli=8000, memory_mib=1000, gpu_count=2, gpu_model="T4"),
            make_node("b", cpu_milli=4000, memory_mib=1000),
        ]
    )
    request_ = Request("c", cpu_milli=1000)
    # a: 1000/8000 used -> 12.5; b: 1000/4000 -> 25.
    assert Binpack().score(book, request_, np.arange(2)).tolist() == [12, 25]
    assert Spread().score(book, request_, np.arange(2)).tolist() == [87, 75]
    assert Placer(book, Binpack()).place(request_) == Placement(1, ())
    assert Placer(book, Spread()).place(request_) == Placement(0, ())


@pytest.mark.parametrize("capacity", [1000, 2000, 3000, 7000, 8000, 12000])
def test_binpack_and_spread_truncate_exact_percentages(capacity: int) -> None:
    # Utilisation after placement is used / capacity; the scores are its exact integer percent, rounded down.
    book = AllocationBook([make_node("n", cpu_milli=capacity, memory_mib=1)])
    for used in range(0, capacity + 1, 10):
        request_ = Request("c", cpu_milli=used)
        assert Binpack().score(book, request_, np.array([0])).tolist() == [used * 100 // capacity], used
        assert Spread().score(book, request_, np.array([0])).tolist() == [(capacity - used) * 100 // capacity], used


def test_binpack_exact_percent_on_gpus() -> None:
    book = AllocationBook([make_node("n", cpu_milli=1, memory_mib=1, gpu_count=2, gpu_model="T4")])
    book.allocate(share("u", milli=600), 0, [0])
    # (600 + 300) / 2000 = 45 % exactly.
    assert Binpack().score(book, share(milli=300), np.array([0])).tolist() == [45]
    assert Spread().score(book, share(milli=300), np.array([0])).tolist() == [55]


def test_binpack_best_fit_gpu_and_spread_worst_fit_gpu() -> None:
    book = AllocationBook([make_node("n", cpu_milli=8000, memory_mib=1000, gpu_count=3, gpu_model="T4")])
    book.allocate(share("a", milli=500), 0, [0])
    book.allocate(share("b", milli=800), 0, [2])
    request_ = share(milli=200)
    assert Placer(book, Binpack()).place(request_) == Placement(0, (2,))  # 200 free: the tightest
    assert Placer(book, Spread()).place(request_) == Placement(0, (1,))  # 1000 free: the emptiest


# ---------------------------------------------------------------------------------------------- FGD


def fgd_node_book() -> AllocationBook:
    """a: 3 T4 with free [1000, 700, 500]; b: 1 idle T4."""
    book = AllocationBook(
        [
            make_node("a", cpu_milli=8000, memory_mib=1000, gpu_count=3, gpu_model="T4"),
            make_node("b", cpu_milli=8000, memory_mib=1000, gpu_count=1, gpu_model="T4"),
        ]
    )
    book.allocate(share("u1", milli=300), 0, [1])
    book.allocate(share("u2", milli=500), 0, [2])
    return book


def test_fgd_hand_computed_gpu_scores_and_choice() -> None:
    # Typical pods: one whole GPU (50 %) and half a GPU (50 %).
    policy = FragmentationGradientDescent(typical((0, 1000, 1, 0.5), (0, 500, 1, 0.5)))
    book = fgd_node_book()
    policy.attach(book)
    request_ = share(milli=200)
    # Node a before: the whole pod sees 700 + 500 stranded, the half pod nothing: F = 600.
    # GPU0 -> [800, 700, 500]: no whole GPU left, F = 0.5 * 2000 = 1000, delta -400 -> int(100 sig(-0.4)) = 40
    # GPU1 -> [1000, 500, 500]: F = 0.5 * 1000 = 500, delta +100 -> 52
    # GPU2 -> [1000, 700, 300]: F = 0.5 * 1000 + 0.5 * 300 = 650, delta -50 -> 48
    # Node b: F 0 -> 0.5 * 800 = 400, delta -400 -> 40; its missing GPU slots are -1.
    assert policy.gpu_scores(book, request_, np.array([0, 1])).tolist() == [[40, 52, 48], [40, -1, -1]]
    assert policy.score(book, request_, np.array([0, 1])).tolist() == [52, 40]
    assert policy.choose_gpus(book, request_, 0, np.random.default_rng()) == (1,)
    assert Placer(book, policy).place(request_) == Placement(0, (1,))
    # Best fit inside the node would have taken GPU2 (500 free) instead.
    assert best_fit_gpu(book, request_, 0) == (2,)
    # A whole GPU on a takes GPU0: [0, 700, 500], F = 0.5 * 1200 + 0 = 600, delta 0 -> 50.
    # On b: F 0 -> 0, delta 0 -> 50.  Equal scores: the name order picks a.
    assert policy.score(book, whole(), np.array([0, 1])).tolist() == [50, 50]
    assert Placer(book, policy).place(whole()) == Placement(0, (0,))
    assert Placer(book, policy, tie_rank=np.array([1, 0])).place(whole()) == Placement(1, (0,))


def test_fgd_cpu_only_requests_strand_gpus_on_cpu_poor_nodes() -> None:
    # The typical pod needs 4 vCPU with half a GPU. A CPU pod without a CPU request counts as 100m.
    policy = FragmentationGradientDescent(typical((4000, 500, 1, 1.0)))
    book = AllocationBook(
        [
            make_node("big", cpu_milli=10000, memory_mib=1000, gpu_count=1, gpu_model="T4"),
            make_node("small", cpu_milli=4050, memory_mib=1000, gpu_count=1, gpu_model="T4"),
        ]
    )
    # small: 3950m left < 4000m, the whole idle GPU becomes a fragment: delta -1000 -> int(26.89)
    assert policy.score(book, Request("c"), np.arange(2)).tolist() == [50, 26]
    # Even when small ranks first, big wins on score.
    assert Placer(book, policy, tie_rank=np.array([1, 0])).place(Request("c")) == Placement(0, ())


def test_fgd_model_restricted_typical_pods() -> None:
    # The only typical pod wants a V100: every idle T4 milli is a fragment for it, before and after.
    policy = FragmentationGradientDescent([TypicalPod(PodShape(0, 500, 1, "V100M16|V100M32"), 1.0)])
    book = AllocationBook([make_node("t", cpu_milli=1000, memory_mib=1000, gpu_count=2, gpu_model="T4")])
    # F 2000 -> 1500: delta +500 -> int(100 sig(0.5)) = 62
    assert policy.score(book, share(milli=500), np.array([0])).tolist() == [62]


def test_sigmoid_score_values() -> None:
    deltas = np.array([0.0, 100.0, -400.0, -1000.0, 1000.0, 1e5, -2e4])
    assert sigmoid_score(deltas).tolist() == [50, 52, 40, 26, 73, 100, 0]
    assert truncate(np.array([-0.9, 0.9, 57.49999, -57.9])).tolist() == [0, 0, 57, -57]


def test_fgd_set_typical_bumps_cache_epoch() -> None:
    book = fgd_node_book()
    policy = FragmentationGradientDescent(typical((0, 1000, 1, 1.0)))
    placer = Placer(book, policy)
    first = placer.scores(share(milli=200), np.array([0, 1])).tolist()
    epoch = policy.cache_epoch
    policy.set_typical(typical((0, 500, 1, 1.0)), book)
    assert policy.cache_epoch == epoch + 1
    second = placer.scores(share(milli=200), np.array([0, 1])).tolist()
    fresh = FragmentationGradientDescent(typical((0, 500, 1, 1.0)))
    fresh.attach(book)
    assert second == fresh.score(book, share(milli=200), np.array([0, 1])).tolist()
    assert first != second


# ------------------------------------------------------------------------------------------ random


def test_random_picks_feasible_nodes_reproducibly() -> None:
    book = AllocationBook(
        [make_node(f"n{i}", cpu_milli=1000 * (i + 1), memory_mib=1000, gpu_count=2, gpu_model="T4") for i in range(5)]
    )
    request_ = share(milli=100, cpu=2500)  # n0, n1 lack the CPU
    runs = []
    for _ in range(2):
        placer = Placer(book, RandomFit(), rng=np.random.default_rng(42))
        runs.append([placer.place(request_) for _ in range(50)])
    assert runs[0] == runs[1]
    nodes = {p.node for p in runs[0] if p is not None}
    gpus = {p.gpus for p in runs[0] if p is not None}
    assert nodes == {2, 3, 4}
    assert gpus == {(0,), (1,)}
    other = Placer(book, RandomFit(), rng=np.random.default_rng(43))
    assert [other.place(request_) for _ in range(50)] != runs[0]
    assert RandomFit().score(book, request_, np.arange(5)).tolist() == [0] * 5


# ------------------------------------------------------------------------------------- tie-breaking


def chosen_node(placer: Placer, request_: Request) -> int:
    placement = placer.place(request_)
    assert placement is not None
    return placement.node


def identical_nodes(names: list[str]) -> AllocationBook:
    return AllocationBook([make_node(n, cpu_milli=8000, memory_mib=8000, gpu_count=4, gpu_model="T4") for n in names])


@pytest.mark.parametrize("name", [p for p in ALL_POLICIES if p != "random"])
@pytest.mark.parametrize(
    "request_", [share(milli=300), whole(count=2), Request("c", cpu_milli=500)], ids=["share", "whole", "cpu"]
)
def test_equal_scores_go_to_the_smallest_rank(name: str, request_: Request) -> None:
    book = identical_nodes(["c", "a", "d", "b"])
    context = PolicyContext(typical((0, 500, 1, 0.6), (0, 1000, 2, 0.4)))
    # Default rank: node-name order, so "a" (index 1).
    assert chosen_node(Placer(book, make_policy(name, context)), request_) == 1
    for rank, winner in (([3, 2, 1, 0], 3), ([0, 1, 2, 3], 0), ([2, 3, 0, 1], 2)):
        placer = Placer(book, make_policy(name, context), tie_rank=np.array(rank))
        assert chosen_node(placer, request_) == winner


def test_tie_rank_only_breaks_ties() -> None:
    book = identical_nodes(["a", "b", "c"])
    book.allocate(share("x", milli=500), 2, [0])
    # Binpack prefers the used node c whatever the rank.
    assert Placer(book, Binpack(), tie_rank=np.array([0, 1, 2])).place(share(milli=100)) == Placement(2, (0,))
    # Spread prefers a or b; the rank decides between them.
    assert Placer(book, Spread(), tie_rank=np.array([2, 1, 0])).place(share(milli=100)) == Placement(1, (0,))


def test_tie_rank_must_cover_every_node() -> None:
    with pytest.raises(ValueError, match="one entry per node"):
        Placer(identical_nodes(["a", "b"]), Binpack(), tie_rank=np.array([0]))


def test_bestfit_normalisation_merges_nearby_raw_scores() -> None:
    # Range 192 > 100: raw 96 and 97 both map to 98 ((189 * 100) // 192, (190 * 100) // 192).
    assert normalize_scores(np.array([-93, 96, 97, 99])).tolist() == [0, 98, 98, 100]
    assert normalize_scores(np.array([5, 5, 5])).tolist() == [0, 0, 0]
    assert normalize_scores(np.array([10, 20])).tolist() == [0, 100]


def test_bestfit_normalised_tie_is_broken_by_rank() -> None:
    # big: 16 GPUs and 256 vCPU make the raw score negative and stretch the range past 100.
    book = AllocationBook(
        [
            make_node("big", cpu_milli=256000, memory_mib=1000, gpu_count=16, gpu_model="T4"),
            make_node("p", cpu_milli=4000, memory_mib=1000, gpu_count=2, gpu_model="T4"),
            make_node("q", cpu_milli=4000, memory_mib=1000, gpu_count=2, gpu_model="T4"),
            make_node("top", cpu_milli=1000, memory_mib=1000, gpu_count=1, gpu_model="T4"),
        ]
    )
    book.allocate(share("on-p", milli=400), 1, [0])  # free 1600: gpu_left (1600 - 1000) / 8000
    book.allocate(share("on-q", milli=500), 2, [0])  # free 1500
    request_ = whole(count=1, cpu=1000)
    raw = BestFit().score(book, request_, np.arange(4)).tolist()
    # big: 100 (1 - 0.5 * 255000/128000 - 0.5 * 15000/8000) = -93.4; p: 100 (1 - 0.5 * 3000/128000 - 0.5 * 0.075)
    # = 95.08; q: 100 (1 - 0.01171875 - 0.03125) = 95.70; top: 100.
    assert raw == [-93, 95, 95, 100]
    # top wins outright; without it, p and q tie (equal truncated raw scores) and the rank decides.
    nodes = np.array([0, 1, 2])
    placer = Placer(book, BestFit(), tie_rank=np.array([0, 2, 1, 3]))
    assert placer.select(request_, nodes) == 2
    placer = Placer(book, BestFit())
    assert placer.select(request_, nodes) == 1
    assert placer.place(request_) == Placement(3, (0,))


# ------------------------------------------------------------------------------------------ registry


def test_registry_lists_every_policy() -> None:
    assert policy_names() == ALL_POLICIES
    assert FGD_BASELINES == ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
    summaries = policy_summaries()
    assert set(summaries) == set(ALL_POLICIES)
    assert all(summaries.values())
    for name in ALL_POLICIES:
        policy = make_policy(name)
        assert isinstance(policy, Policy)
        assert policy.name == name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FGD", "fgd"),
        ("BestFit", "bestfit"),
        ("best-fit", "bestfit"),
        ("best_fit", "bestfit"),
        (" Spread ", "spread"),
        ("GPU-Packing", "gpupacking"),
        ("DotProd", "dotprod"),
        ("RANDOM", "random"),
    ],
)
def test_policy_names_are_case_insensitive(text: str, expected: str) -> None:
    assert canonical_policy_name(text) == expected
    assert make_policy(text).name == expected


@pytest.mark.parametrize("text", ["tetris", "fgd2", "", "best fit"])
def test_unknown_policy_lists_accepted_names(text: str) -> None:
    with pytest.raises(UnknownPolicyError) as caught:
        make_policy(text)
    error = caught.value
    assert isinstance(error, InvalidInputError)
    assert error.field == "policy"
    assert repr(text) in str(error)
    for name in ALL_POLICIES:
        assert name in (error.accepted or "")


def test_make_policy_passes_typical_pods_to_fgd() -> None:
    pods = typical((0, 500, 1, 1.0))
    policy = make_policy("fgd", PolicyContext(pods))
    assert isinstance(policy, FragmentationGradientDescent)
    assert policy.typical == tuple(pods)
    empty = make_policy("fgd")
    assert isinstance(empty, FragmentationGradientDescent)
    assert empty.typical == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FGD,bestfit", ["fgd", "bestfit"]),
        (" fgd , , Best-Fit ,FGD,fgd", ["fgd", "bestfit"]),
        ("random", ["random"]),
        (",".join(ALL_POLICIES).upper(), ALL_POLICIES),
    ],
)
def test_parse_policy_list(text: str, expected: list[str]) -> None:
    assert parse_policy_list(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"), [("", "no policy given"), (" , ,", "no policy given"), ("fgd,nope", "'nope'")]
)
def test_parse_policy_list_errors(text: str, fragment: str) -> None:
    with pytest.raises(UnknownPolicyError, match=fragment) as caught:
        parse_policy_list(text)
    assert "fgd" in (caught.value.accepted or "")
