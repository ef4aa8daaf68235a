"""The online demand model: what the kubecell policy knows about the workload, learned from arrivals."""

from __future__ import annotations

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Request
from kubecell.core.placement.demand import LOOPED_ARRIVALS, DemandModel, DemandType, shape_of, total_variation
from kubecell.core.placement.frag import PodShape
from tests.core.support import engine, make_nodes, whole

GIB = 1024


def gpu_pod(name: str, *, cpu: int = 8000, memory: int = 0, milli: int = 1000) -> Request:
    return Request(name, cpu_milli=cpu, memory_mib=memory, gpu_count=1, gpu_milli=milli)


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


@pytest.mark.parametrize(("kwargs", "match"), [({"half_life": 0}, "half-life"), ({"coverage": 1.5}, "coverage")])
def test_demand_model_parameters_are_checked(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        DemandModel(**kwargs)


def test_total_variation() -> None:
    a = [DemandType(PodShape(1, 1, 1), 0.5, 0), DemandType(PodShape(2, 2, 1), 0.5, 0)]
    b = [DemandType(PodShape(1, 1, 1), 1.0, 0)]
    assert total_variation(a, a) == 0
    assert total_variation(a, b) == pytest.approx(0.5)
    assert total_variation(b, [DemandType(PodShape(3, 3, 1), 1.0, 0)]) == pytest.approx(1.0)


def test_shape_of_uses_scoring_defaults_and_sorted_models() -> None:
    request = Request("x", gpu_count=1, gpu_milli=300, gpu_models=frozenset({"V100M32", "T4"}))
    assert shape_of(request) == PodShape(100, 300, 1, "T4|V100M32")


def test_a_gang_of_arrivals_weighs_exactly_as_the_same_arrivals_one_by_one() -> None:
    one_by_one, together = DemandModel(half_life=7.0), DemandModel(half_life=7.0)
    small, big = Request("s", cpu_milli=1000, memory_mib=100, gpu_count=1, gpu_milli=250), \
        Request("b", cpu_milli=8000, memory_mib=900, gpu_count=2, gpu_milli=1000)
    for request, count in ((small, 3), (big, 40), (small, 1), (big, 5)):
        for _ in range(count):
            one_by_one.observe(request)
        together.observe(request, count)
    assert together.arrivals == one_by_one.arrivals == 49
    assert together.typical() == one_by_one.typical()


@pytest.mark.parametrize("half_life", [7.0, 10_000.0, None])
def test_a_gang_past_the_looped_arrivals_weighs_as_the_same_arrivals_one_by_one(half_life: float | None) -> None:
    """Past ``LOOPED_ARRIVALS`` a gang's arrivals are added in closed form (rescales included at a half-life of 7)."""
    one_by_one, together = DemandModel(half_life=half_life), DemandModel(half_life=half_life)
    small, big = Request("s", cpu_milli=1000, memory_mib=100, gpu_count=1, gpu_milli=250), \
        Request("b", cpu_milli=8000, memory_mib=900, gpu_count=2, gpu_milli=1000)
    for request, count in ((small, 30), (big, LOOPED_ARRIVALS + 977), (small, 12)):
        for _ in range(count):
            one_by_one.observe(request)
        together.observe(request, count)
    assert together.arrivals == one_by_one.arrivals
    got, want = together.typical(), one_by_one.typical()
    assert [t.shape for t in got] == [t.shape for t in want]
    assert [t.share for t in got] == pytest.approx([t.share for t in want], rel=1e-9)
    assert [t.memory_mib for t in got] == [t.memory_mib for t in want]


def test_a_headcount_of_millions_costs_no_loop_and_the_engine_counts_what_the_cluster_could_hold() -> None:
    """A one-pod gang stating ``group-max: 4194304`` took 0.8 s of the scheduling thread at each formation, and
    made every other shape vanish from what the placement policy learned."""
    model = DemandModel()
    model.observe(gpu_pod("huge"), 4_194_304)  # one step per arrival would take seconds
    assert model.arrivals == 4_194_304
    eng = engine(make_nodes(2), {"a": {"gpus": 16}})
    seen: list[int] = []
    eng.session.placer.policy.observe = lambda request, count=1: seen.append(count)  # type: ignore[method-assign]
    eng.submit(whole("g", "a", 1, members=4_194_304, min_members=1), 0)
    eng.submit(whole("s", "a", 4, members=3), 0)
    assert seen == [16, 3], "the gang counts as the 16 members the cluster could hold"
