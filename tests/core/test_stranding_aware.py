"""The kubecell placement policy: host-aware fragmentation, scarcity weights, online demand.

The behaviour tests are small clusters on which FGD strands GPUs behind exhausted CPU or memory and
the kubecell policy does not; the property tests pin the measure to FGD's where the new terms vanish,
so that the two can only differ by what the docs say they differ by.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node, Request, make_node
from kubecell.core.placement.demand import DemandModel, DemandType, shape_of, total_variation
from kubecell.core.placement.frag import FragmentationMeasure, PodShape, TypicalPod
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.policies.fgd import FragmentationGradientDescent
from kubecell.core.placement.policies.stranding_aware import StrandingAwareFGD
from kubecell.core.placement.policy import Policy
from kubecell.core.placement.registry import make_policy
from kubecell.core.placement.stranding import HostAwareMeasure, demand_from_typical
from tests.core.test_fgd import cluster_strategy, request_strategy, typical_strategy

GIB = 1024


def gpu_pod(name: str, *, cpu: int = 8000, memory: int = 0, milli: int = 1000, models: frozenset[str] | None = None
            ) -> Request:
    return Request(name, cpu_milli=cpu, memory_mib=memory, gpu_count=1, gpu_milli=milli, gpu_models=models)


def replay(nodes: list[Node], policy: Policy, requests: list[Request]) -> tuple[AllocationBook, list[str]]:
    """Place requests in order with ties going to the first node; return the book and the failures."""
    book = AllocationBook(nodes)
    placer = Placer(book, policy, tie_rank=np.arange(book.size, dtype=np.int64))
    failed = [r.name for r in requests if placer.place_and_commit(r) is None]
    return book, failed


# ------------------------------------------------------------------- where FGD strands and kubecell does not


def cpu_case() -> tuple[list[Node], list[Request], list[TypicalPod]]:
    """Two 2-GPU nodes, one with 20 vCPU and one with 40. A 10-vCPU CPU-only pod leaves node a with
    10 vCPU: FGD still sees one 8-vCPU GPU pod fit there (no change in its measure, a tie, node a),
    so of the four GPU pods that follow one fails and a GPU stays idle. Counting how many GPUs the
    CPU can feed sends the CPU pod to node b, where its CPU was spare, and all four GPU pods run."""
    nodes = [
        make_node("a", cpu_milli=20_000, memory_mib=64 * GIB, gpu_count=2, gpu_model="T4"),
        make_node("b", cpu_milli=40_000, memory_mib=64 * GIB, gpu_count=2, gpu_model="T4"),
    ]
    requests = [Request("cpu-job", cpu_milli=10_000)] + [gpu_pod(f"g{i}") for i in range(4)]
    typical = [TypicalPod(PodShape(8000, 1000, 1), 0.8), TypicalPod(PodShape(10_000, 0, 0), 0.2)]
    return nodes, requests, typical


def memory_case() -> tuple[list[Node], list[Request], list[TypicalPod], list[DemandType]]:
    """Same story with host memory, which FGD's measure ignores altogether: a 40 GiB CPU-only pod on
    the 160 GiB node leaves room for one 64 GiB GPU pod instead of two."""
    nodes = [
        make_node("a", cpu_milli=64_000, memory_mib=160 * GIB, gpu_count=2, gpu_model="T4"),
        make_node("b", cpu_milli=64_000, memory_mib=400 * GIB, gpu_count=2, gpu_model="T4"),
    ]
    requests = [Request("cache", cpu_milli=1000, memory_mib=40 * GIB)]
    requests += [gpu_pod(f"g{i}", cpu=4000, memory=64 * GIB) for i in range(4)]
    typical = [TypicalPod(PodShape(4000, 1000, 1), 0.8), TypicalPod(PodShape(1000, 0, 0), 0.2)]
    demand = [DemandType(PodShape(4000, 1000, 1), 0.8, 64 * GIB), DemandType(PodShape(1000, 0, 0), 0.2, 40 * GIB)]
    return nodes, requests, typical, demand


def test_fgd_strands_a_gpu_behind_exhausted_cpu_and_kubecell_does_not() -> None:
    nodes, requests, typical = cpu_case()
    fgd_book, fgd_failed = replay(nodes, FragmentationGradientDescent(typical), requests)
    assert fgd_book.allocations["cpu-job"].node == "a"
    assert len(fgd_failed) == 1
    assert int(fgd_book.gpu_avail.sum()) == 1000

    ours_book, ours_failed = replay(nodes, StrandingAwareFGD(demand_from_typical(typical)), requests)
    assert ours_book.allocations["cpu-job"].node == "b"
    assert ours_failed == []
    assert int(ours_book.gpu_avail.sum()) == 0


def test_fgd_strands_a_gpu_behind_exhausted_memory_and_kubecell_does_not() -> None:
    nodes, requests, typical, demand = memory_case()
    _, fgd_failed = replay(nodes, FragmentationGradientDescent(typical), requests)
    assert len(fgd_failed) == 1
    ours_book, ours_failed = replay(nodes, StrandingAwareFGD(demand), requests)
    assert ours_book.allocations["cache"].node == "b"
    assert ours_failed == []


def test_the_online_policy_learns_the_same_from_earlier_arrivals() -> None:
    """With no distribution given, all the policy knows is what it has seen arrive; after a history of
    8-vCPU GPU pods (observed, as a driver feeds it the pods it watches) it makes the same call."""
    nodes, requests, _ = cpu_case()
    policy = StrandingAwareFGD()
    for i in range(8):
        policy.observe(gpu_pod(f"history{i}"))
    book, failed = replay(nodes, policy, requests)
    assert book.allocations["cpu-job"].node == "b"
    assert failed == []


def test_the_online_policy_without_history_behaves_like_fgd_here() -> None:
    """Control for the test above: the first arrival is the CPU pod, so the estimate holds no GPU
    type yet, nothing looks stranded and the tie goes to node a, as with FGD."""
    nodes, requests, _ = cpu_case()
    book, failed = replay(nodes, StrandingAwareFGD(), requests)
    assert book.allocations["cpu-job"].node == "a"
    assert len(failed) == 1


def test_without_learned_demand_every_node_ties() -> None:
    book = AllocationBook(cpu_case()[0])
    policy = StrandingAwareFGD(demand=[])
    policy.attach(book)
    nodes = np.arange(book.size, dtype=np.int64)
    assert policy.score(book, gpu_pod("x"), nodes).tolist() == [50, 50]
    assert policy.score(book, gpu_pod("y", milli=300), nodes).tolist() == [50, 50]


# ------------------------------------------------------------------- the measure reduces to FGD's


def scarcity_shares(typical: list[TypicalPod], book: AllocationBook) -> list[TypicalPod]:
    """FGD's typical list re-weighted by hand as the docs define scarcity: share x cluster GPUs /
    GPUs of the allowed models, renormalised (CPU-only types keep their share)."""
    per_model = {m: int(book.gpu_present[book.model_id == i].sum()) for i, m in enumerate(book.model_names)}
    total = sum(per_model.values())
    raw = []
    for t in typical:
        allowed = t.shape.gpu_models
        eligible = sum(n for m, n in per_model.items() if allowed is None or m in allowed)
        raw.append(t.share * total / eligible if t.shape.gpu_milli > 0 and eligible > 0 else t.share)
    return [TypicalPod(t.shape, w / sum(raw)) for t, w in zip(typical, raw, strict=True)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(book=cluster_strategy(), typical=typical_strategy())
def test_without_host_terms_the_measure_is_fgd_with_scarcity_weights(book: AllocationBook,
                                                                     typical: list[TypicalPod]) -> None:
    model_gpus = [int(book.gpu_present[book.model_id == i].sum()) for i in range(len(book.model_names))]
    ours = HostAwareMeasure(demand_from_typical(typical), book.model_names, model_gpus, stranding_weight=0.0)
    fgd = FragmentationMeasure(scarcity_shares(typical, book), book.model_names)
    expected = fgd.node_fragmentation(book.cpu_free, book.gpu_avail, book.model_id)
    got = ours.node_fragmentation(book.cpu_free, book.mem_free, book.gpu_avail, book.model_id)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(book=cluster_strategy(), typical=typical_strategy())
def test_host_terms_only_add_fragment(book: AllocationBook, typical: list[TypicalPod]) -> None:
    """Stranding can only make a node look more fragmented, never less, and never above its free total."""
    model_gpus = [int(book.gpu_present[book.model_id == i].sum()) for i in range(len(book.model_names))]
    demand = demand_from_typical(typical)
    plain = HostAwareMeasure(demand, book.model_names, model_gpus, stranding_weight=0.0)
    full = HostAwareMeasure(demand, book.model_names, model_gpus, stranding_weight=1.0)
    args = (book.cpu_free, book.mem_free, book.gpu_avail, book.model_id)
    low, high = plain.node_fragmentation(*args), full.node_fragmentation(*args)
    assert np.all(high >= low - 1e-6)
    assert np.all(high <= book.gpu_avail.sum(axis=1) + 1e-6)


def test_stranded_share_by_hand() -> None:
    """One type (1 GPU, 8 vCPU); a node with 4 free GPUs and 12 vCPU feeds 1.5 GPUs: 2.5 GPUs of the
    4,000 free milli are stranded, counted at the stranding weight."""
    book = AllocationBook([make_node("n", cpu_milli=12_000, memory_mib=GIB, gpu_count=4, gpu_model="T4")])
    demand = [DemandType(PodShape(8000, 1000, 1), 1.0, 0)]
    for weight in (0.0, 0.5, 1.0):
        model_gpus = [int(book.gpu_present[book.model_id == i].sum()) for i in range(len(book.model_names))]
        measure = HostAwareMeasure(demand, book.model_names, model_gpus, stranding_weight=weight)
        value = measure.node_fragmentation(book.cpu_free, book.mem_free, book.gpu_avail, book.model_id)
        assert value[0] == pytest.approx(2500 * weight)


def test_scarce_models_weigh_more() -> None:
    """A T4-only type on a cluster where T4s are a quarter of the GPUs counts four times its share."""
    demand = [DemandType(PodShape(1000, 1000, 1), 0.5, 0), DemandType(PodShape(1000, 1000, 1, "T4"), 0.5, 0)]
    measure = HostAwareMeasure(demand, ("T4", "V100M32"), [2, 6])
    assert measure.weight.tolist() == pytest.approx([0.2, 0.8])


@pytest.mark.parametrize("weight", [-0.1, 1.5])
def test_stranding_weight_out_of_range(weight: float) -> None:
    with pytest.raises(InvalidInputError, match="stranding weight"):
        HostAwareMeasure([], ("T4",), [1], stranding_weight=weight)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"refresh_distance": 1.5}, "refresh distance"),
    ({"check_every": 0}, "check interval"),
    ({"half_life": 0}, "half-life"),
])
def test_policy_parameters_are_checked(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        StrandingAwareFGD(**kwargs)  # type: ignore[arg-type]


def test_registered_as_kubecell_and_online() -> None:
    policy = make_policy("KubeCell")
    assert isinstance(policy, StrandingAwareFGD)
    assert policy.model is not None  # learns online; the context's typical pods are not used


# ------------------------------------------------------------------- the online demand model


def test_demand_model_counts_shapes_and_mean_memory() -> None:
    model = DemandModel(half_life=None)
    for i in range(6):
        model.observe(gpu_pod(f"a{i}", cpu=4000, memory=(10 + i) * GIB, milli=500))
    for i in range(2):
        model.observe(Request(f"c{i}", cpu_milli=0, memory_mib=GIB))
    typical = model.typical()
    assert [t.shape for t in typical] == [PodShape(4000, 500, 1), PodShape(100, 0, 0)]
    assert [t.share for t in typical] == pytest.approx([0.75, 0.25])
    assert typical[0].memory_mib == round(12.5 * GIB)
    assert model.arrivals == 8


def test_demand_model_coverage_drops_the_rare_tail() -> None:
    model = DemandModel(half_life=None, coverage=0.9)
    for i in range(95):
        model.observe(gpu_pod(f"a{i}"))
    for i in range(5):
        model.observe(gpu_pod(f"b{i}", milli=250))
    assert [t.shape.gpu_milli for t in model.typical()] == [1000]


def test_demand_model_forgets_with_its_half_life() -> None:
    """After a workload change, the new shape dominates once a few half-lives have passed; without
    decay the old one would still hold half of the mass."""
    decayed, kept = DemandModel(half_life=100), DemandModel(half_life=None)
    for model in (decayed, kept):
        for i in range(1000):
            model.observe(gpu_pod(f"old{i}"))
        for i in range(1000):
            model.observe(gpu_pod(f"new{i}", milli=300))
    share = {m: {t.shape.gpu_milli: t.share for t in m.typical()} for m in (decayed, kept)}
    assert share[decayed][300] == pytest.approx(1.0)
    assert share[kept][300] == pytest.approx(0.5)


def test_demand_model_survives_rescaling() -> None:
    """Lazy decay grows the increment; rescaling must keep shares and memory means intact."""
    model = DemandModel(half_life=1.0)
    for i in range(400):
        model.observe(gpu_pod(f"a{i}", memory=GIB, milli=500 if i % 2 else 250))
    typical = {t.shape.gpu_milli: t for t in model.typical()}
    assert typical[500].share == pytest.approx(2 / 3, rel=1e-6)
    assert typical[500].memory_mib == GIB


def test_total_variation() -> None:
    a = [DemandType(PodShape(1, 1, 1), 0.5, 0), DemandType(PodShape(2, 2, 1), 0.5, 0)]
    b = [DemandType(PodShape(1, 1, 1), 1.0, 0)]
    assert total_variation(a, a) == 0
    assert total_variation(a, b) == pytest.approx(0.5)
    assert total_variation(b, [DemandType(PodShape(3, 3, 1), 1.0, 0)]) == pytest.approx(1.0)


def test_shape_of_uses_scoring_defaults_and_sorted_models() -> None:
    request = Request("x", gpu_count=1, gpu_milli=300, gpu_models=frozenset({"V100M32", "T4"}))
    assert shape_of(request) == PodShape(100, 300, 1, "T4|V100M32")


def test_refreshes_are_rare_on_a_steady_stream() -> None:
    """A distribution change invalidates every cached score, so a steady workload must settle: after
    the early doubling checks, a stream of one fixed mix triggers no more refreshes."""
    policy = StrandingAwareFGD()
    rng = np.random.default_rng(0)
    shapes = [gpu_pod("a"), gpu_pod("b", milli=500), Request("c", cpu_milli=4000)]
    for i in range(20_000):
        policy.observe(shapes[int(rng.integers(3))])
        if i == 5000:
            settled = policy.refreshes
    assert policy.refreshes == settled
    assert settled <= 14


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(book=cluster_strategy(), requests=st.lists(request_strategy(), min_size=1, max_size=6))
def test_every_decision_is_feasible_and_commits(book: AllocationBook, requests: list[Request]) -> None:
    """Whatever the cluster and the mix (shares by compute or by memory, whole GPUs, CPU-only, model
    constraints, unhealthy GPUs), the online policy places a request iff some node fits it, and the
    GPUs it picks take the request without breaking the book's invariants."""
    placer = Placer(book, StrandingAwareFGD())
    for i, request in enumerate(requests):
        request = Request(f"r{i}", cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                          gpu_count=request.gpu_count, gpu_milli=request.gpu_milli,
                          gpu_memory_mib=request.gpu_memory_mib, gpu_models=request.gpu_models)
        fits_somewhere = placer.feasible(request).size > 0
        placement = placer.place_and_commit(request)
        assert (placement is not None) == fits_somewhere
        book.check_invariants()
