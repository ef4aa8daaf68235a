"""The packing experiment's arrival sequence: seeded shuffle, inflation to the target, deflation."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kubecell.core.model import MILLI_PER_GPU
from kubecell.sim.packing.workload import arrival_sequence
from kubecell.sim.traces.openb import TracePod

TUNED = re.compile(r"^(?P<base>.+)-tuned-(?P<index>\d+)$")


def pod(name: str, count: int = 1, milli: int = 1000, cpu: int = 4000) -> TracePod:
    return TracePod(name=name, cpu_milli=cpu, memory_mib=1024, gpu_count=count, gpu_milli=milli if count else 0)


def mixed_pods(n: int = 60) -> list[TracePod]:
    shares = (1000, 810, 470, 320, 250)
    pods = [pod(f"p{i:03d}", 1, shares[i % len(shares)]) for i in range(n)]
    pods += [pod("cpu-a", 0), pod("cpu-b", 0)]
    return pods


def total(sequence: list[TracePod]) -> int:
    return sum(p.total_gpu_milli for p in sequence)


def run(pods: list[TracePod], capacity: int, inflate: float, seed: int) -> list[TracePod]:
    return arrival_sequence(pods, capacity, inflate, np.random.default_rng(seed))


def assert_inflated(pods: list[TracePod], sequence: list[TracePod]) -> None:
    """Originals once each, first and in a shuffled order; then copies named <name>-tuned-0, -1, ..."""
    originals = {p.name: p for p in pods}
    head = sequence[: len(pods)]
    assert Counter(p.name for p in head) == Counter(p.name for p in pods)
    assert all(p == originals[p.name] for p in head)
    for i, copy in enumerate(sequence[len(pods) :]):
        match = TUNED.match(copy.name)
        assert match is not None, copy.name
        assert int(match["index"]) == i
        source = originals[match["base"]]
        assert (copy.cpu_milli, copy.memory_mib, copy.gpu_count, copy.gpu_milli, copy.gpu_spec) == (
            source.cpu_milli, source.memory_mib, source.gpu_count, source.gpu_milli, source.gpu_spec)
    assert len({p.name for p in sequence}) == len(sequence)


def test_same_seed_same_order_and_input_order_does_not_matter() -> None:
    pods = mixed_pods()
    first = [p.name for p in run(pods, 40_000, 1.3, seed=42)]
    again = [p.name for p in run(pods, 40_000, 1.3, seed=42)]
    reversed_input = [p.name for p in run(list(reversed(pods)), 40_000, 1.3, seed=42)]
    assert first == again == reversed_input


def test_different_seeds_give_different_orders() -> None:
    pods = mixed_pods()
    orders = {tuple(p.name for p in run(pods, 40_000, 1.3, seed=seed)[: len(pods)]) for seed in range(42, 47)}
    assert len(orders) == 5
    shuffled = [p.name for p in run(pods, 40_000, 1.3, seed=42)[: len(pods)]]
    assert shuffled != sorted(shuffled)


def test_inflation_reaches_the_target_without_exceeding_it_for_single_gpu_pods() -> None:
    pods = mixed_pods()  # 60 GPU pods asking for 34.1 GPUs in all
    capacity = 40_000
    target = 1.3 * capacity
    for seed in range(10):
        sequence = run(pods, capacity, 1.3, seed)
        assert len(sequence) > len(pods)
        assert_inflated(pods, sequence)
        requested = total(sequence)
        assert requested <= target
        assert requested > target - MILLI_PER_GPU  # stopped only when the next draw could overshoot


def test_multi_gpu_copies_overshoot_by_at_most_the_documented_quirk() -> None:
    # One 8-GPU pod on a 10-GPU cluster: the stop test adds the drawn pod's per-GPU share (1000), so the
    # first copy (8000 -> 16000) is admitted although it passes the 13000 target; the next draw stops.
    pods = [pod("big", 8)]
    for seed in range(5):
        sequence = run(pods, 10_000, 1.3, seed)
        assert [p.name for p in sequence] == ["big", "big-tuned-0"]
        assert total(sequence) == 16_000


def test_overshoot_is_bounded_on_a_mixed_multi_gpu_list() -> None:
    pods = [*mixed_pods(20), pod("m2", 2), pod("m4", 4), pod("m8", 8)]
    capacity, inflate = 30_000, 1.3
    target = inflate * capacity
    largest = max(p.gpu_count for p in pods)
    overshoot_seen = False
    for seed in range(30):
        sequence = run(pods, capacity, inflate, seed)
        assert_inflated(pods, sequence)
        requested = total(sequence)
        # The last admitted copy passed "before + per-GPU share <= target" and then added count x share.
        assert requested <= target + (largest - 1) * MILLI_PER_GPU
        assert requested > target - MILLI_PER_GPU
        overshoot_seen |= requested > target
    assert overshoot_seen


def test_deflation_removes_random_pods_until_at_or_below_the_target() -> None:
    pods = mixed_pods()
    capacity, inflate = 20_000, 1.0  # the list asks for 34.1 GPUs, the target is 20
    shuffled = [p.name for p in run(pods, capacity, 0, seed=7)]
    sequence = run(pods, capacity, inflate, seed=7)
    names = [p.name for p in sequence]
    assert not any(TUNED.match(name) for name in names)
    assert len(set(names)) == len(names)
    assert total(sequence) <= capacity * inflate
    assert total(sequence) > capacity * inflate - MILLI_PER_GPU  # stops at the first removal that suffices
    position = {name: i for i, name in enumerate(shuffled)}
    assert [position[name] for name in names] == sorted(position[name] for name in names)  # order is kept


def test_list_exactly_at_the_target_is_unchanged() -> None:
    pods = [pod(f"p{i}", 1) for i in range(13)]
    sequence = run(pods, 10_000, 1.3, seed=3)
    assert sorted(p.name for p in sequence) == sorted(p.name for p in pods)


def test_inflate_zero_keeps_the_list() -> None:
    pods = mixed_pods()
    sequence = run(pods, 1_000, 0, seed=42)
    assert Counter(p.name for p in sequence) == Counter(p.name for p in pods)
    assert [p.name for p in sequence] == [p.name for p in run(pods, 1_000_000, 0, seed=42)]


def test_cpu_only_list_terminates_and_keeps_every_pod() -> None:
    pods = [pod(f"cpu-{i}", 0) for i in range(25)]
    sequence = run(pods, 10_000, 1.3, seed=42)
    assert Counter(p.name for p in sequence) == Counter(p.name for p in pods)


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.sampled_from([0, 1, 1, 1, 2, 4, 8]), st.integers(1, 1000)), min_size=1, max_size=30),
    capacity_gpus=st.integers(1, 64),
    inflate=st.floats(0.05, 3.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_arrival_sequence_properties(
    shapes: list[tuple[int, int]], capacity_gpus: int, inflate: float, seed: int
) -> None:
    pods = [pod(f"p{i}", count, 1000 if count > 1 else milli) for i, (count, milli) in enumerate(shapes)]
    capacity = capacity_gpus * MILLI_PER_GPU
    target = inflate * capacity
    sequence = run(pods, capacity, inflate, seed)
    assert len({p.name for p in sequence}) == len(sequence)
    if not any(p.gpu_count for p in pods):
        assert len(sequence) == len(pods)
    elif total(pods) < target:
        assert_inflated(pods, sequence)
        largest = max(p.gpu_count for p in pods)
        assert total(sequence) <= target + (largest - 1) * MILLI_PER_GPU
        assert total(sequence) > target - MILLI_PER_GPU
    else:
        names = {p.name for p in pods}
        assert all(p.name in names for p in sequence)
        assert total(sequence) <= target
