"""DP-FedAvg: clipped running sum, noise once on the sum, fixed denominator qN."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.privacy import (
    ClippedSum,
    PrivacyError,
    dp_fedavg_release,
    expected_clients,
    make_noise_generator,
)


def test_clipped_sum_by_hand() -> None:
    acc = ClippedSum(2, 1.0)
    big = acc.add(torch.tensor([3.0, 4.0]))  # norm 5 -> (0.6, 0.8)
    small = acc.add(torch.tensor([0.3, 0.4]))  # norm 0.5, untouched
    assert big.clipped and not small.clipped
    torch.testing.assert_close(acc.sum, torch.tensor([0.9, 1.2], dtype=torch.float64))
    assert (acc.count, acc.unclipped) == (2, 1)
    with pytest.raises(PrivacyError, match=r"update \[2\]"):
        acc.add(torch.ones(3))


def test_release_divides_by_the_expected_count_not_the_real_one() -> None:
    total = torch.tensor([0.9, 1.2], dtype=torch.float64)
    q_n = expected_clients(20, 0.1)  # 2 expected clients
    assert q_n == pytest.approx(2.0)
    g = make_noise_generator(0)
    for count in (1, 2, 5):  # no noise: the estimate is sum / qN, whatever the count
        rel = dp_fedavg_release(
            total, count, expected=q_n, clip_norm=1.0, noise_multiplier=0.0, generator=g
        )
        torch.testing.assert_close(rel.mean, torch.tensor([0.45, 0.6]))
        assert rel.denominator == pytest.approx(2.0) and rel.count == count


def test_noise_is_z_times_s_on_the_sum() -> None:
    d, z, s, q_n = 200_000, 2.0, 0.5, 40.0
    rel = dp_fedavg_release(
        torch.zeros(d),
        40,
        expected=q_n,
        clip_norm=s,
        noise_multiplier=z,
        generator=make_noise_generator(1),
    )
    assert rel.noise_std == pytest.approx(z * s)
    # Std z S = 1 on the sum is 1 / qN on the released mean.
    assert float(rel.mean.std()) == pytest.approx(z * s / q_n, rel=0.01)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.floats(-100, 100), min_size=4, max_size=4), min_size=1, max_size=6
    ),
    clip=st.floats(0.1, 10.0),
)
def test_one_client_moves_the_sum_by_at_most_s(
    rows: list[list[float]], clip: float
) -> None:
    without = ClippedSum(4, clip)
    for r in rows[:-1]:
        without.add(torch.tensor(r))
    with_ = ClippedSum(4, clip)
    for r in rows:
        with_.add(torch.tensor(r))
    moved = float(torch.linalg.vector_norm(with_.sum - without.sum))
    assert moved <= clip * (1 + 1e-5)


def test_bad_release_inputs() -> None:
    g = make_noise_generator(0)
    with pytest.raises(PrivacyError, match="expected"):
        dp_fedavg_release(
            torch.zeros(3),
            1,
            expected=0.0,
            clip_norm=1.0,
            noise_multiplier=1.0,
            generator=g,
        )
    with pytest.raises(PrivacyError, match="flat"):
        dp_fedavg_release(
            torch.zeros(2, 2),
            1,
            expected=1.0,
            clip_norm=1.0,
            noise_multiplier=1.0,
            generator=g,
        )
    with pytest.raises(PrivacyError, match="num_clients"):
        expected_clients(0, 0.5)
