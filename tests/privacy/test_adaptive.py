"""Adaptive clipping (Andrew et al. 2021): noise split, geometric update, tracking."""

from __future__ import annotations

import math

import pytest
import torch

from fedplat.privacy import (
    AdaptiveClip,
    PrivacyError,
    adaptive_noise_multiplier,
    make_noise_generator,
)


def test_noise_correction_by_hand() -> None:
    # z = 1, sigma_b = 1: z_Delta = (1 - 1/4)^-1/2 = 2 / sqrt(3).
    assert adaptive_noise_multiplier(1.0, 1.0) == pytest.approx(2 / math.sqrt(3))
    # The same split as a budget fraction c for the count (TensorFlow Privacy's
    # parametrisation): sigma_b = z / (2 sqrt(c)) gives z_Delta = z / sqrt(1 - c).
    z, c = 1.3, 0.1
    sb = z / (2 * math.sqrt(c))
    assert adaptive_noise_multiplier(z, sb) == pytest.approx(z / math.sqrt(1 - c))
    with pytest.raises(PrivacyError, match="too small"):
        adaptive_noise_multiplier(1.0, 0.5)  # 2 sigma_b = z: nothing left for the sum


def test_geometric_update_by_hand() -> None:
    ac = AdaptiveClip(initial_clip=2.0, expected_clients=10, count_noise_std=1e-12)
    assert ac.count_noise_std == pytest.approx(1e-12)
    assert AdaptiveClip(initial_clip=1.0, expected_clients=100).count_noise_std == 5.0
    g = make_noise_generator(0)
    # 8 of 10 unclipped: b_bar = (8 - 5) / 10 + 1/2 = 0.8 > gamma = 0.5: C shrinks.
    new = ac.update(8, 10, generator=g)
    assert new == pytest.approx(2.0 * math.exp(-0.2 * 0.3))
    # 2 of 10 unclipped: C grows by the same factor back.
    assert ac.update(2, 10, generator=g) == pytest.approx(2.0)


def test_clip_tracks_the_median_norm() -> None:
    # Update norms are lognormal with median e^0 = 1; start 20x too high.
    g = torch.Generator().manual_seed(0)
    noise = make_noise_generator(1)
    m = 100
    ac = AdaptiveClip(initial_clip=20.0, expected_clients=m)
    for _ in range(300):
        norms = torch.exp(torch.randn(m, generator=g) * 0.5)
        ac.update(int((norms <= ac.clip).sum()), m, generator=noise)
    assert 0.85 < ac.clip < 1.15


def test_state_round_trips_and_is_checked() -> None:
    a = AdaptiveClip(initial_clip=1.0, expected_clients=50, target_quantile=0.7)
    a.update(10, 50, generator=make_noise_generator(0))
    b = AdaptiveClip(initial_clip=1.0, expected_clients=50, target_quantile=0.7)
    b.load_state_dict(a.state_dict())
    assert b.clip == a.clip != 1.0
    other = AdaptiveClip(initial_clip=1.0, expected_clients=50)
    with pytest.raises(PrivacyError, match="target_quantile"):
        other.load_state_dict(a.state_dict())
    with pytest.raises(PrivacyError, match="keys"):
        other.load_state_dict({"clip": 1.0})
    with pytest.raises(PrivacyError, match="unclipped"):
        a.update(11, 10, generator=make_noise_generator(0))
