"""Gang placement through the placement framework (``kubecell.core.engine.placement``).

The gang placer must place members exactly where one-by-one decisions of the same policy would (its
heap of node scores with state-memoized rescoring is an optimisation, not a different rule); ``fits``
must promise exactly what ``place`` delivers (victim searches rely on it); members stay inside the
allowed GPUs and inside one node or one labelled rack when asked; and a gang is all or nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.book import AllocationBook, BoolArray
from kubecell.core.engine.job import JobSpec
from kubecell.core.engine.placement import GangPlacer, member_capacity
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel, make_node
from kubecell.core.placement.filters import feasible_mask
from kubecell.core.placement.frag import PodShape, TypicalPod
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.registry import PolicyContext, make_policy

TYPICAL = PolicyContext([TypicalPod(PodShape(1000, 250, 1), 0.4), TypicalPod(PodShape(4000, 1000, 1), 0.4),
                         TypicalPod(PodShape(8000, 1000, 2), 0.2)])
MEMBERS: list[dict[str, Any]] = [
    {"cpu_milli": 1000, "gpu_count": 1, "gpu_milli": 250},
    {"cpu_milli": 2000, "gpu_count": 1, "gpu_milli": 500, "gpu_memory_mib": 4000},
    {"cpu_milli": 4000, "gpu_count": 1, "gpu_milli": 1000},
    {"cpu_milli": 8000, "gpu_count": 2, "gpu_milli": 1000},
    {"cpu_milli": 8000, "gpu_count": 2, "gpu_milli": 1000, "topology": TopologyLevel.NVLINK},
    {"cpu_milli": 3000},
]


def cluster(specs: list[tuple[int, int, str]]) -> AllocationBook:
    return AllocationBook([make_node(f"n{i:02d}", cpu_milli=cpu, memory_mib=1 << 20, gpu_count=gpus,
                                     gpu_model=model if gpus else "", rack=f"r{i // 3}" if i % 4 else "",
                                     nvlink_groups=[list(range(gpus // 2)), list(range(gpus // 2, gpus))]
                                     if gpus >= 4 else [])
                           for i, (cpu, gpus, model) in enumerate(specs)])


def prefill(book: AllocationBook, seed: int) -> None:
    """Some shares and whole GPUs already taken, deterministically."""
    rng = np.random.default_rng(seed)
    for i in range(int(rng.integers(0, 12))):
        member = MEMBERS[int(rng.integers(0, 4))]
        request = Request(f"fill-{i}", **member)
        nodes = np.flatnonzero(feasible_mask(book, request))
        if nodes.size:
            node = int(nodes[int(rng.integers(nodes.size))])
            fits: list[int] = ([int(g) for g in np.flatnonzero(book.gpu_fits(node, request))[: request.gpu_count]]
                               if request.wants_gpu else [])
            book.allocate(request, node, fits)


specs_strategy = st.lists(st.tuples(st.sampled_from([16000, 32000, 64000]), st.sampled_from([0, 2, 4, 8]),
                                    st.sampled_from(["T4", "A100"])), min_size=2, max_size=9)


def placers(book: AllocationBook, name: str, seed: int) -> tuple[GangPlacer, Placer]:
    rank = np.random.default_rng(seed).permutation(book.size).astype(np.int64)
    rack = np.array([int(n.rack[1:]) if n.rack else -1 for n in book.nodes], np.int64)
    placer = Placer(book, make_policy(name, TYPICAL), tie_rank=rank)
    return GangPlacer(book, placer, rack, np.full(book.size, -1, np.int64)), placer


@pytest.mark.parametrize("name", ["kubecell", "fgd", "gpupacking", "binpack", "bestfit"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=specs_strategy, member=st.integers(0, len(MEMBERS) - 1), members=st.integers(2, 14),
       seed=st.integers(0, 10_000), masked=st.booleans())
def test_members_land_where_one_by_one_decisions_put_them(name: str, specs: list[tuple[int, int, str]], member: int,
                                                          members: int, seed: int, masked: bool) -> None:
    book, reference_book = cluster(specs), cluster(specs)
    prefill(book, seed)
    prefill(reference_book, seed)
    gangs, _ = placers(book, name, seed)
    _, reference = placers(reference_book, name, seed)
    allowed: BoolArray | None = np.random.default_rng(seed).random((book.size, book.max_gpus)) < 0.7 if masked \
        else None
    spec = JobSpec(name="g", vc="a", member=Request("g", **MEMBERS[member]), members=members, min_members=1)
    capacity = member_capacity(book, spec.member_request(0), allowed)
    assert (capacity > 0).tolist() == feasible_mask(book, spec.member_request(0), allowed).tolist()
    fits = gangs.fits(spec, allowed, None, members, 1)
    placed = gangs.place(spec, allowed, None, members, 1)
    assert fits == (placed is not None)
    expected = []
    for index in range(min(members, int(np.minimum(capacity, members).sum()))):
        request = spec.member_request(index)
        decision = reference.decide(request, allowed)
        assert decision is not None, "the capacity count promised this member a place"
        reference_book.allocate(request, decision.node, decision.gpus)
        expected.append((decision.node, decision.gpus))
    actual = [(book.index[a.node], a.gpu_indices) for a in placed or []]
    assert actual == expected
    if allowed is not None:
        assert all(allowed[node, gpu] for node, gpus in actual for gpu in gpus)
    book.check_invariants()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=specs_strategy, member=st.integers(0, 3), members=st.integers(2, 10), seed=st.integers(0, 10_000),
       level=st.sampled_from([TopologyLevel.NODE, TopologyLevel.RACK]))
def test_constrained_gangs_stay_in_one_node_or_one_labelled_rack(specs: list[tuple[int, int, str]], member: int,
                                                                members: int, seed: int,
                                                                level: TopologyLevel) -> None:
    book = cluster(specs)
    prefill(book, seed)
    gangs, _ = placers(book, "kubecell", seed)
    spec = JobSpec(name="g", vc="a", member=Request("g", **MEMBERS[member]), members=members, min_members=2,
                   topology=level)
    before = dict(book.allocations)
    placed = gangs.place(spec, None, None, members, 2)
    if placed is None:
        assert book.allocations == before  # nothing taken
        return
    assert 2 <= len(placed) <= members
    nodes = {a.node for a in placed}
    if level == TopologyLevel.NODE:
        assert len(nodes) == 1
    else:
        racks = {book.nodes[book.index[n]].rack for n in nodes}
        assert len(racks) == 1
        assert racks != {""}  # an unlabelled node belongs to no rack


def test_unlabelled_nodes_never_make_a_rack() -> None:
    book = cluster([(64000, 8, "A100")] * 4)  # n00 and n04.. are unlabelled (i % 4 == 0)
    gangs, _ = placers(book, "kubecell", 0)
    spec = JobSpec(name="g", vc="a", member=Request("g", gpu_count=8, gpu_milli=MILLI_PER_GPU), members=3,
                   topology=TopologyLevel.RACK)
    assert not gangs.fits(spec, None, None, 3, 3)  # r0 holds n01, n02 only; n00 has no rack
    spec2 = JobSpec(name="h", vc="a", member=Request("h", gpu_count=8, gpu_milli=MILLI_PER_GPU), members=2,
                    topology=TopologyLevel.RACK)
    placed = gangs.place(spec2, None, None, 2, 2)
    assert placed is not None
    assert {a.node for a in placed} == {"n01", "n02"}
