"""The online goodput model: what it learns, what it refuses, the batch sizes it advises."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import pytest

from kubecell.core.elastic.goodput import OnlineGoodput, compact_shapes, goodput_table, speedup_table
from kubecell.core.elastic.throughput import examples_per_second
from kubecell.core.elastic.types import StepReport
from kubecell.core.errors import InvalidInputError
from tests.core.elastic.support import TRUE, TableGoodput, known_job, report, reports

GOOD = StepReport("a100", 1, 2, 64, 0.2, 0.02, grad_sqr=1.0, grad_var=10.0)

BAD_REPORTS = {
    "zero step": replace(GOOD, step_time=0.0),
    "negative step": replace(GOOD, step_time=-0.1),
    "NaN step": replace(GOOD, step_time=math.nan),
    "inf step": replace(GOOD, step_time=math.inf),
    "absurd step": replace(GOOD, step_time=1e30, sync_time=1.0),
    "zero sync with replicas": replace(GOOD, sync_time=0.0),
    "negative sync": replace(GOOD, sync_time=-0.01),
    "NaN sync": replace(GOOD, sync_time=math.nan),
    "sync above step": replace(GOOD, sync_time=0.3),
    "sync equal to step": replace(GOOD, sync_time=0.2),
    "no replicas": replace(GOOD, num_replicas=0),
    "more nodes than replicas": replace(GOOD, num_nodes=3),
    "no nodes": replace(GOOD, num_nodes=0),
    "zero local batch": replace(GOOD, local_bsz=0),
    "local batch above max_bsz": replace(GOOD, local_bsz=10**9),
    "float replicas": replace(GOOD, num_replicas=2.0),  # type: ignore[arg-type]
    "negative grad_sqr": replace(GOOD, grad_sqr=-1.0),
    "NaN grad_var": replace(GOOD, grad_var=math.nan),
    "inf grad_var": replace(GOOD, grad_var=math.inf),
    "empty gpu type": replace(GOOD, gpu_type=""),
    "string time": replace(GOOD, step_time="fast"),  # type: ignore[arg-type]
}


def fresh() -> OnlineGoodput:
    return OnlineGoodput(initial_bsz=128, max_bsz=4096, max_local_bsz={"a100": 256},
                         prior=[report(TRUE, "a100", 1, 1, b) for b in (32, 64, 128)])


@pytest.mark.parametrize("name", sorted(BAD_REPORTS))
def test_bad_reports_are_refused_and_change_nothing(name: str) -> None:
    model = fresh()
    before = (model.goodput("a100", 1, 4), model.best_batch("a100", 1, 4), model.noise.phi_at(128), model.gpu_types)
    assert model.observe(BAD_REPORTS[name]) is False
    assert model.last_refusal
    assert model.refused == 1
    after = (model.goodput("a100", 1, 4), model.best_batch("a100", 1, 4), model.noise.phi_at(128), model.gpu_types)
    assert after == before


def test_single_replica_may_report_zero_sync() -> None:
    assert fresh().observe(StepReport("t4", 1, 1, 32, 0.1, 0.0)) is True


def test_partial_gradient_statistics_keep_the_times() -> None:
    model = fresh()
    assert model.observe(replace(GOOD, grad_var=None)) is True
    assert not model.noise.known
    assert model.max_observed_replicas("a100") == 2


def test_goodput_is_zero_where_nothing_is_known_or_infeasible() -> None:
    model = fresh()
    assert model.goodput("t4", 1, 1) == 0.0
    assert model.best_batch("t4", 1, 1) is None
    assert model.goodput("a100", 2, 1) == 0.0  # more nodes than replicas
    assert model.goodput("a100", 0, 0) == 0.0
    assert model.goodput("a100", 1, 8192) == 0.0  # more replicas than max_bsz examples


def test_one_gpu_reports_price_at_most_explore_factor_gpus() -> None:
    model = OnlineGoodput(initial_bsz=128, max_bsz=4096, explore_factor=2.0,
                          prior=[report(TRUE, "a100", 1, 1, b) for b in (32, 64, 128)])  # 1-GPU reports only
    assert model.replica_limit("a100") == 2
    one, two = model.goodput("a100", 1, 1), model.goodput("a100", 1, 2)
    assert 0 < two < 2 * one
    assert model.goodput("a100", 1, 4) == 0.0
    assert model.goodput_many("a100", [(1, 2), (1, 4)])[1] == 0.0
    model.observe(report(TRUE, "a100", 1, 4, 32))
    assert model.goodput("a100", 1, 8) > 0  # it ran at 4: 8 is priced now
    assert model.goodput("a100", 2, 16) == 0.0
    assert model.replica_limit("t4") is None  # nothing reported there: goodput 0 anyway


def test_throughput_follows_the_fit() -> None:
    model = known_job({"a100": 1.0})
    params = model.params("a100")
    assert params is not None
    assert model.throughput("a100", 2, 8, 64) == pytest.approx(float(examples_per_second(TRUE, 2, 8, 64)), rel=1e-3)
    assert model.throughput("a100", 2, 8, 64, accum_steps=2) > model.throughput("a100", 2, 8, 64)
    assert model.throughput("a100", 2, 8, 0) == 0.0


def test_best_batch_respects_limits() -> None:
    model = OnlineGoodput(initial_bsz=100, max_bsz=1000, max_local_bsz={"a100": 48},
                          prior=reports(TRUE, "a100"))
    model.observe(report(TRUE, "a100", 1, 1, 32, grad=(1.0, 1e6)))  # very noisy: wants the largest batch
    for nodes, replicas in ((1, 1), (1, 3), (1, 8), (2, 16), (4, 32)):
        advice = model.best_batch("a100", nodes, replicas)
        assert advice is not None
        local, accum = advice
        assert 1 <= local <= 48
        assert accum >= 1
        assert replicas * local * accum <= 1000
        assert replicas * local * accum >= 100
    local, accum = model.best_batch("a100", 1, 4)  # type: ignore[misc]
    # Noise says "big batch" (it amortises the synchronisation), memory says "accumulate".
    assert 4 * local * accum > 900
    assert accum > 1


def test_a_stated_micro_batch_limit_is_priced_as_accumulation_there_only() -> None:
    model = OnlineGoodput(initial_bsz=100, max_bsz=1000, prior=reports(TRUE, "a100") + reports(TRUE, "t4"))
    model.observe(report(TRUE, "a100", 1, 1, 32, grad=(1.0, 1e6)))
    free_local, free_accum = model.best_batch("a100", 1, 2)  # type: ignore[misc]
    assert (free_local > 48, free_accum) == (True, 1), "unbounded: one large micro-batch"
    before = model.goodput("a100", 1, 2)
    model.limit_local_batch("a100", 48)
    local, accum = model.best_batch("a100", 1, 2)  # type: ignore[misc]
    assert local <= 48
    assert accum > 1
    assert model.goodput("a100", 1, 2) < before, "accumulating costs a pass per micro-batch"
    t4_local, _ = model.best_batch("t4", 1, 2)  # type: ignore[misc]
    assert t4_local > 48, "another GPU model keeps its own memory"
    with pytest.raises(InvalidInputError, match="max_local_bsz"):
        model.limit_local_batch("a100", 0)


def test_no_noise_keeps_the_initial_batch_and_noise_grows_it() -> None:
    quiet = known_job({"a100": 1.0}, phi=0.0)
    noisy = known_job({"a100": 1.0}, phi=1e4)
    q_local, q_accum = quiet.best_batch("a100", 1, 4)  # type: ignore[misc]
    n_local, n_accum = noisy.best_batch("a100", 1, 4)  # type: ignore[misc]
    assert 4 * q_local * q_accum <= 140
    assert 4 * n_local * n_accum > 1000
    assert noisy.goodput("a100", 1, 4) > quiet.goodput("a100", 1, 4)


def test_efficiency_uses_the_noise_at_that_batch() -> None:
    model = known_job({"a100": 1.0}, phi=20.0)  # measured at a global batch of 64
    assert model.efficiency(128) == pytest.approx(1.0)
    phi = 20.0 * (256 / 64) ** model.noise.slope_prior  # one batch seen: the prior slope
    assert model.noise.phi_at(256) == pytest.approx(phi)
    assert model.efficiency(256) == pytest.approx((phi + 1) / (phi + 2))


def test_goodput_scales_sublinearly_and_faster_type_is_faster() -> None:
    model = known_job({"t4": 1.0, "a100": 3.0})
    one = model.goodput("a100", 1, 1)
    assert model.goodput("t4", 1, 1) < one
    assert one < model.goodput("a100", 1, 8) < 8 * one


def test_refit_only_after_new_shapes_or_enough_reports() -> None:
    model = OnlineGoodput(initial_bsz=128, max_bsz=4096, refit_every=3, prior=[report(TRUE, "a100", 1, 1, 64)])
    first = model.params("a100")
    model.observe(report(TRUE, "a100", 1, 1, 64))
    model.observe(report(TRUE, "a100", 1, 1, 64))
    assert model.params("a100") is first  # two repeats: no refit yet
    model.observe(report(TRUE, "a100", 1, 1, 64))
    assert model.params("a100") is not first  # the third
    second = model.params("a100")
    model.observe(report(TRUE, "a100", 1, 4, 64))
    assert model.params("a100") is not second  # a new shape: at once


def test_answers_are_cached() -> None:
    model = known_job({"a100": 1.0, "t4": 0.5})
    model.goodput("a100", 1, 4)
    start = time.perf_counter()
    for _ in range(5000):
        model.goodput("a100", 1, 4)
    assert (time.perf_counter() - start) / 5000 < 2e-5


def test_goodput_many_matches_goodput() -> None:
    model = known_job({"a100": 1.0})
    shapes = compact_shapes([1, 2, 4, 8, 16, 24], 8)
    assert shapes == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 16), (3, 24)]
    bulk = model.goodput_many("a100", shapes)
    other = known_job({"a100": 1.0})
    assert bulk == pytest.approx([other.goodput("a100", n, r) for n, r in shapes])
    assert goodput_table(model, "a100", [1, 2, 4], 8) == pytest.approx(bulk[:3])


def test_tables_for_plain_estimates() -> None:
    estimate = TableGoodput({"t4": 1.0, "a100": 2.0}, exponent=1.0)
    assert goodput_table(estimate, "a100", [1, 2, 16], 8) == pytest.approx([2.0, 4.0, 28.8])
    tables = speedup_table(estimate, {"t4": 4, "a100": 8}, [1, 2])
    assert tables["a100"] == pytest.approx([1.0, 2.0])
    assert tables["t4"] == pytest.approx([0.5, 1.0])
    assert np.all(speedup_table(TableGoodput({}), {"t4": 4}, [1, 2])["t4"] == 0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial_bsz": 0, "max_bsz": 10}, "initial_bsz"),
        ({"initial_bsz": 64, "max_bsz": 32}, "max_bsz"),
        ({"initial_bsz": 64, "max_bsz": 128, "max_local_bsz": {"t4": 0}}, "max_local_bsz"),
    ],
)
def test_invalid_construction_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInputError) as error:
        OnlineGoodput(**kwargs)  # type: ignore[arg-type]
    assert error.value.field == field


def test_noise_prior_prices_larger_batches_before_any_statistics() -> None:
    seeds = reports(TRUE, "a100", shapes=((1, 1),))
    plain = OnlineGoodput(initial_bsz=128, max_bsz=4096, prior=seeds)
    hopeful = OnlineGoodput(initial_bsz=128, max_bsz=4096, prior=seeds, noise_prior=1.0)
    assert plain.efficiency(256) == pytest.approx(0.5)
    assert hopeful.efficiency(256) == pytest.approx(2.0 / (1.0 + 2.0), rel=0.1)
    assert hopeful.goodput("a100", 1, 4) >= plain.goodput("a100", 1, 4)
    noisy = OnlineGoodput(initial_bsz=128, max_bsz=4096, prior=seeds, noise_prior=1e4)
    local, accum = noisy.best_batch("a100", 1, 4)  # type: ignore[misc]
    assert 4 * local * accum > 1000
    assert noisy.goodput("a100", 1, 4) > plain.goodput("a100", 1, 4)
    with pytest.raises(InvalidInputError) as error:
        OnlineGoodput(initial_bsz=128, max_bsz=4096, noise_prior=-1.0)
    assert error.value.field == "noise_prior"
