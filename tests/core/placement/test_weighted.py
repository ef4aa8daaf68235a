"""Weighted mixes of placement policies: a mix of one policy decides as that policy; weights move decisions
between two opposite scores; a share's GPU follows the weighted GPU scores; bad weights and names are
refused with what would have been accepted."""

from __future__ import annotations

import numpy as np
import pytest

from kubecell.core.errors import InvalidInputError, UnknownPolicyError
from kubecell.core.model import Request
from kubecell.core.placement.placer import Placement, Placer
from kubecell.core.placement.policies.baselines import RandomFit
from kubecell.core.placement.policies.utilization import Binpack, Spread
from kubecell.core.placement.registry import canonical_policy_name, make_policy
from kubecell.core.placement.weighted import WeightedPolicy
from tests.core.placement.test_placer import SHAPES, TYPICAL, build_cluster
from tests.core.placement.test_policies import SCENARIO_REQUEST, scenario, share

SCORING = ["fgd", "dotprod", "gpuclustering", "gpupacking", "bestfit", "binpack", "spread", "kubecell"]


def run(policy_name: str, seed: int) -> list[Placement | None]:
    """A stream of mixed requests placed and committed on a small heterogeneous cluster."""
    book = build_cluster([(32000, 8, "A100"), (16000, 4, "T4"), (64000, 2, "T4"), (8000, 0, "")])
    placer = Placer(book, make_policy(policy_name, TYPICAL))
    rng = np.random.default_rng(seed)
    placed: list[Placement | None] = []
    for i in range(40):
        fields = SHAPES[int(rng.integers(len(SHAPES)))]
        placement = placer.place_and_commit(Request(f"r{i}", **fields))
        placed.append(placement)
    return placed


@pytest.mark.parametrize("name", SCORING)
def test_a_mix_of_one_policy_decides_as_that_policy(name: str) -> None:
    for seed in range(3):
        assert run(f"{name}:3", seed) == run(name, seed)


def test_weights_move_the_choice_between_opposite_scores() -> None:
    # binpack scores idle8/half/whole 3/45/57 and goes to "whole"; spread scores 96/55/42 and goes to "idle8".
    book = scenario()
    nodes = np.arange(book.size)
    mostly_binpack = WeightedPolicy([(Binpack(), 3), (Spread(), 1)])
    mostly_spread = WeightedPolicy([(Binpack(), 1), (Spread(), 3)])
    # (3 * [3, 45, 57] + [96, 55, 42]) / 4 = [26.25, 47.5, 53.25]; the other way [72.75, 52.5, 45.75]
    assert mostly_binpack.score(book, SCENARIO_REQUEST, nodes).tolist() == [26, 47, 53]
    assert mostly_spread.score(book, SCENARIO_REQUEST, nodes).tolist() == [72, 52, 45]
    assert Placer(scenario(), mostly_binpack).place(SCENARIO_REQUEST) == Placement(2, (2,))
    assert Placer(scenario(), mostly_spread).place(SCENARIO_REQUEST) == Placement(0, (0,))


def test_a_normalising_part_is_normalised_before_it_is_weighed() -> None:
    book = scenario()
    # bestfit raw 27/87/77 normalises to 0/100/83; with spread (96/55/42) at equal weights: 48/77.5/62.5.
    mix = make_policy("bestfit+spread")
    assert not mix.node_local, "a normalised score depends on the other candidates"
    assert mix.score(book, SCENARIO_REQUEST, np.arange(book.size)).tolist() == [48, 77, 62]


def test_a_share_goes_to_the_gpu_of_the_best_weighted_gpu_score() -> None:
    # kubecell (expected waste) and FGD both score GPUs: the mix takes the GPU with the best weighted sum, and a
    # GPU any part refuses (too little free) is never taken.
    book = scenario()
    mix = make_policy("kubecell:1+fgd:2", TYPICAL)
    assert isinstance(mix, WeightedPolicy)
    assert mix.gpu_scored
    node = np.array([0], np.int64)  # idle8: eight equal idle GPUs but for what is placed below
    book.allocate(share("a", milli=700), 0, [3])
    book.allocate(share("b", milli=200), 0, [5])
    for milli in (100, 300, 800):
        request = share(f"r{milli}", milli=milli)
        parts = [(policy.gpu_scores(book, request, node)[0], weight)  # type: ignore[attr-defined]
                 for policy, weight in mix.parts]
        refused = np.any([scores < 0 for scores, _ in parts], axis=0)
        summed = np.where(refused, -1.0, sum(weight * scores for scores, weight in parts))
        (gpu,) = mix.choose_gpus(book, request, 0, np.random.default_rng(0))
        assert summed[gpu] == summed.max()
        assert not refused[gpu]
    (gpu,) = mix.choose_gpus(book, share("big", milli=500), 1, np.random.default_rng(0))
    assert gpu == 1, "'half' has 400 free on GPU 0: refused by both parts"


@pytest.mark.parametrize(("name", "message"), [
    ("kubecell:0+spread", "weight '0' of 'kubecell'"),
    ("kubecell:-1", "weight '-1'"),
    ("kubecell:inf+spread", "weight 'inf'"),
    ("kubecell:nan+spread", "weight 'nan'"),
    ("kubecell:x+spread", "weight 'x' of 'kubecell' is not a number"),
    ("kubecell+KubeCell:2", "'kubecell' appears twice"),
    ("nosuch:1+spread", "unknown placement policy 'nosuch'"),
    ("random+spread", "picks a node at random"),
    ("kubecell:1:2", "NAME or NAME:WEIGHT"),
])
def test_bad_mixes_are_refused_with_what_is_accepted(name: str, message: str) -> None:
    with pytest.raises(UnknownPolicyError, match="accepted") as raised:
        canonical_policy_name(name, field="--placement")
    assert message in str(raised.value)
    assert "--placement" in str(raised.value)


def test_the_canonical_form_spells_every_weight_and_builds_the_same_mix() -> None:
    assert canonical_policy_name(" KubeCell : 2 + Spread ") == "kubecell:2+spread:1"
    mix = make_policy("kubecell:2+spread")
    assert mix.name == "kubecell:2+spread:1"
    assert canonical_policy_name(mix.name) == mix.name


def test_the_policy_object_refuses_what_the_registry_refuses() -> None:
    with pytest.raises(InvalidInputError, match="at least one part"):
        WeightedPolicy([])
    with pytest.raises(InvalidInputError, match="at random"):
        WeightedPolicy([(RandomFit(), 1.0)])
    with pytest.raises(InvalidInputError, match="finite number above 0"):
        WeightedPolicy([(Spread(), float("nan"))])
