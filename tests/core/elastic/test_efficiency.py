"""Pollux's statistical efficiency and the smoothed gradient noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kubecell.core.elastic.efficiency import PHI_MAX, GradientNoise, efficiency


@pytest.mark.parametrize(
    ("batch", "phi", "expected"),
    [
        (128, 20.0, 1.0),  # at the initial batch
        (256, 20.0, 21.0 / 22.0),  # (phi + 1) / (phi + 2)
        (1280, 20.0, 21.0 / 30.0),
        (1280, 0.0, 0.1),  # no noise: ten times the batch, a tenth of the worth per example
        (1280, None, 0.1),  # unknown noise is read as none
        (256, [20.0], 21.0 / 22.0),  # one phi per batch size
        (64, 20.0, 1.0),  # below the initial batch: capped at 1
        (12800, 1e12, 1.0),  # huge noise: every example counts (phi capped at PHI_MAX)
    ],
)
def test_efficiency_formula(batch: int, phi: float | list[float] | None, expected: float) -> None:
    assert float(np.ravel(efficiency(batch, 128, phi))[0]) == pytest.approx(expected, rel=1e-6)


def test_efficiency_matches_pollux_gain_over_scale() -> None:
    sqr, var, m0, m = 0.5, 7.0, 128, 1024
    scale = m / m0
    gain = (var + sqr) / (var / scale + sqr)
    assert float(efficiency(m, m0, var / sqr)) == pytest.approx(gain / scale)


def test_noise_at_one_batch_is_smoothed_and_flat() -> None:
    noise = GradientNoise(smoothing=0.9)
    assert noise.phi_at(128) is None
    assert not noise.known
    noise.update(1.0, 10.0, global_bsz=128)
    assert noise.phi_at(128) == pytest.approx(10.0)  # one report: its own value, not a tenth of it
    assert noise.phi_at(4096) == pytest.approx(10.0)  # one batch size: the prior slope (0)
    noise.update(1.0, 30.0, global_bsz=128)
    assert 10.0 < noise.phi_at(128) < 30.0  # type: ignore[operator]
    # A weighted geometric mean: (0.09 * log 10 + 0.1 * log 30) / 0.19.
    assert noise.phi_at(128) == pytest.approx(math.exp((0.09 * math.log(10) + 0.1 * math.log(30)) / 0.19))


def test_noise_learns_how_phi_grows_with_the_batch() -> None:
    noise = GradientNoise(smoothing=0.9, slope_strength=1e-6)
    for _ in range(20):
        for batch in (128, 256, 512):
            noise.update(1.0, 2.0 * (batch / 128) ** 0.5, global_bsz=batch)
    assert noise.slope == pytest.approx(0.5, rel=1e-3)
    assert noise.phi_at(2048) == pytest.approx(8.0, rel=1e-3)
    many = noise.phi_many([128, 2048])
    assert many is not None
    assert many == pytest.approx([2.0, 8.0], rel=1e-3)


def test_slope_prior_applies_until_two_batches_are_seen() -> None:
    noise = GradientNoise(slope_prior=0.3)
    noise.update(1.0, 4.0, global_bsz=64)
    assert noise.slope == pytest.approx(0.3)
    assert noise.phi_at(128) == pytest.approx(4.0 * 2**0.3)


def test_vanishing_gradient_norm_caps_phi() -> None:
    noise = GradientNoise()
    noise.update(0.0, 5.0)
    assert noise.phi_at(1) == pytest.approx(PHI_MAX)


def test_smoothing_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        GradientNoise(smoothing=1.0)
    with pytest.raises(ValueError, match="slope_strength"):
        GradientNoise(slope_strength=0.0)


def test_prior_answers_until_the_first_report() -> None:
    assert GradientNoise().phi_at(64) is None
    noise = GradientNoise(slope_prior=0.5, prior_phi=2.0, prior_bsz=16)
    assert not noise.known
    assert noise.phi_at(16) == pytest.approx(2.0)
    assert noise.phi_at(64) == pytest.approx(4.0)
    noise.update(1.0, 10.0, global_bsz=16)
    assert noise.known
    assert noise.phi_at(16) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="prior_phi"):
        GradientNoise(prior_phi=0.0)
