"""FGD against a deliberately plain reference implementation of its definitions.

The vectorized policy derives the after-placement state from summary arrays; the reference below loops
over typical pods and GPUs in plain Python, straight from the definitions (see the docstrings of
``kubecell.core.placement.frag`` and ``...policies.fgd``). Shares are multiples of 1/64 so that every
weighted sum is exact in floating point and the comparison can be exact whatever the summation order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.book import AllocationBook
from kubecell.core.errors import AllocationError, InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request, make_node
from kubecell.core.placement.filters import feasible_mask
from kubecell.core.placement.frag import FragmentationMeasure, PodShape, TypicalPod, typical_pods
from kubecell.core.placement.policies.fgd import FragmentationGradientDescent

# ------------------------------------------------------------------------------------ the reference


@dataclass
class RefNode:
    """A node as the reference sees it: free CPU, usable free milli per GPU (0 when unhealthy), model,
    and per GPU whether it could take a share of given milli/memory or is completely free."""

    cpu_free: int
    gpu_free: list[int]
    model: str
    gpu_mem_free: list[int]
    gpu_mem_enforced: list[bool]
    gpu_fully_free: list[bool]


def ref_fragment(cpu_free: int, gpu_free: Sequence[int], model: str, pod: PodShape) -> int:
    total = sum(gpu_free)
    if pod.gpu_count == 0:
        return total
    allowed = pod.gpu_models
    if allowed is not None and model not in allowed:
        return total
    if cpu_free < pod.cpu_milli:
        return total
    if sum(1 for free in gpu_free if free >= pod.gpu_milli) < pod.gpu_count:
        return total
    return sum(free for free in gpu_free if free < pod.gpu_milli)


def ref_node_fragmentation(cpu_free: int, gpu_free: Sequence[int], model: str, typical: Sequence[TypicalPod]) -> float:
    return sum(t.share * ref_fragment(cpu_free, gpu_free, model, t.shape) for t in typical)


def ref_score(before: float, after: float) -> int:
    return int(100 * (1 / (1 + math.exp(-(before - after) / 1000))))


def ref_cpu(request: Request) -> int:
    return request.cpu_milli if request.cpu_milli else 100  # kube-scheduler's non-zero CPU default


def ref_gpu_scores(node: RefNode, request: Request, typical: Sequence[TypicalPod]) -> list[int]:
    """For a share: the FGD score of putting it on each GPU; -1 where the GPU cannot take it."""
    before = ref_node_fragmentation(node.cpu_free, node.gpu_free, node.model, typical)
    scores = []
    for i, free in enumerate(node.gpu_free):
        memory_ok = not node.gpu_mem_enforced[i] or node.gpu_mem_free[i] >= request.gpu_memory_mib
        if free < max(request.gpu_milli, 1) or not memory_ok:
            scores.append(-1)
            continue
        after_free = list(node.gpu_free)
        after_free[i] -= request.gpu_milli
        after = ref_node_fragmentation(node.cpu_free - ref_cpu(request), after_free, node.model, typical)
        scores.append(ref_score(before, after))
    return scores


def ref_decision(node: RefNode, request: Request, typical: Sequence[TypicalPod]) -> tuple[int, tuple[int, ...]]:
    """(score, GPUs) of placing the request on a node where it fits."""
    before = ref_node_fragmentation(node.cpu_free, node.gpu_free, node.model, typical)
    if request.is_share:
        best_score, best_gpu = -1, -1
        for i, score in enumerate(ref_gpu_scores(node, request, typical)):
            if score > best_score:
                best_score, best_gpu = score, i
        return best_score, (best_gpu,)
    after_free = list(node.gpu_free)
    taken: list[int] = []
    if request.is_whole:
        taken = [i for i, full in enumerate(node.gpu_fully_free) if full][: request.gpu_count]
        for i in taken:
            after_free[i] = 0
    after = ref_node_fragmentation(node.cpu_free - ref_cpu(request), after_free, node.model, typical)
    return ref_score(before, after), tuple(taken)


# ------------------------------------------------------------------------------------ generation

MODELS = ["T4", "A100", "G1"]
MODEL_LABELS = ["", "", "T4", "A100|G1", "V100M32", "T4|A100"]


@st.composite
def typical_strategy(draw: Callable[..., Any]) -> list[TypicalPod]:
    count = draw(st.integers(1, 5))
    cuts = sorted(draw(st.sets(st.integers(1, 63), min_size=count - 1, max_size=count - 1)))
    weights = [b - a for a, b in zip([0, *cuts], [*cuts, 64], strict=True)]
    pods = []
    for weight in weights:
        gpu_count = draw(st.sampled_from([0, 1, 1, 1, 2, 4]))
        if gpu_count == 0:
            milli = 0
        elif gpu_count == 1:
            milli = draw(st.sampled_from([50, 100, 250, 300, 500, 700, 1000, draw(st.integers(1, 1000))]))
        else:
            milli = draw(st.sampled_from([1000, 1000, 500]))
        shape = PodShape(
            draw(st.sampled_from([0, 1000, 4000, 8000])), milli, gpu_count, draw(st.sampled_from(MODEL_LABELS))
        )
        pods.append(TypicalPod(shape, weight / 64))
    return pods


@st.composite
def request_strategy(draw: Callable[..., Any]) -> Request:
    cpu = draw(st.sampled_from([0, 0, 500, 2000, 6000]))
    kind = draw(st.sampled_from(["cpu", "share", "share", "share", "whole"]))
    models = draw(st.sampled_from([None, None, None, frozenset({"T4"}), frozenset({"A100", "G1"})]))
    if kind == "cpu":
        return Request("req", cpu_milli=cpu)
    if kind == "whole":
        return Request("req", cpu_milli=cpu, gpu_count=draw(st.integers(1, 4)), gpu_milli=1000, gpu_models=models)
    milli = draw(st.sampled_from([0, 100, 200, 250, 500, 750, 900, draw(st.integers(1, 999))]))
    memory = draw(st.sampled_from([0, 0, 0, 2000, 9000]))
    if milli == 0 and memory == 0:
        memory = 1000
    return Request("req", cpu_milli=cpu, gpu_count=1, gpu_milli=milli, gpu_memory_mib=memory, gpu_models=models)


@st.composite
def cluster_strategy(draw: Callable[..., Any]) -> AllocationBook:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        gpu_count = draw(st.sampled_from([0, 1, 2, 4, 8, draw(st.integers(1, 8))]))
        nodes.append(
            make_node(
                f"n{i}",
                cpu_milli=draw(st.sampled_from([2000, 8000, 32000])),
                memory_mib=1000,
                gpu_count=gpu_count,
                gpu_model=draw(st.sampled_from(MODELS)) if gpu_count else "",
                gpu_memory_mib=draw(st.sampled_from([0, 16000])) if gpu_count else None,
            )
        )
    book = AllocationBook(nodes)
    for j in range(draw(st.integers(0, 25))):
        node = draw(st.integers(0, book.size - 1))
        count = book.nodes[node].gpu_count
        cpu = draw(st.sampled_from([0, 0, 500, 1500, 4000]))
        kind = draw(st.sampled_from(["cpu", "share", "share", "share", "whole"])) if count else "cpu"
        try:
            if kind == "cpu":
                book.allocate(Request(f"a{j}", cpu_milli=cpu), node)
            elif kind == "whole":
                k = draw(st.integers(1, min(count, 3)))
                gpus = draw(st.permutations(range(count)))[:k]
                book.allocate(Request(f"a{j}", cpu_milli=cpu, gpu_count=k, gpu_milli=1000), node, gpus)
            else:
                milli = draw(st.sampled_from([100, 200, 250, 300, 500, 800, draw(st.integers(1, 999))]))
                memory = draw(st.sampled_from([0, 0, 4000, 12000]))
                gpu = draw(st.integers(0, count - 1))
                book.allocate(
                    Request(f"a{j}", cpu_milli=cpu, gpu_count=1, gpu_milli=milli, gpu_memory_mib=memory), node, [gpu]
                )
        except AllocationError:
            pass
    for node in range(book.size):
        for gpu in range(book.nodes[node].gpu_count):
            if draw(st.integers(0, 9)) == 0:
                book.set_gpu_health(node, gpu, False)
    book.check_invariants()
    return book


def ref_nodes(book: AllocationBook) -> list[RefNode]:
    """The reference's view of the book, rebuilt from the allocations alone (not from derived arrays)."""
    result = []
    for i, node in enumerate(book.nodes):
        cpu = node.cpu_milli
        used = [0] * node.gpu_count
        memory = [gpu.memory_mib for gpu in node.gpus]
        held = [False] * node.gpu_count
        for allocation in book.allocations.values():
            if allocation.node != node.name:
                continue
            cpu -= allocation.request.cpu_milli
            for g in allocation.gpu_indices:
                used[g] += allocation.gpu_milli
                memory[g] -= allocation.gpu_memory_mib
                held[g] = True
        healthy = [bool(book.gpu_healthy[i, g]) for g in range(node.gpu_count)]
        free = [MILLI_PER_GPU - u if h else 0 for u, h in zip(used, healthy, strict=True)]
        result.append(
            RefNode(
                cpu_free=cpu,
                gpu_free=free,
                model=node.gpu_model,
                gpu_mem_free=memory,
                gpu_mem_enforced=[gpu.memory_mib > 0 for gpu in node.gpus],
                gpu_fully_free=[h and not x for h, x in zip(healthy, held, strict=True)],
            )
        )
    return result


FGD_SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------ equivalence tests


@FGD_SETTINGS
@given(book=cluster_strategy(), typical=typical_strategy())
def test_node_fragmentation_matches_reference(book: AllocationBook, typical: list[TypicalPod]) -> None:
    measure = FragmentationMeasure(typical, book.model_names)
    got = measure.node_fragmentation(book.cpu_free, book.gpu_avail, book.model_id)
    expected = [ref_node_fragmentation(n.cpu_free, n.gpu_free, n.model, typical) for n in ref_nodes(book)]
    assert got.tolist() == expected


@FGD_SETTINGS
@given(book=cluster_strategy(), typical=typical_strategy(), request_=request_strategy())
def test_fgd_matches_reference(book: AllocationBook, typical: list[TypicalPod], request_: Request) -> None:
    policy = FragmentationGradientDescent(typical)
    policy.attach(book)
    nodes = ref_nodes(book)
    everything = np.arange(book.size)
    if request_.is_share:
        got = policy.gpu_scores(book, request_, everything)
        assert got.shape == (book.size, book.max_gpus)
        for i, ref in enumerate(nodes):
            expected = ref_gpu_scores(ref, request_, typical)
            padding = [-1] * (book.max_gpus - len(expected))
            assert got[i].tolist() == expected + padding, f"node {i}"
    feasible = np.flatnonzero(feasible_mask(book, request_))
    if feasible.size == 0:
        return
    scores = policy.score(book, request_, feasible).tolist()
    rng = np.random.default_rng(0)
    for node, score in zip(feasible.tolist(), scores, strict=True):
        expected_score, expected_gpus = ref_decision(nodes[node], request_, typical)
        assert score == expected_score, f"node {node}"
        assert policy.choose_gpus(book, request_, node, rng) == expected_gpus, f"node {node}"
        assert 0 <= score <= 100


def test_reference_agrees_on_a_hand_example() -> None:
    """Guard the reference itself with the numbers worked out in test_policies."""
    typical = [TypicalPod(PodShape(0, 1000, 1), 0.5), TypicalPod(PodShape(0, 500, 1), 0.5)]
    node = RefNode(8000, [1000, 700, 500], "T4", [0, 0, 0], [False] * 3, [True, False, False])
    assert ref_node_fragmentation(8000, [1000, 700, 500], "T4", typical) == 600
    share = Request("s", gpu_count=1, gpu_milli=200)
    assert ref_gpu_scores(node, share, typical) == [40, 52, 48]
    assert ref_decision(node, share, typical) == (52, (1,))
    assert ref_decision(node, Request("w", gpu_count=1, gpu_milli=1000), typical) == (50, (0,))


def test_measure_without_typical_pods_is_zero() -> None:
    measure = FragmentationMeasure([], ("", "T4"))
    result = measure.node_fragmentation(np.array([5, 6]), np.array([[1000, 300], [0, 0]]), np.array([1, 1]))
    assert result.tolist() == [0.0, 0.0]


def test_fgd_without_typical_pods_scores_everything_50() -> None:
    book = AllocationBook([make_node("n", cpu_milli=1000, memory_mib=1, gpu_count=2, gpu_model="T4")])
    policy = FragmentationGradientDescent([])
    policy.attach(book)
    share = Request("s", gpu_count=1, gpu_milli=300)
    assert policy.score(book, share, np.array([0])).tolist() == [50]
    assert policy.choose_gpus(book, share, 0, np.random.default_rng()) == (0,)


def test_measure_components_figures() -> None:
    typical = [TypicalPod(PodShape(0, 500, 2), 1.0)]
    measure = FragmentationMeasure(typical, ("", "T4"))
    frag, fit_count, small, total = measure.components(
        np.array([100, 100]), np.array([[1000, 400, 600], [300, 300, 0]]), np.array([1, 1])
    )
    assert fit_count.tolist() == [[2], [0]]
    assert small.tolist() == [[400], [600]]
    assert total.tolist() == [2000, 600]
    assert frag.tolist() == [[400], [600]]  # second node: fewer than 2 GPUs fit, so everything


# ---------------------------------------------------------------------------------- typical pods


def shape(cpu: int, milli: int = 0, count: int = 0, label: str = "") -> PodShape:
    return PodShape(cpu, milli, count, label)


def test_typical_pods_order_by_count_then_larger_shape() -> None:
    a = shape(1000, 500, 1)
    b = shape(2000, 100, 1)  # larger CPU: before a on equal counts
    c = shape(1000, 500, 1, "T4")  # same fields as a, then the label decides
    d = shape(1000, 1000, 1)  # larger per-GPU share than a
    e = shape(1000, 1000, 2)  # more GPUs than d
    pods = [a] * 5 + [b] * 5 + [c] * 5 + [d] * 5 + [e] * 5 + [shape(0)] * 9
    result = typical_pods(pods, coverage=1.0)
    assert [t.shape for t in result] == [shape(0), b, e, d, c, a]
    assert [t.share for t in result] == [9 / 34] + [5 / 34] * 5


def test_typical_pods_coverage_cut_off() -> None:
    x, y, z, w = shape(0, 500, 1), shape(0, 1000, 1), shape(0, 1000, 2), shape(0, 250, 1)
    pods = [x] * 60 + [y] * 30 + [z] * 6 + [w] * 4
    result = typical_pods(pods)
    # 60 and 90 are below 95 % of 100 pods; 96 reaches it, so w (4 pods) is dropped.
    assert [t.shape for t in result] == [x, y, z]
    assert [t.share for t in result] == [60 / 96, 30 / 96, 6 / 96]
    assert math.isclose(sum(t.share for t in result), 1.0)
    exact = typical_pods([x] * 95 + [y] * 5)
    assert [(t.shape, t.share) for t in exact] == [(x, 1.0)]
    assert [t.shape for t in typical_pods(pods, coverage=0.5)] == [x]
    assert len(typical_pods(pods, coverage=1.0)) == 4


def test_typical_pods_without_cpu_pods() -> None:
    gpu = shape(0, 500, 1)
    pods = [shape(1000)] * 50 + [gpu] * 10
    assert [t.shape for t in typical_pods(pods, include_cpu_pods=False)] == [gpu]
    assert typical_pods([shape(1000)], include_cpu_pods=False) == []
    assert typical_pods([]) == []


@pytest.mark.parametrize("coverage", [0.0, -0.1, 1.01, 2])
def test_typical_pods_rejects_bad_coverage(coverage: float) -> None:
    with pytest.raises(InvalidInputError, match="coverage"):
        typical_pods([shape(0, 500, 1)], coverage=coverage)


def test_pod_shape_models() -> None:
    assert shape(0, 500, 1).gpu_models is None
    assert shape(0, 500, 1, "T4|A100").gpu_models == frozenset({"T4", "A100"})
    assert shape(0, 500, 1, "|T4|").gpu_models == frozenset({"T4"})


@settings(max_examples=200, deadline=None)
@given(
    pods=st.lists(
        st.builds(
            shape,
            st.sampled_from([0, 1000, 4000]),
            st.sampled_from([0, 250, 500, 1000]),
            st.integers(0, 2),
            st.sampled_from(["", "T4"]),
        ),
        min_size=1,
        max_size=80,
    ),
    coverage=st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99, 1.0]),
)
def test_typical_pods_properties(pods: list[PodShape], coverage: float) -> None:
    result = typical_pods(pods, coverage=coverage)
    counts = Counter(pods)
    total = len(pods)
    assert result
    assert math.isclose(sum(t.share for t in result), 1.0)
    kept = [counts[t.shape] for t in result]
    # Shares are the kept counts renormalised.
    covered = sum(kept)
    assert [t.share for t in result] == [c / covered for c in kept]
    # Most frequent first; equal counts go to the larger shape.
    keys = [(counts[t.shape], t.shape) for t in result]
    assert keys == sorted(keys, reverse=True)
    # Every dropped shape is no more frequent than the last kept one (and smaller on equal counts).
    for dropped in set(counts) - {t.shape for t in result}:
        assert (counts[dropped], dropped) < keys[-1]
    # The kept shapes reach the coverage, and the shapes before the last one did not.
    assert covered >= coverage * total
    assert covered - kept[-1] < coverage * total
