"""Accounting of the sampled Gaussian mechanism (q < 1) and the run's budget."""

from __future__ import annotations

import json
import math

import pytest

from fedplat.privacy import (
    RDP_ALPHAS,
    PrivacyAccountant,
    PrivacyBudget,
    PrivacyBudgetExceeded,
    PrivacyError,
    noise_multiplier_for,
)

DELTA = 1e-5


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Epsilon of one Gaussian release (sensitivity 1, std sigma), from the exact
    privacy profile of Balle & Wang (ICML 2018, Thm. 8), by bisection."""

    def delta_of(eps: float) -> float:
        a, b = 1 / (2 * sigma), eps * sigma
        return _phi(a - b) - math.exp(eps) * _phi(-a - b)

    lo, hi = 0.0, 50.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_one_release_matches_the_exact_gaussian_mechanism(sigma: float) -> None:
    exact = _exact_gaussian_epsilon(sigma, DELTA)  # 4.377 at sigma = 1
    prv, rdp = PrivacyAccountant("prv"), PrivacyAccountant("rdp")
    for acc in (prv, rdp):
        acc.step(noise_multiplier=sigma, sample_rate=1.0)
    assert prv.get_epsilon(DELTA) == pytest.approx(exact, rel=0.01)
    assert exact <= rdp.get_epsilon(DELTA) <= 1.15 * exact  # RDP: an upper bound


def test_subsampled_rounds_rdp_agrees_with_prv() -> None:
    # DP-FedAvg's regime: q = 0.05, 300 rounds. Two analyses of the same
    # Poisson-subsampled Gaussian in Opacus: PRV (numerically tight) and RDP.
    prv, rdp = PrivacyAccountant("prv"), PrivacyAccountant("rdp")
    for acc in (prv, rdp):
        acc.step(noise_multiplier=1.0, sample_rate=0.05, num_steps=300)
    e_prv, e_rdp = prv.get_epsilon(DELTA), rdp.get_epsilon(DELTA)
    assert e_prv <= e_rdp <= 1.15 * e_prv  # 5.81 vs 6.46
    # Sampling amplifies: all-clients rounds at the same sigma spend far more.
    full = PrivacyAccountant("rdp")
    full.step(noise_multiplier=1.0, sample_rate=1.0, num_steps=300)
    assert full.get_epsilon(DELTA) > 10 * e_rdp


def test_high_orders_tighten_small_epsilon_with_sampling() -> None:
    from opacus.accountants.analysis import rdp as analysis

    default = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    q, sigma, steps = 0.01, 5.0, 100
    rdp = analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=default)
    with pytest.warns(UserWarning, match="largest alpha"):
        eps_default, _ = analysis.get_privacy_spent(
            orders=default, rdp=rdp, delta=DELTA
        )
    acc = PrivacyAccountant("rdp")
    acc.step(noise_multiplier=sigma, sample_rate=q, num_steps=steps)
    assert max(RDP_ALPHAS) > 63
    assert acc.get_epsilon(DELTA) < 0.65 * eps_default  # 0.070 vs 0.116
    prv = PrivacyAccountant("prv")
    prv.step(noise_multiplier=sigma, sample_rate=q, num_steps=steps)
    assert acc.get_epsilon(DELTA) == pytest.approx(prv.get_epsilon(DELTA), rel=0.05)


def test_calibration_with_sampling_spends_the_target() -> None:
    sigma = noise_multiplier_for(4.0, DELTA, 300, 0.05)
    assert sigma == pytest.approx(1.30, abs=0.005)  # quoted in docs/privacy.md
    acc = PrivacyAccountant()
    acc.step(noise_multiplier=sigma, sample_rate=0.05, num_steps=300)
    assert 4.0 - 0.011 <= acc.get_epsilon(DELTA) <= 4.0


def test_budget_reports_each_round_and_refuses_to_overspend() -> None:
    # sigma 2, q 0.1: epsilon 0.526 after one round, 0.968 after 11, 1.001 after 12.
    budget = PrivacyBudget(1.0, DELTA)
    assert budget.spent == 0.0
    peek = budget.preview(noise_multiplier=2.0, sample_rate=0.1)
    assert budget.releases == 0 and peek.epsilon_round == peek.epsilon
    assert peek.epsilon == pytest.approx(0.526, abs=1e-3)
    rounds = []
    with pytest.raises(PrivacyBudgetExceeded, match="release 12 would spend"):
        for _ in range(20):
            rounds.append(budget.spend(noise_multiplier=2.0, sample_rate=0.1))
    assert len(rounds) == budget.releases == 11
    eps = [r.epsilon for r in rounds]
    assert eps == sorted(eps) and eps[-1] <= 1.0
    assert all(r.epsilon_round > 0 for r in rounds)
    assert budget.spent == pytest.approx(eps[-1])  # the refused round recorded nothing
    restored = PrivacyBudget(1.0, DELTA)
    restored.load_state_dict(json.loads(json.dumps(budget.state_dict())))
    assert restored.spent == budget.spent and restored.releases == budget.releases
    with pytest.raises(PrivacyError, match="budget"):
        PrivacyBudget(2.0, DELTA).load_state_dict(budget.state_dict())
    with pytest.raises(PrivacyError, match="epsilon budget"):
        PrivacyBudget(0.0, DELTA)
