"""One packing run and the experiment grid, on the bundled example cluster and workload."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError
from kubecell.core.placement.filters import feasible_mask
from kubecell.core.placement.frag import FragmentationMeasure
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.registry import PolicyContext, make_policy, policy_names
from kubecell.sim.packing.experiment import RunRecord, run_packing
from kubecell.sim.packing.metrics import PolicySummary
from kubecell.sim.packing.runner import PackingInputs, load_inputs, parse_seeds, run_grid
from kubecell.sim.packing.workload import arrival_sequence
from tests.sim.support import NODE_HEADER, POD_HEADER

Writer = Callable[[str, str], Path]
ALL_POLICIES = policy_names()


def run(inputs: PackingInputs, policy: str, seed: int) -> RunRecord:
    return run_packing(inputs.nodes, inputs.pods, policy, seed, typical=inputs.typical)


def assert_same_record(a: RunRecord, b: RunRecord) -> None:
    np.testing.assert_array_equal(a.arrived, b.arrived)
    np.testing.assert_array_equal(a.allocated, b.allocated)
    np.testing.assert_array_equal(a.fragment, b.fragment)
    np.testing.assert_array_equal(a.idle, b.idle)
    assert (a.placed, a.failed, a.cluster_gpu_milli) == (b.placed, b.failed, b.cluster_gpu_milli)


@pytest.mark.parametrize("policy", ["random", "fgd", "bestfit"])
def test_run_is_deterministic_per_seed(example_inputs: PackingInputs, policy: str) -> None:
    first = run(example_inputs, policy, 42)
    assert_same_record(first, run(example_inputs, policy, 42))
    other = run(example_inputs, policy, 43)
    assert not np.array_equal(first.allocated, other.allocated)


def test_typical_pods_default_to_those_of_the_pod_list(example_inputs: PackingInputs) -> None:
    implicit = run_packing(example_inputs.nodes, example_inputs.pods, "fgd", 44)
    assert_same_record(implicit, run(example_inputs, "fgd", 44))


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_run_series_are_consistent(example_inputs: PackingInputs, policy: str) -> None:
    seed = 42
    result = run(example_inputs, policy, seed)
    capacity = AllocationBook(example_inputs.nodes).total_gpu_milli
    sequence = arrival_sequence(example_inputs.pods, capacity, 1.3, np.random.default_rng(seed))

    assert result.policy == policy
    assert result.seed == seed
    assert result.cluster_gpu_milli == capacity == 286_000
    assert result.decisions == result.placed + result.failed == len(sequence) == len(result.arrived)
    assert result.placed > 0
    assert result.failed > 0  # 130 % of capacity cannot all fit
    for series in (result.allocated, result.fragment, result.idle):
        assert len(series) == len(result.arrived)

    # arrived counts every submitted pod's request, placed or not
    np.testing.assert_array_equal(result.arrived, np.cumsum([p.total_gpu_milli for p in sequence]))
    assert np.all(np.diff(result.arrived) >= 0)
    assert result.arrived[-1] >= 1.3 * capacity - 1000
    assert np.all(np.diff(result.allocated) >= 0)  # nothing ever leaves
    assert np.all(result.allocated <= result.arrived)
    assert np.all(result.allocated <= capacity)
    np.testing.assert_array_equal(result.idle, capacity - result.allocated)
    assert np.all(result.fragment >= -1e-6)
    assert np.all(result.fragment <= result.idle + 1e-6)
    # the allocation grows exactly by the request of each placed pod; failed pods add nothing
    steps = np.diff(np.concatenate([[0], result.allocated]))
    requests = np.array([p.total_gpu_milli for p in sequence])
    assert np.all((steps == 0) | (steps == requests))


@pytest.mark.parametrize("policy", ["fgd", "random", "gpupacking"])
def test_run_matches_a_replay_with_the_allocation_book(example_inputs: PackingInputs, policy: str) -> None:
    """Replay the documented protocol step by step and audit the book along the way."""
    seed = 45
    result = run(example_inputs, policy, seed)

    rng = np.random.default_rng(seed)
    book = AllocationBook(example_inputs.nodes)
    sequence = arrival_sequence(example_inputs.pods, book.total_gpu_milli, 1.3, rng)
    tie_rank = rng.permutation(book.size).astype(np.int64)
    placer = Placer(book, make_policy(policy, PolicyContext(example_inputs.typical)), rng=rng, tie_rank=tie_rank)
    measure = FragmentationMeasure(example_inputs.typical, book.model_names)

    allocated, fragment, failed = [], [], 0
    for i, pod in enumerate(sequence):
        request = pod.request()
        placement = placer.place(request)
        if placement is None:
            failed += 1
            assert not feasible_mask(book, request).any(), f"{pod.name} failed although a node could hold it"
        else:
            book.allocate(request, placement.node, placement.gpus)  # raises if the placement does not fit
        allocated.append(book.allocated_gpu_milli)
        fragment.append(float(measure.node_fragmentation(book.cpu_free, book.gpu_avail, book.model_id).sum()))
        if i % 50 == 0:
            book.check_invariants()
    book.check_invariants()

    assert (result.placed, result.failed) == (len(book.allocations), failed)
    np.testing.assert_array_equal(result.allocated, allocated)
    np.testing.assert_allclose(result.fragment, fragment, rtol=1e-9, atol=1e-6)
    assert result.fragment[-1] == pytest.approx(fragment[-1], abs=1e-9)


def strip_timing(summaries: list[PolicySummary]) -> list[dict[str, object]]:
    out = []
    for summary in summaries:
        data = summary.as_dict()
        del data["seconds"], data["decisions_per_second"]
        out.append(data)
    return out


def test_run_grid_in_parallel_gives_the_same_numbers(example_files: tuple[Path, Path]) -> None:
    nodes, pods = example_files
    policies, seeds = ["fgd", "random"], [42, 43, 44]
    seen: list[tuple[str, int]] = []
    serial = run_grid(nodes, pods, policies, seeds, jobs=1, on_done=lambda c: seen.append((c.policy, c.seed)))
    parallel = run_grid(nodes, pods, policies, seeds, jobs=2)

    assert sorted(seen) == sorted((p, s) for p in policies for s in seeds)
    assert [s.policy for s in serial] == [s.policy for s in parallel] == policies
    assert strip_timing(serial) == strip_timing(parallel)
    for a, b in zip(serial, parallel, strict=True):
        assert [r.seed for r in a.runs] == [r.seed for r in b.runs] == seeds
        for x, y in zip(a.runs, b.runs, strict=True):
            for metric in ("allocated_pct", "frag_amount_pct", "frag_ratio_pct"):
                np.testing.assert_array_equal(getattr(x, metric), getattr(y, metric))
            assert (x.placed, x.failed) == (y.placed, y.failed)


def test_run_grid_agrees_with_single_runs(example_files: tuple[Path, Path], example_inputs: PackingInputs) -> None:
    nodes, pods = example_files
    (summary,) = run_grid(nodes, pods, ["bestfit"], [46])
    (curves,) = summary.runs
    record = run(example_inputs, "bestfit", 46)
    assert (curves.placed, curves.failed) == (record.placed, record.failed)
    allocated_at_130 = record.allocated[np.round(record.arrived / record.cluster_gpu_milli * 100) == 130]
    assert curves.allocated_pct[130] == pytest.approx(allocated_at_130.mean() / record.cluster_gpu_milli * 100)


# ---------------------------------------------------------------------------------------------- bad inputs

SMALL_NODES = f"{NODE_HEADER}\nt4-a,32000,131072,2,T4\nt4-b,16000,65536,4,T4\n"


@pytest.mark.parametrize(
    ("bad_pod", "field", "reason"),
    [
        ("huge,4000,8192,8,1000,", "num_gpu", "8 GPUs"),
        ("pinned,4000,8192,1,500,A100", "gpu_spec", "A100"),
        ("hungry,64000,8192,1,500,", "cpu_milli", "64000m CPU"),
        ("greedy,4000,999999,0,0,", "memory_mib", "999999 MiB"),
    ],
)
def test_pod_that_can_never_fit_is_rejected_up_front(write_csv: Writer, bad_pod: str, field: str, reason: str) -> None:
    nodes = write_csv("nodes.csv", SMALL_NODES)
    pods = write_csv("pods.csv", f"{POD_HEADER}\nok-1,4000,8192,1,500,\n{bad_pod}\nok-2,4000,8192,2,1000,T4\n")
    name = bad_pod.split(",")[0]
    for attempt in (lambda: load_inputs(str(nodes), str(pods)), lambda: run_grid(nodes, pods, ["fgd"], [42], jobs=2)):
        with pytest.raises(InvalidInputError) as info:
            attempt()
        text = str(info.value)
        assert f"pod {name!r}" in text
        assert reason in text
        assert info.value.location == f"{pods}:3"
        assert info.value.field == field
        assert "--allow-impossible" in (info.value.accepted or "")


def test_impossible_pods_are_replayed_as_failures_when_allowed(write_csv: Writer) -> None:
    nodes = write_csv("nodes.csv", SMALL_NODES)
    ok = "".join(f"ok-{i},2000,4096,1,{250 * (1 + i % 4)},\n" for i in range(12))
    pods = write_csv("pods.csv", f"{POD_HEADER}\n{ok}huge,4000,8192,8,1000,\npinned,4000,8192,1,500,A100\n")
    inputs = load_inputs(str(nodes), str(pods), allow_impossible=True)
    assert sorted(pod.name for pod, _ in inputs.impossible) == ["huge", "pinned"]
    assert len(inputs.pods) == 14

    record = run_packing(inputs.nodes, inputs.pods, "fgd", 42, inflate=0, typical=inputs.typical)
    assert record.decisions == 14
    assert record.failed >= 2
    assert record.arrived[-1] == sum(pod.total_gpu_milli for pod in inputs.pods)
    (summary,) = run_grid(nodes, pods, ["fgd"], [42], inflate=0, allow_impossible=True)
    assert summary.runs[0].failed == record.failed


def test_negative_inflate_is_rejected(example_files: tuple[Path, Path]) -> None:
    nodes, pods = example_files
    with pytest.raises(InvalidInputError, match="inflate"):
        run_grid(nodes, pods, ["fgd"], [42], inflate=-0.5)


def test_unknown_policy_is_rejected(example_files: tuple[Path, Path]) -> None:
    nodes, pods = example_files
    with pytest.raises(InvalidInputError, match="nosuch") as info:
        run_grid(nodes, pods, ["nosuch"], [42])
    assert "fgd" in (info.value.accepted or "")


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("42-45", [42, 43, 44, 45]), ("7", [7]), ("3, 1,3 ,2", [3, 1, 2]), ("1-3,2-4", [1, 2, 3, 4]), ("5-5", [5])],
)
def test_parse_seeds(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "x", "42-", "-1", "9-3", "1,,2", "1.5", "42..51", "9" * 5000, "1-" + "9" * 19])
def test_parse_seeds_rejects_malformed_text(text: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_seeds(text)
    assert info.value.field == "seeds"
    assert "42-51" in (info.value.accepted or "")
    assert len(str(info.value)) < 1_000, "a 5,000-digit seed was a ValueError traceback, then echoed whole"
