"""The job model against values computed by hand from the tables: throughput interpolation, statistical
efficiency, batch-size rules, progress, restarts and completion."""

from __future__ import annotations

import pytest

from kubecell.sim.elastic.applications import ApplicationModel, Batch
from kubecell.sim.elastic.cluster import A100, RTX2080TI, T4
from kubecell.sim.elastic.job import SimJob
from kubecell.sim.elastic.profiles import load_application
from kubecell.sim.elastic.throughput import ThroughputModel, canonical, placement_id
from kubecell.sim.elastic.workload import WorkloadJob
from tests.sim.elastic.support import write_models

KINDS = (T4, RTX2080TI, A100)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> ApplicationModel:
    models = write_models(tmp_path_factory.mktemp("models"))
    return ApplicationModel(load_application(models, "cifar10", [k.profile for k in KINDS]), KINDS)


@pytest.fixture(scope="module")
def t4(app: ApplicationModel) -> ThroughputModel:
    return app.throughput["t4"]


@pytest.mark.parametrize(("placement", "key"), [
    ((4, 2, 4), "244"), ((2, 4, 4), "244"), ((4, 4, 2), "244"), ((0, 3, 0, 1), "13"), ((2, 1, 3, 1), "1213"),
    ((), ""), ((1,), "1")])
def test_placement_key_is_the_smallest_rotation(placement: tuple[int, ...], key: str) -> None:
    assert placement_id(placement) == key
    assert "".join(map(str, canonical(placement))) == key


THROUGHPUT_CASES = [
    # placement, per-replica batch, (step, sync) by hand from tests/sim/elastic/support.py
    ((1,), 32, (0.1, 0.0)),                 # measured point
    ((1,), 48, (0.15, 0.0)),                # measured placement: linear in the batch
    ((1, 1), 48, (0.25, 0.1)),              # "11"
    ((4, 4, 4), 48, (0.65, 0.5)),           # scalability point (3, 12), linear in the batch
    ((2, 2, 2), 32, (0.3, 0.2)),            # scalability point (3, 6)
    ((1, 4, 4), 32, (0.45, 0.35)),          # 3 nodes, 9 replicas: halfway between (3, 6) and (3, 12)
    ((2, 2, 2, 2), 32, (0.4, 0.3)),         # 4 nodes, 2 per node: halfway between (3, 6) and (5, 10)
    ((3, 3, 3, 3, 3), 32, (0.65, 0.55)),    # 5 nodes, 15 replicas: halfway between (5, 10) and (5, 20)
    ((1,), 100, None),                      # beyond the measured batches of a measured placement
    ((1,), 16, None),
    ((4, 4, 4, 4, 4, 4, 4), 32, None),      # 7 nodes: nothing measured at or above
]


@pytest.mark.parametrize(("placement", "bsz", "expected"), THROUGHPUT_CASES)
def test_throughput_interpolation(t4: ThroughputModel, placement: tuple[int, ...], bsz: int,
                                 expected: tuple[float, float] | None) -> None:
    got = t4.times(placement, bsz)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_largest_batch_that_fits(t4: ThroughputModel) -> None:
    assert t4.max_local_bsz_at((1,)) == 64
    assert t4.max_local_bsz_at((3, 3, 3, 3, 3)) == 32  # only (5, 20) is as large: measured to 32
    assert t4.max_local_bsz_for_replicas(2) == 64
    assert t4.max_local_bsz_for_replicas(3) is None


def test_application_limits_and_target(app: ApplicationModel) -> None:
    assert (app.init_bsz, app.max_bsz, app.epochs) == (32, 128, 2)
    assert app.epoch_end.tolist() == [100.0, 200.0]  # the smaller curve's progress at each epoch end
    assert app.target_progress == 200.0
    assert app.min_local_bsz == {"t4": 32, "rtx2080ti": 32, "a100": 32}
    assert app.max_replicas == 128 // 32
    assert (app.slowdown, app.restart_seconds) == (1.8, 50.0)


def test_gradient_statistics_and_efficiency(app: ApplicationModel) -> None:
    # B = 64 is a third of the way from 32 (var 3) to 128 (var 5): var = 3 + 2/3, sqr = 1
    sqr, var = app.grad_stats(64, 0)
    assert (sqr, var) == pytest.approx((1.0, 3 + 2 / 3))
    gain = (var + sqr) / (var / 2 + sqr)  # scale = 64 / 32
    assert app.gain(64, 0) == pytest.approx(gain)
    assert app.efficiency(64, 0) == pytest.approx(gain / 2)
    assert app.gain(32, 0) == pytest.approx(1.0)  # at the initial batch, one iteration is one unit of progress
    assert app.grad_stats(1000, 0) == app.grad_stats(128, 0)  # clamped into the validated range
    rate = app.progress_rate("t4", (2,), Batch(32, 0, 2), 0)
    assert rate is not None
    assert rate == pytest.approx(gain / 0.15 / 1.8)
    assert app.goodput("t4", (2,), Batch(32, 0, 2), 0) == pytest.approx(rate * 32)


BATCH_CASES = [
    # (how, placement, argument(s), expected Batch) -- Sia's update_local_bsz rules
    ("fixed", (2,), 128, Batch(64, 0, 2)),        # 64 per replica fits
    ("fixed", (1,), 128, Batch(64, 1, 1)),        # 128 does not fit one GPU: two micro-batches of 64
    ("fixed", (1,), 64, Batch(32, 1, 1)),         # one replica above the initial batch: at least 2 steps
    ("fixed", (1,), 32, Batch(32, 0, 1)),
    ("settle", (2,), (64, 1), Batch(32, 1, 2)),   # capped to the largest global batch, 128
    ("settle", (2,), (10, 0), Batch(32, 0, 2)),   # raised to the smallest measured micro-batch
    ("settle", (4, 4, 4), (32, 0), None),         # 12 x 32 > 128: no batch fits
    ("initial", (2,), None, Batch(32, 0, 2)),     # max(initial 32, 32 per replica x 2) = 64
]


@pytest.mark.parametrize(("how", "placement", "arg", "expected"), BATCH_CASES)
def test_batch_rules(app: ApplicationModel, how: str, placement: tuple[int, ...], arg: object,
                     expected: Batch | None) -> None:
    if how == "fixed":
        assert isinstance(arg, int)
        assert app.fixed_batch("t4", placement, arg) == expected
    elif how == "settle":
        assert isinstance(arg, tuple)
        assert app.settle("t4", placement, *arg) == expected
    else:
        assert app.initial_batch("t4", placement) == expected


def job(app: ApplicationModel) -> SimJob:
    return SimJob(WorkloadJob("cifar10-0", 0.0, "cifar10", 2, 64), app)


def test_restart_delay_progress_and_completion_by_hand(app: ApplicationModel) -> None:
    j = job(app)
    assert j.reallocate(0.0, "t4", ("t4-0", "t4-0"), (2,))
    j.set_batch(Batch(32, 0, 2))
    gain0 = (3 + 2 / 3 + 1) / ((3 + 2 / 3) / 2 + 1)
    rate0 = gain0 / 0.15 / 1.8          # epoch 0: 100 units, 16.4 s -> 16 s (Sia rounds epochs to seconds)
    rate1 = (1 + 1) / (1 / 2 + 1) / 0.15 / 1.8  # epoch 1: var = sqr = 1 at both batches: 20.25 s -> 20 s
    j.advance(0.0, 30.0)
    assert j.restart_left == 20.0  # 50 s of restart, 30 s paid
    assert j.progress == 0.0
    j.advance(30.0, 30.0)           # 20 s of restart, then 10 s at rate0
    assert j.progress == pytest.approx(10 * rate0)
    j.advance(60.0, 60.0)
    assert j.done
    assert j.completion == pytest.approx(50 + round(100 / rate0) + round(100 / rate1))
    assert j.completion == pytest.approx(86.0)
    assert j.gpu_seconds == 2 * 120.0   # held for every round it was given
    assert j.restart_gpu_seconds == 2 * 50.0
    assert j.restarts == 0              # a first start is not a restart


def test_restarts_count_changes_not_reorderings(app: ApplicationModel) -> None:
    j = job(app)
    j.reallocate(0.0, "t4", ("t4-0", "t4-1"), (1, 1))
    assert not j.reallocate(60.0, "t4", ("t4-1", "t4-0"), (1, 1))  # the same GPUs listed in another order
    assert j.reallocate(120.0, None, (), ())                        # suspended: no restart yet
    assert (j.restarts, j.running, j.last_resize) == (0, False, 120.0)
    assert j.reallocate(180.0, "a100", ("a100-0",), (1,))           # resumed elsewhere: a restart
    assert (j.restarts, j.restart_left, j.first_start) == (1, 50.0, 0.0)
