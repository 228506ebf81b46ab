"""Poisson client sampling: seeded, independent per client, rate q on average."""

from __future__ import annotations

import pytest

from fedplat.privacy import PrivacyError, poisson_sample


def test_sampling_is_a_pure_function_of_seed_and_round() -> None:
    ids = range(1000)
    a = poisson_sample(ids, 0.1, seed=7, round=3)
    assert a == poisson_sample(reversed(ids), 0.1, seed=7, round=3)
    assert a != poisson_sample(ids, 0.1, seed=7, round=4)
    assert a != poisson_sample(ids, 0.1, seed=8, round=3)
    assert list(a) == sorted(a) and set(a) <= set(ids)


def test_a_clients_coin_does_not_depend_on_the_others() -> None:
    full = set(poisson_sample(range(500), 0.3, seed=1, round=0))
    part = set(poisson_sample(range(0, 500, 7), 0.3, seed=1, round=0))
    assert part == {c for c in full if c % 7 == 0}


def test_rate_is_q_on_average_and_edges() -> None:
    n, q = 20_000, 0.05
    k = len(poisson_sample(range(n), q, seed=0, round=0))
    sd = (n * q * (1 - q)) ** 0.5
    assert abs(k - n * q) < 5 * sd  # Binomial(n, q)
    assert poisson_sample(range(10), 1.0, seed=0, round=0) == tuple(range(10))
    assert poisson_sample([], 0.5, seed=0, round=0) == ()
    for bad in (0.0, 1.5):
        with pytest.raises(PrivacyError, match="rate"):
            poisson_sample(range(3), bad, seed=0, round=0)
    with pytest.raises(PrivacyError, match="seed"):
        poisson_sample(range(3), 0.5, seed=-1, round=0)
