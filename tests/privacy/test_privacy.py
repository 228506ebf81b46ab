"""Clipping, the Gaussian mechanism, and accounting through Opacus."""

from __future__ import annotations

import json

import pytest
import torch

from fedplat.compression import CountSketch, TopK
from fedplat.privacy import (
    GaussianMechanism,
    PrivacyAccountant,
    PrivacyError,
    clip_l2,
    clip_rows,
    make_noise_generator,
    noise_multiplier_for,
    privatize_payload,
)

EPS, DELTA, STEPS, RATE, CLIP = 4.0, 1e-5, 50, 1.0, 0.5


def test_clip_l2_bounds_the_norm_and_never_scales_up() -> None:
    v = torch.full((100,), 1.0)  # norm 10
    c = clip_l2(v, 2.0)
    assert c.clipped and c.norm == pytest.approx(10.0)
    assert float(c.vector.norm()) == pytest.approx(2.0, rel=1e-5)
    small = clip_l2(v, 20.0)
    assert not small.clipped and torch.equal(small.vector, v)
    with pytest.raises(PrivacyError, match="NaN"):
        clip_l2(torch.tensor([float("nan")]), 1.0)
    with pytest.raises(PrivacyError, match="max_norm"):
        clip_l2(v, 0.0)


def test_clip_rows_clips_each_client_separately() -> None:
    u = torch.stack([torch.full((4,), 3.0), torch.full((4,), 0.1)])  # norms 6, 0.2
    out = clip_rows(u, 1.0)
    torch.testing.assert_close(out.norms, torch.tensor([6.0, 0.2]))
    assert float(out.rows[0].norm()) == pytest.approx(1.0, rel=1e-5)
    torch.testing.assert_close(out.rows[1], u[1])


def test_noise_std_is_what_the_accountant_needs() -> None:
    sigma = noise_multiplier_for(EPS, DELTA, STEPS, RATE)
    mech = GaussianMechanism.calibrated(
        epsilon=EPS, delta=DELTA, steps=STEPS, sample_rate=RATE, clip_norm=CLIP
    )
    assert mech.noise_multiplier == sigma
    assert mech.std == pytest.approx(sigma * CLIP)
    # The noise actually drawn has that std.
    z = mech.noise(400_000, generator=make_noise_generator(0))
    assert float(z.std()) == pytest.approx(mech.std, rel=0.01)
    assert abs(float(z.mean())) < 0.01 * mech.std
    # Releasing STEPS times with this sigma spends at most (EPS, DELTA), and
    # only just (the library's binary search stops within 0.01 of the target).
    acc = PrivacyAccountant()
    for _ in range(STEPS):
        acc.step(noise_multiplier=mech.noise_multiplier, sample_rate=RATE)
    eps = acc.get_epsilon(DELTA)
    assert EPS - 0.011 <= eps <= EPS
    # A little less noise would overspend: sigma is tight.
    tighter = PrivacyAccountant()
    tighter.step(noise_multiplier=0.97 * sigma, sample_rate=RATE, num_steps=STEPS)
    assert tighter.get_epsilon(DELTA) > EPS


def test_calibration_for_subsampled_rounds() -> None:
    # (Large epsilon with subsampling is slow in Opacus's RDP series: one case.)
    eps = 1.0
    sigma = noise_multiplier_for(eps, DELTA, 200, 0.1)
    acc = PrivacyAccountant()
    acc.step(noise_multiplier=sigma, sample_rate=0.1, num_steps=200)
    assert eps - 0.011 <= acc.get_epsilon(DELTA) <= eps
    assert acc.steps == 200


def test_more_noise_spends_less() -> None:
    eps = []
    for sigma in (0.8, 1.5, 3.0):
        acc = PrivacyAccountant()
        acc.step(noise_multiplier=sigma, sample_rate=0.5, num_steps=20)
        eps.append(acc.get_epsilon(DELTA))
    assert eps[0] > eps[1] > eps[2] > 0


def test_accountant_state_is_json_and_continues() -> None:
    a = PrivacyAccountant()
    a.step(noise_multiplier=1.1, sample_rate=0.2, num_steps=30)
    a.step(noise_multiplier=2.0, sample_rate=0.2)
    state = json.loads(json.dumps(a.state_dict()))
    b = PrivacyAccountant()
    b.load_state_dict(state)
    assert b.get_epsilon(DELTA) == a.get_epsilon(DELTA)
    a.step(noise_multiplier=1.1, sample_rate=0.2)
    b.step(noise_multiplier=1.1, sample_rate=0.2)
    assert b.get_epsilon(DELTA) == a.get_epsilon(DELTA) and b.steps == 32
    assert PrivacyAccountant().get_epsilon(DELTA) == 0.0
    with pytest.raises(PrivacyError, match="'prv' accountant"):
        PrivacyAccountant().load_state_dict({"kind": "prv", "history": []})
    with pytest.raises(PrivacyError, match="bad accountant history"):
        PrivacyAccountant().load_state_dict({"kind": "rdp", "history": [[1.0, 2.0, 1]]})


def test_bad_privacy_parameters_are_rejected() -> None:
    with pytest.raises(PrivacyError, match="delta"):
        noise_multiplier_for(1.0, 0.0, 10, 1.0)
    with pytest.raises(PrivacyError, match="sample_rate"):
        noise_multiplier_for(1.0, 1e-5, 10, 0.0)
    with pytest.raises(PrivacyError, match="unknown accountant"):
        PrivacyAccountant("gdp")  # type: ignore[arg-type]
    with pytest.raises(PrivacyError, match="noise_multiplier"):
        GaussianMechanism(-1.0, 1.0)


def test_seeded_noise_is_reproducible_and_sensitivity_factor() -> None:
    mech = GaussianMechanism(1.3, 2.0)
    a = mech.add_noise(torch.zeros(10), generator=make_noise_generator(5))
    b = mech.add_noise(torch.zeros(10), generator=make_noise_generator(5))
    assert torch.equal(a, b)
    assert GaussianMechanism(1.3, 2.0, sensitivity_factor=2.0).std == pytest.approx(5.2)
    # Central DP on a mean of n clipped updates: noise std on the sum / n.
    mean_noise = mech.noise_for_mean(
        torch.zeros(200_000), 10, generator=make_noise_generator(1)
    )
    assert float(mean_noise.std()) == pytest.approx(mech.std / 10, rel=0.01)


def test_local_dp_on_a_sketch_payload() -> None:
    h = torch.randn(5000) * 10
    cs = CountSketch(rows=3, cols=200)
    p = cs.encode(h, round=1, seed=2)
    mech = GaussianMechanism(0.0, 1.0)  # no noise: only the clipping is visible
    clipped = privatize_payload(p, mech, generator=make_noise_generator(0))
    assert clipped.sketch == p.sketch
    assert float(clipped.values.norm()) == pytest.approx(1.0, rel=1e-4)
    noisy = privatize_payload(
        p, GaussianMechanism(2.0, 1.0), generator=make_noise_generator(0)
    )
    assert float((noisy.values - clipped.values).std()) == pytest.approx(2.0, rel=0.15)
    with pytest.raises(PrivacyError, match="sparse"):
        privatize_payload(
            TopK(0.01).encode(h, round=0, seed=0),
            mech,
            generator=make_noise_generator(0),
        )
