"""Filter (which nodes fit now, which requests never fit) and choose-GPU (which GPUs inside a node)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubecell.core.book import AllocationBook
from kubecell.core.errors import AllocationError
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel, make_node
from kubecell.core.placement.filters import feasible_mask, model_mask, never_fits, whole_gpus_in_one_group
from kubecell.core.placement.gpu_choice import (
    best_fit_gpu,
    fitting_gpus,
    random_gpu,
    whole_gpus,
    worst_fit_gpu,
)

NVL = TopologyLevel.NVLINK
NUMA = TopologyLevel.NUMA


def share(name: str = "s", milli: int = 0, memory: int = 0, cpu: int = 0, mem: int = 0, **kw: Any) -> Request:
    return Request(name, cpu_milli=cpu, memory_mib=mem, gpu_count=1, gpu_milli=milli, gpu_memory_mib=memory, **kw)


def whole(name: str = "w", count: int = 1, cpu: int = 0, mem: int = 0, **kw: Any) -> Request:
    return Request(name, cpu_milli=cpu, memory_mib=mem, gpu_count=count, gpu_milli=MILLI_PER_GPU, **kw)


def cluster() -> AllocationBook:
    """t4: 2 free T4; v100: 8 V100M32 in NVLink quads, GPUs 0,1,4,5 taken whole (free 2+2);
    a100: 4 A100 (NVLink pairs), GPU0 100 milli / 39536 MiB free, GPU1 900 milli / 536 MiB free,
    GPUs 2,3 taken whole; cpu: no GPUs."""
    book = AllocationBook(
        [
            make_node("t4", cpu_milli=8000, memory_mib=16000, gpu_count=2, gpu_model="T4"),
            make_node(
                "v100",
                cpu_milli=32000,
                memory_mib=64000,
                gpu_count=8,
                gpu_model="V100M32",
                nvlink_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
                numa_groups=[[0, 1, 2, 3, 4, 5], [6, 7]],
            ),
            make_node(
                "a100",
                cpu_milli=16000,
                memory_mib=32000,
                gpu_count=4,
                gpu_model="A100",
                nvlink_groups=[[0, 1], [2, 3]],
            ),
            make_node("cpu", cpu_milli=64000, memory_mib=32000),
        ]
    )
    book.allocate(whole("v-a", 2), 1, [0, 1])
    book.allocate(whole("v-b", 2), 1, [4, 5])
    book.allocate(share("a-0", milli=900, memory=1000), 2, [0])
    book.allocate(share("a-1", milli=100, memory=40000), 2, [1])
    book.allocate(whole("a-w", 2), 2, [2, 3])
    return book


FEASIBLE: list[tuple[str, Request, list[bool]]] = [
    ("cpu-only-small", Request("c", cpu_milli=1000, memory_mib=1000), [True, True, True, True]),
    ("cpu-only-big", Request("c", cpu_milli=20000), [False, True, False, True]),
    ("memory-big", Request("c", memory_mib=40000), [False, True, False, False]),
    ("exact-capacity", Request("c", cpu_milli=8000, memory_mib=16000), [True, True, True, True]),
    ("cpu-above-capacity", Request("c", cpu_milli=64001), [False, False, False, False]),
    ("share", share(milli=500), [True, True, True, False]),
    ("share-too-big-for-a100", share(milli=901), [True, True, False, False]),
    ("share-fits-a100-gpu1", share(milli=900), [True, True, True, False]),
    ("share-with-cpu", share(milli=100, cpu=9000), [False, True, True, False]),
    ("share-model", share(milli=100, gpu_models=frozenset({"T4", "A100"})), [True, False, True, False]),
    ("share-unknown-model", share(milli=100, gpu_models=frozenset({"H100"})), [False, False, False, False]),
    # Milli and memory must be free on the same GPU: a100 has neither GPU with 500 milli + 1000 MiB.
    ("share-milli+memory-split", share(milli=500, memory=1000), [True, True, False, False]),
    ("share-milli+memory-gpu0", share(milli=100, memory=39536), [False, False, True, False]),
    ("share-memory-over-t4", share(milli=100, memory=15110), [False, True, True, False]),
    ("share-memory-only", share(memory=600), [True, True, True, False]),
    ("share-memory-only-too-big", share(memory=39537), [False, False, False, False]),
    ("whole-1", whole(count=1), [True, True, False, False]),
    ("whole-2", whole(count=2), [True, True, False, False]),
    ("whole-3", whole(count=3), [False, True, False, False]),
    ("whole-4", whole(count=4), [False, True, False, False]),
    ("whole-5", whole(count=5), [False, False, False, False]),
    ("whole-2-nvlink", whole(count=2, topology=NVL), [True, True, False, False]),
    # v100 has 4 free GPUs split 2+2 across its NVLink quads: not one NVLink cell of 4.
    ("whole-4-nvlink", whole(count=4, topology=NVL), [False, False, False, False]),
    ("whole-3-nvlink", whole(count=3, topology=NVL), [False, False, False, False]),
    # NUMA groups of v100 are 0-5 and 6-7: free 2,3 in the first, 6,7 in the second.
    ("whole-2-numa", whole(count=2, topology=NUMA), [True, True, False, False]),
    ("whole-3-numa", whole(count=3, topology=NUMA), [False, False, False, False]),
    ("whole-4-node", whole(count=4, topology=TopologyLevel.NODE), [False, True, False, False]),
    ("whole-4-rack", whole(count=4, topology=TopologyLevel.RACK), [False, True, False, False]),
    ("whole-1-gpu-level", whole(count=1, topology=TopologyLevel.GPU), [True, True, False, False]),
    ("whole-2-gpu-level", whole(count=2, topology=TopologyLevel.GPU), [False, False, False, False]),
    ("whole-model", whole(count=1, gpu_models=frozenset({"V100M32"})), [False, True, False, False]),
    ("whole-cpu", whole(count=1, cpu=10000), [False, True, False, False]),
]


@pytest.mark.parametrize(("request_", "expected"), [c[1:] for c in FEASIBLE], ids=[c[0] for c in FEASIBLE])
def test_feasible_mask(request_: Request, expected: list[bool]) -> None:
    book = cluster()
    mask = feasible_mask(book, request_)
    assert mask.dtype == np.bool_
    assert mask.tolist() == expected
    # The mask agrees with the book: every feasible node really takes the request with the GPUs chosen.
    for node in np.flatnonzero(mask):
        gpus = best_fit_gpu(book, request_, int(node))
        book.allocate(request_, int(node), gpus)
        book.release(request_.name)


def test_feasible_mask_follows_changes() -> None:
    book = cluster()
    request_ = whole(count=4, topology=NVL)
    assert not feasible_mask(book, request_)[1]
    book.release("v-b")  # frees 4,5: the second quad is whole again
    assert feasible_mask(book, request_).tolist() == [False, True, False, False]
    book.set_gpu_health(1, 6, False)
    assert not feasible_mask(book, request_)[1]
    assert feasible_mask(book, whole(count=4)).tolist() == [False, True, False, False]  # 2, 3, 4, 5, 7 free


def test_unhealthy_gpus_do_not_count() -> None:
    book = AllocationBook([make_node("n", cpu_milli=1000, memory_mib=1000, gpu_count=2, gpu_model="T4")])
    book.set_gpu_health(0, 0, False)
    book.set_gpu_health(0, 1, False)
    assert not feasible_mask(book, share(milli=1))[0]
    assert not feasible_mask(book, share(memory=1))[0]
    assert not feasible_mask(book, whole())[0]
    assert feasible_mask(book, Request("c", cpu_milli=1000))[0]


def test_model_mask_and_group_counts() -> None:
    book = cluster()
    assert model_mask(book, share(milli=1)).tolist() == [True] * 4
    assert model_mask(book, share(milli=1, gpu_models=frozenset({"A100", "T4"}))).tolist() == [
        True,
        False,
        True,
        False,
    ]
    rows = np.arange(book.size)
    assert whole_gpus_in_one_group(book, rows, NVL).tolist() == [2, 2, 0, 0]
    assert whole_gpus_in_one_group(book, rows, NUMA).tolist() == [2, 2, 0, 0]
    assert whole_gpus_in_one_group(book, rows, TopologyLevel.NODE).tolist() == [2, 4, 0, 0]
    assert whole_gpus_in_one_group(book, rows, TopologyLevel.GPU).tolist() == [1, 1, 0, 0]


# ------------------------------------------------------------------------------------------ never_fits

NEVER: list[tuple[str, Request, str, list[str]]] = [
    ("cpu", Request("r", cpu_milli=64001), "cpu_milli", ["64001m", "largest node has 64000m"]),
    ("memory", Request("r", memory_mib=64001), "memory_mib", ["64001 MiB", "largest node has 64000 MiB"]),
    ("cpu+memory-apart", Request("r", cpu_milli=64000, memory_mib=64000), "cpu_milli", ["both"]),
    ("model", share(milli=1, gpu_models=frozenset({"H100", "L4"})), "gpu_models", ["'H100', 'L4'", "'T4'"]),
    ("count", whole(count=9), "gpu_count", ["9 GPUs", "at most 8"]),
    ("count-of-model", whole(count=4, gpu_models=frozenset({"T4"})), "gpu_count", ["4 GPUs", "at most 2"]),
    ("cpu-on-gpu-node", whole(count=8, cpu=40000), "cpu_milli", ["40000m", "8+ GPUs", "at most 32000m"]),
    ("nvlink-cell", whole(count=8, topology=NVL), "topology", ["8 GPUs", "NVLINK"]),
    ("numa-cell", whole(count=7, topology=NUMA), "topology", ["NUMA"]),
    ("gpu-cell", whole(count=2, topology=TopologyLevel.GPU), "topology", ["2 GPUs", "GPU cell"]),
    ("gpu-memory", share(milli=1, memory=40537), "gpu_memory_mib", ["40537 MiB"]),
    ("gpu-memory-of-model", share(memory=16000, gpu_models=frozenset({"T4"})), "gpu_memory_mib", ["16000"]),
]


@pytest.mark.parametrize(("request_", "field", "fragments"), [c[1:] for c in NEVER], ids=[c[0] for c in NEVER])
def test_never_fits_reasons(request_: Request, field: str, fragments: list[str]) -> None:
    book = cluster()
    verdict = never_fits(book, request_)
    assert verdict is not None
    assert verdict.field == field
    for fragment in fragments:
        assert fragment in verdict.reason
    # A request that never fits does not fit now either.
    assert not feasible_mask(book, request_).any()


@pytest.mark.parametrize(
    "request_",
    [
        Request("r", cpu_milli=64000, memory_mib=32000),
        share(milli=1000 - 1, memory=40536),
        whole(count=8),  # v100 is busy now, but empty it would take it
        whole(count=4, topology=NVL),
        whole(count=6, topology=NUMA),
        whole(count=1, topology=TopologyLevel.GPU),
        whole(count=2, gpu_models=frozenset({"T4"})),
        share(milli=10),
    ],
)
def test_never_fits_accepts_requests_an_empty_cluster_could_hold(request_: Request) -> None:
    assert never_fits(cluster(), request_) is None


def test_never_fits_unknown_gpu_memory_is_not_a_limit() -> None:
    book = AllocationBook([make_node("g", cpu_milli=1000, memory_mib=1000, gpu_count=1, gpu_model="G1")])
    assert never_fits(book, share(memory=10**6)) is None
    assert feasible_mask(book, share(memory=10**6)).tolist() == [True]


# ------------------------------------------------------------------------------------------ GPU choice


def share_node() -> AllocationBook:
    """One node of four T4: free milli [600, 300, 1000, 300]; GPU3 has little memory left."""
    book = AllocationBook([make_node("n", cpu_milli=8000, memory_mib=8000, gpu_count=4, gpu_model="T4")])
    book.allocate(share("g0", milli=400), 0, [0])
    book.allocate(share("g1", milli=700), 0, [1])
    book.allocate(share("g3", milli=700, memory=15000), 0, [3])
    return book


@pytest.mark.parametrize(
    ("request_", "best", "worst", "fitting"),
    [
        pytest.param(share(milli=250), (1,), (2,), [0, 1, 2, 3], id="ties-go-to-lowest-index"),
        pytest.param(share(milli=300), (1,), (2,), [0, 1, 2, 3], id="exact-fit"),
        pytest.param(share(milli=301), (0,), (2,), [0, 2], id="above-300"),
        pytest.param(share(milli=700), (2,), (2,), [2], id="only-free-gpu"),
        pytest.param(share(milli=100, memory=200), (1,), (2,), [0, 1, 2], id="memory-excludes-gpu3"),
        pytest.param(share(memory=109), (1,), (2,), [0, 1, 2, 3], id="memory-only-share"),
        pytest.param(whole(count=1), (2,), (2,), [2], id="whole"),
        pytest.param(Request("c", cpu_milli=10), (), (), [], id="cpu-only"),
    ],
)
def test_best_and_worst_fit(
    request_: Request, best: tuple[int, ...], worst: tuple[int, ...], fitting: list[int]
) -> None:
    book = share_node()
    assert best_fit_gpu(book, request_, 0) == best
    assert worst_fit_gpu(book, request_, 0) == worst
    if request_.wants_gpu:
        assert fitting_gpus(book, request_, 0).tolist() == fitting


def test_random_gpu_only_picks_fitting_gpus_and_reaches_all_of_them() -> None:
    book = share_node()
    rng = np.random.default_rng(7)
    seen = {random_gpu(book, share(milli=100, memory=200), 0, rng) for _ in range(200)}
    assert seen == {(0,), (1,), (2,)}
    seen = {random_gpu(book, share(milli=301), 0, rng) for _ in range(100)}
    assert seen == {(0,), (2,)}
    assert random_gpu(book, whole(count=1), 0, rng) == (2,)
    assert random_gpu(book, Request("c"), 0, rng) == ()
    first = [random_gpu(book, share(milli=1), 0, np.random.default_rng(3)) for _ in range(5)]
    assert len(set(first)) == 1  # same seed, same choice


@pytest.mark.parametrize("choose", [best_fit_gpu, worst_fit_gpu])
def test_no_fitting_gpu_raises(choose: Any) -> None:
    book = share_node()
    with pytest.raises(AllocationError, match="no GPU of node 'n' fits"):
        choose(book, share(milli=100, memory=15110), 0)
    with pytest.raises(AllocationError):
        choose(book, whole(count=2), 0)
    book.allocate(share("g2", milli=600), 0, [2])
    with pytest.raises(AllocationError):
        choose(book, share(milli=601), 0)
    with pytest.raises(AllocationError):
        random_gpu(book, share(milli=601), 0, np.random.default_rng(0))


def quad_node() -> AllocationBook:
    """Eight GPUs in NVLink quads [0-3] [4-7] and NUMA halves [0-5] [6-7]; GPU 0 taken whole."""
    book = AllocationBook(
        [
            make_node(
                "q",
                cpu_milli=8000,
                memory_mib=8000,
                gpu_count=8,
                gpu_model="A100",
                nvlink_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
                numa_groups=[[0, 1, 2, 3, 4, 5], [6, 7]],
            )
        ]
    )
    book.allocate(whole("first"), 0, [0])
    return book


@pytest.mark.parametrize(
    ("request_", "gpus"),
    [
        pytest.param(whole(count=1), (1,), id="first-free"),
        pytest.param(whole(count=3), (1, 2, 3), id="first-free-3"),
        pytest.param(whole(count=5), (1, 2, 3, 4, 5), id="spans-groups-without-topology"),
        pytest.param(whole(count=2, topology=NVL), (1, 2), id="nvlink-tightest-group-of-3"),
        pytest.param(whole(count=3, topology=NVL), (1, 2, 3), id="nvlink-3-fits-exactly"),
        pytest.param(whole(count=4, topology=NVL), (4, 5, 6, 7), id="nvlink-4-needs-the-full-quad"),
        pytest.param(whole(count=1, topology=NUMA), (6,), id="numa-tightest-is-the-pair"),
        pytest.param(whole(count=2, topology=NUMA), (6, 7), id="numa-2"),
        pytest.param(whole(count=3, topology=NUMA), (1, 2, 3), id="numa-3-goes-to-the-big-half"),
        pytest.param(whole(count=2, topology=TopologyLevel.NODE), (1, 2), id="node-level-is-first-free"),
    ],
)
def test_whole_gpus(request_: Request, gpus: tuple[int, ...]) -> None:
    book = quad_node()
    assert whole_gpus(book, request_, 0) == gpus
    assert best_fit_gpu(book, request_, 0) == gpus
    assert worst_fit_gpu(book, request_, 0) == gpus
    book.allocate(request_, 0, gpus)
    book.check_invariants()


def test_whole_gpus_tie_between_groups_goes_to_the_first() -> None:
    book = quad_node()
    book.release("first")
    assert whole_gpus(book, whole(count=2, topology=NVL), 0) == (0, 1)
    book.allocate(whole("x", 2), 0, [0, 1])
    book.allocate(whole("y", 2), 0, [4, 5])
    assert whole_gpus(book, whole(count=2, topology=NVL), 0) == (2, 3)


def test_whole_gpus_errors() -> None:
    book = quad_node()
    book.allocate(whole("x"), 0, [5])
    with pytest.raises(AllocationError, match="no NVLINK group"):
        whole_gpus(book, whole(count=4, topology=NVL), 0)
    with pytest.raises(AllocationError, match="fewer than 7 free GPUs"):
        whole_gpus(book, whole(count=7), 0)
    # A partly used GPU is not free for a whole request.
    book.allocate(share("s", milli=1), 0, [1])
    assert whole_gpus(book, whole(count=2, topology=NVL), 0) == (2, 3)
    assert whole_gpus(book, whole(count=3), 0) == (2, 3, 4)


# ------------------------------------------------------------- never_fits agrees with an empty cluster


@st.composite
def empty_cluster(draw: Callable[..., Any]) -> AllocationBook:
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        count = draw(st.sampled_from([0, 1, 2, 4, 8]))
        groups = draw(st.sampled_from([[], [list(range(count // 2)), list(range(count // 2, count))]])) if count else []
        nodes.append(
            make_node(
                f"n{i}",
                cpu_milli=draw(st.sampled_from([1000, 8000, 32000])),
                memory_mib=draw(st.sampled_from([1000, 8000, 32000])),
                gpu_count=count,
                gpu_model=draw(st.sampled_from(["T4", "A100", "G1"])) if count else "",
                nvlink_groups=[g for g in groups if g],
                numa_groups=draw(st.sampled_from([[], [list(range(count))]])),
            )
        )
    return AllocationBook(nodes)


@st.composite
def any_request(draw: Callable[..., Any]) -> Request:
    cpu = draw(st.sampled_from([0, 1000, 8000, 20000, 40000]))
    mem = draw(st.sampled_from([0, 1000, 8000, 20000, 40000]))
    models = draw(st.sampled_from([None, None, frozenset({"T4"}), frozenset({"A100", "H100"}), frozenset({"L4"})]))
    kind = draw(st.sampled_from(["cpu", "share", "whole"]))
    if kind == "cpu":
        return Request("r", cpu_milli=cpu, memory_mib=mem)
    if kind == "share":
        memory = draw(st.sampled_from([0, 10000, 16000, 40000, 50000]))
        milli = draw(st.sampled_from([0, 1, 500, 999])) or (0 if memory else 1)
        return Request(
            "r", cpu_milli=cpu, memory_mib=mem, gpu_count=1, gpu_milli=milli, gpu_memory_mib=memory, gpu_models=models
        )
    return Request(
        "r",
        cpu_milli=cpu,
        memory_mib=mem,
        gpu_count=draw(st.sampled_from([1, 2, 3, 4, 5, 8, 9])),
        gpu_milli=MILLI_PER_GPU,
        gpu_models=models,
        topology=draw(st.sampled_from([None, *TopologyLevel])),
    )


@settings(max_examples=300, deadline=None)
@given(book=empty_cluster(), request_=any_request())
def test_never_fits_iff_an_empty_cluster_cannot_hold_it(book: AllocationBook, request_: Request) -> None:
    fits_now = bool(feasible_mask(book, request_).any())
    verdict = never_fits(book, request_)
    assert (verdict is None) == fits_now, verdict
