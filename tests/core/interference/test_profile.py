"""Solo profiles and shared runs refuse values a profiler can produce by mistake, naming the job and field."""

from __future__ import annotations

import math

import pytest

from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.interference import InvalidProfileError, JobKey, SharedRun, SoloProfile, UnknownJobError


@pytest.mark.parametrize(("field", "value", "words"), [
    ("gpu_util", math.nan, "finite"),
    ("gpu_util", -1.0, "negative"),
    ("gpu_util", 100.5, "at most 100"),
    ("gmem_util", math.inf, "finite"),
    ("gmem_util", 250.0, "at most 100"),
    ("memory_mib", -5.0, "negative"),
])
def test_bad_values_name_the_job_and_the_field(field: str, value: float, words: str) -> None:
    values = {"gpu_util": 50.0, "gmem_util": 20.0, "memory_mib": 2000.0, field: value}
    with pytest.raises(InvalidProfileError) as caught:
        SoloProfile(JobKey("ResNet18", "CIFAR-10", 64, True), **values)
    assert isinstance(caught.value, KubecellError)
    text = str(caught.value)
    assert "ResNet18/CIFAR-10/bs64/amp" in text
    assert f"field '{field}'" in text
    assert words in text


def test_a_fraction_instead_of_a_percentage_is_accepted_but_a_bool_is_not() -> None:
    assert SoloProfile(JobKey("a"), 0.5, 0.2, 10.0).busy == pytest.approx(0.005)
    with pytest.raises(InvalidProfileError, match="must be a number"):
        SoloProfile(JobKey("a"), True, 0.2, 10.0)


def test_shared_runs_need_two_jobs_and_one_positive_speed_each() -> None:
    a, b = JobKey("a"), JobKey("b")
    with pytest.raises(InvalidProfileError, match="at least two jobs"):
        SharedRun((a,), (1.0,))
    with pytest.raises(InvalidProfileError, match="2 jobs but 1 speeds"):
        SharedRun((a, b), (1.0,))
    with pytest.raises(InvalidProfileError, match=r"field 'speed2'.*above 0"):
        SharedRun((a, b), (1.0, 0.0))
    with pytest.raises(InvalidProfileError, match=r"field 'speed1'.*finite"):
        SharedRun((a, b), (math.nan, 1.0))


def test_a_run_of_a_job_without_a_profile_is_refused() -> None:
    run = SharedRun((JobKey("a"), JobKey("b")), (0.9, 0.8))
    solos = {JobKey("a"): SoloProfile(JobKey("a"), 10.0, 1.0, 100.0)}
    with pytest.raises(UnknownJobError, match="no solo profile for b") as caught:
        run.profiles(solos)
    assert isinstance(caught.value, InvalidInputError)
    assert run.worst_speed() == 0.8


def test_the_reading_shortfall_compares_the_gpu_reading_with_one_job_at_a_time() -> None:
    """Two jobs busy 30 % and 40 % alone, running at 1.0 and 0.5 beside each other: one job at a time with the
    same GPU time per step would read 30 + 20 = 50 %; a reading of 40 % falls short by 0.8. Past 100 % the
    expectation is capped: two saturating jobs that read 100 % fall short of nothing."""
    a, b = JobKey("a"), JobKey("b")
    solos = {a: SoloProfile(a, 30.0, 5.0, 100.0), b: SoloProfile(b, 40.0, 5.0, 100.0)}
    assert SharedRun((a, b), (1.0, 0.5), gpu_util=40.0).reading_shortfall(solos) == pytest.approx(0.8)
    assert SharedRun((a, b), (1.0, 0.5)).reading_shortfall(solos) is None
    busy = {a: SoloProfile(a, 90.0, 5.0, 100.0), b: SoloProfile(b, 95.0, 5.0, 100.0)}
    assert SharedRun((a, b), (0.6, 0.6), gpu_util=100.0).reading_shortfall(busy) == pytest.approx(1.0)
    idle = {a: SoloProfile(a, 0.0, 0.0, 100.0), b: SoloProfile(b, 0.0, 0.0, 100.0)}
    assert SharedRun((a, b), (1.0, 1.0), gpu_util=3.0).reading_shortfall(idle) is None
    with pytest.raises(InvalidProfileError, match="gpu_util"):
        SharedRun((a, b), (1.0, 1.0), gpu_util=120.0)
