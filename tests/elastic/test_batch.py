"""The job side of the adaptive batch (``kubecell.elastic.batch``): a job trains at the batch the scheduler's
goodput model priced for its placement, grows its batch only when its gradients are noisy enough to use it,
keeps what it learned across torchrun's restarts (the checkpoint), and never lets a bad checkpoint or
environment stop training."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.types import StepReport
from kubecell.core.errors import InvalidInputError
from kubecell.elastic.batch import BatchAdvisor

GPU = "A100"


def step_seconds(replicas: int, local: int) -> tuple[float, float]:
    """A data-parallel job's step on one node: 2 ms of compute per example, a 40 ms all-reduce."""
    sync = 0.04 if replicas > 1 else 0.0
    return 0.01 + 0.002 * local + sync, sync


def feed(advisor: BatchAdvisor, steps: int, *, noise: float, local: int | None = None) -> None:
    """``steps`` measured steps at the advisor's own advice (or at ``local``), gradient noise ratio ``noise``."""
    for _ in range(steps):
        chosen = advisor.batch()
        size = local or chosen.local_batch
        step, sync = step_seconds(advisor.replicas, size)
        assert advisor.observe(step_seconds=step, sync_seconds=sync, local_batch=size,
                               accumulation_steps=1 if local else chosen.accumulation_steps,
                               grad_sqr=1.0, grad_var=noise)


def test_before_any_measurement_the_initial_batch_is_split_over_the_world() -> None:
    advisor = BatchAdvisor(min_batch=96, max_batch=768, max_local_batch=64, replicas=3, gpu_type=GPU)
    chosen = advisor.batch()
    assert (chosen.local_batch, chosen.accumulation_steps, chosen.global_batch) == (32, 1, 96)
    assert chosen.lr_scale == 1.0
    assert "no measurements yet" in chosen.reason
    one = BatchAdvisor(min_batch=96, max_batch=768, max_local_batch=40, replicas=1, gpu_type=GPU).batch()
    assert (one.local_batch, one.accumulation_steps) == (32, 3), "beyond what fits, it accumulates"


def test_noisy_gradients_buy_a_larger_batch_and_a_larger_learning_rate() -> None:
    quiet = BatchAdvisor(min_batch=64, max_batch=1024, max_local_batch=512, replicas=4, gpu_type=GPU)
    noisy = BatchAdvisor(min_batch=64, max_batch=1024, max_local_batch=512, replicas=4, gpu_type=GPU)
    feed(quiet, 30, noise=0.01)
    feed(noisy, 30, noise=200.0)
    calm, busy = quiet.batch(), noisy.batch()
    assert calm.global_batch == 64, "a gradient without noise gains nothing from a larger batch"
    assert calm.lr_scale == pytest.approx(1.0, abs=0.01)
    assert busy.global_batch > 4 * 64, busy
    assert 1.0 < busy.lr_scale <= busy.global_batch / 64
    assert "best goodput" in busy.reason


def test_it_trains_at_the_batch_the_scheduler_priced() -> None:
    """The scheduler's model of the job (built as the sizer builds it, from the same reports) and the job's
    advisor choose the same batch on every placement: the goodput the scheduler sized the job by is the
    goodput the job gets."""
    advisor = BatchAdvisor(min_batch=64, max_batch=2048, max_local_batch=2048, replicas=2, gpu_type=GPU)
    scheduler = OnlineGoodput(initial_bsz=64, max_bsz=2048)
    for noise in (5.0, 40.0, 120.0):
        for _ in range(12):
            chosen = advisor.batch()
            step, sync = step_seconds(2, chosen.local_batch)
            advisor.observe(step_seconds=step, sync_seconds=sync, local_batch=chosen.local_batch,
                            accumulation_steps=chosen.accumulation_steps, grad_sqr=1.0, grad_var=noise)
            # what the sizer reads of the report the same step wrote (``kube.step_reports``)
            scheduler.observe(StepReport(GPU, 1, 2, chosen.local_batch, step, sync, 1.0, noise),
                              accumulation_steps=chosen.accumulation_steps)
        restarted = BatchAdvisor(min_batch=64, max_batch=2048, max_local_batch=2048, replicas=2, gpu_type=GPU,
                                 state=json.loads(json.dumps(advisor.state_dict())))
        for replicas in (2, 4, 8):
            moved = BatchAdvisor(min_batch=64, max_batch=2048, max_local_batch=2048, replicas=replicas,
                                 gpu_type=GPU, state=restarted.state_dict())
            chosen = moved.batch()
            assert scheduler.best_batch(GPU, 1, replicas) == (chosen.local_batch, chosen.accumulation_steps), \
                (noise, replicas)


def test_what_it_learned_survives_a_restart_in_another_world() -> None:
    first = BatchAdvisor(min_batch=64, max_batch=1024, max_local_batch=512, replicas=2, gpu_type=GPU)
    feed(first, 20, noise=150.0)
    saved = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    grown = BatchAdvisor(min_batch=64, max_batch=1024, max_local_batch=512, replicas=4, gpu_type=GPU, state=saved)
    afresh = BatchAdvisor(min_batch=64, max_batch=1024, max_local_batch=512, replicas=4, gpu_type=GPU)
    assert grown.batch().global_batch > afresh.batch().global_batch == 64
    assert grown.model.gpu_types == frozenset({GPU})


@pytest.mark.parametrize("state", [
    "not a mapping", {"v": 2, "min": 64, "max": 1024, "reports": []}, {"v": 1, "min": 32, "max": 1024, "reports": []},
    {"v": 1, "min": 64, "max": 1024, "reports": "[]"}, {"v": 1, "min": 64, "max": 1024, "reports": [[1, 2, 3]]},
    {"v": 1, "min": 64, "max": 1024, "reports": [["A100", 1, 2, 32, float("nan"), 0.01, None, None, 1]]},
    {"v": 1, "min": 64, "max": 1024, "reports": [["A100", 1, 2, 32, 0.1, 0.01, "x", None, 1]]},
    {"v": 1, "min": 64, "max": 1024, "reports": [["A100", 1, 2, 32, 0.1, 0.01, None, None, 0]]},
    {"v": 1, "min": 64, "max": 1024, "reports": [["A100", 1, 2, 32, 0.1, 0.01, None, None]]},
])
def test_a_state_it_cannot_trust_is_dropped_and_it_learns_afresh(state: Any, caplog: pytest.LogCaptureFixture) -> None:
    advisor = BatchAdvisor(min_batch=64, max_batch=1024, max_local_batch=512, replicas=2, gpu_type=GPU, state=state)
    assert advisor.state_dict()["reports"] == []
    assert advisor.batch().global_batch == 64
    assert "learns afresh" in caplog.text


def test_a_saved_measurement_the_model_refuses_is_skipped_alone() -> None:
    good = [GPU, 1, 2, 32, 0.1, 0.04, 1.0, 50.0, 1]
    refused = [GPU, 3, 2, 32, 0.1, 0.04, 1.0, 50.0, 1]  # more nodes than replicas
    advisor = BatchAdvisor(min_batch=64, max_batch=1024, max_local_batch=512, replicas=2, gpu_type=GPU,
                           state={"v": 1, "min": 64, "max": 1024, "reports": [good, refused, good]})
    assert advisor.state_dict()["reports"] == [good, good]


@pytest.mark.parametrize(("step", "sync", "local", "accumulation"), [
    (0.0, 0.0, 32, 1), (-1.0, 0.0, 32, 1), (float("nan"), 0.01, 32, 1), (1e30, 0.01, 32, 1), (0.1, 0.2, 32, 1),
    (0.1, 0.01, 0, 1), (0.1, 0.01, 32, 0), (0.1, 0.01, 32.5, 1), ("fast", 0.01, 32, 1), (0.1, 0.01, 32, True),
])
def test_a_measurement_that_is_not_one_is_refused_and_changes_nothing(step: Any, sync: Any, local: Any,
                                                                     accumulation: Any) -> None:
    advisor = BatchAdvisor(min_batch=64, max_batch=1024, max_local_batch=512, replicas=2, gpu_type=GPU)
    assert not advisor.observe(step_seconds=step, sync_seconds=sync, local_batch=local,
                               accumulation_steps=accumulation)
    assert advisor.state_dict()["reports"] == []


def test_the_environment_gives_the_bounds_and_the_world(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KUBECELL_BATCH_SIZE_MIN", "96")
    monkeypatch.setenv("KUBECELL_BATCH_SIZE_MAX", "960")
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    advisor = BatchAdvisor.from_environment(default_batch=128, max_local_batch=64)
    assert (advisor.min_batch, advisor.max_batch, advisor.replicas, advisor.nodes) == (96, 960, 6, 3)
    monkeypatch.setenv("KUBECELL_BATCH_SIZE_MIN", "2000")  # above the maximum: not a range
    fixed = BatchAdvisor.from_environment(default_batch=128, max_local_batch=64)
    assert (fixed.min_batch, fixed.max_batch) == (128, 128)
    assert "not a batch range" in caplog.text
    monkeypatch.delenv("KUBECELL_BATCH_SIZE_MIN")
    monkeypatch.delenv("KUBECELL_BATCH_SIZE_MAX")
    monkeypatch.delenv("WORLD_SIZE")
    plain = BatchAdvisor.from_environment(default_batch=128, max_local_batch=64)
    assert (plain.min_batch, plain.max_batch, plain.replicas) == (128, 128, 1)


@pytest.mark.parametrize("bounds", [{"min_batch": 0}, {"min_batch": 2048}, {"max_local_batch": -1},
                                    {"replicas": 2, "nodes": 3}, {"gpu_type": ""}, {"min_batch": 64.0},
                                    {"max_batch": 2**31}])  # one past the CRD's maximum (2**31 - 1)
def test_the_scripts_own_bad_arguments_are_named(bounds: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"min_batch": 64, "max_batch": 1024, "max_local_batch": 512, **bounds}
    with pytest.raises(InvalidInputError):
        BatchAdvisor(**arguments)


def test_an_accumulated_step_places_its_gradient_noise_at_the_whole_global_batch() -> None:
    """A step of 4 accumulated micro-batches of 32 on 2 replicas measured its noise at a global batch of 256, not
    64: told so, the model (the advisor's and the scheduler's alike) learns a different noise curve."""
    told, untold = (OnlineGoodput(initial_bsz=64, max_bsz=1024) for _ in range(2))
    for _ in range(10):
        report = StepReport(GPU, 1, 2, 32, 0.3, 0.04, 1.0, 60.0)
        told.observe(report, accumulation_steps=4)
        untold.observe(report)
    assert told.efficiency(512) != pytest.approx(untold.efficiency(512), rel=1e-3)


@settings(max_examples=60, deadline=None)
@given(low=st.integers(1, 512), span=st.integers(1, 64), max_local=st.integers(1, 1024), replicas=st.integers(1, 64),
       steps=st.lists(st.tuples(st.floats(1e-4, 10.0), st.floats(0.0, 0.99), st.integers(1, 2048),
                                st.integers(1, 8), st.floats(0.0, 1e3), st.floats(0.0, 1e6)), max_size=12))
def test_the_advice_is_always_within_the_bounds(low: int, span: int, max_local: int, replicas: int,
                                                steps: list[tuple[float, float, int, int, float, float]]) -> None:
    """Whatever it measured: a micro-batch within memory, a global batch within the job's range (or one example
    per replica where the range is smaller than the world), a learning-rate gain between 1 and the batch ratio."""
    high = low * span
    advisor = BatchAdvisor(min_batch=low, max_batch=high, max_local_batch=max_local, replicas=replicas,
                           nodes=1, gpu_type=GPU)
    for step, sync_share, local, accumulation, sqr, var in steps:
        advisor.observe(step_seconds=step, sync_seconds=step * sync_share if replicas > 1 else 0.0,
                        local_batch=local, accumulation_steps=accumulation, grad_sqr=sqr, grad_var=var)
        chosen = advisor.batch()
        assert 1 <= chosen.local_batch <= max_local
        assert chosen.global_batch == replicas * chosen.local_batch * chosen.accumulation_steps
        assert chosen.global_batch <= max(high, replicas * chosen.accumulation_steps), chosen
        fits = -(-low // replicas) * replicas <= high and -(-low // replicas) <= max_local
        if fits:  # an equal share in one micro-batch reaches the range: the advice is in it
            assert low <= chosen.global_batch <= high, chosen
        assert 1.0 <= chosen.lr_scale <= max(1.0, chosen.global_batch / low) + 1e-9
