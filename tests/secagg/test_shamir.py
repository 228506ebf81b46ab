"""Shamir secret sharing: hand-checked polynomials, any t of n, corrupted shares."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.secagg.errors import SecAggError
from fedplat.secagg.shamir import (
    PRIME,
    SHARE_BYTES,
    interpolate_at_zero,
    reconstruct,
    reconstruct_checked,
    secret_to_bytes,
    share_from_bytes,
    share_to_bytes,
    split,
)


def _fixed(coeffs: list[int]) -> Callable[[int], int]:
    """A stand-in for ``randbelow`` returning fixed coefficients."""
    it = iter(coeffs)
    return lambda _p: next(it)


def test_split_over_gf97_by_hand() -> None:
    # f(x) = 42 + 5x + 3x^2 mod 97: f(1) = 50, f(2) = 64, f(3) = 84, f(4) = 110 - 97.
    shares = split(42, [1, 2, 3, 4], 3, prime=97, randbelow=_fixed([5, 3]))
    assert shares == [50, 64, 84, 13]
    for subset in itertools.combinations(zip([1, 2, 3, 4], shares, strict=True), 3):
        assert reconstruct(list(subset), 3, prime=97) == 42
    # Two points fix a line, not this parabola: 2 shares do not give the secret.
    assert interpolate_at_zero([(1, 50), (2, 64)], prime=97) == 36


def test_threshold_one_is_the_secret_itself() -> None:
    assert split(7, [1, 2, 3], 1, prime=97) == [7, 7, 7]


@settings(max_examples=40, deadline=None)
@given(
    secret=st.integers(0, (1 << 256) - 1),
    n=st.integers(2, 9),
    data=st.data(),
)
def test_any_t_of_n_shares_reconstruct(
    secret: int, n: int, data: st.DataObject
) -> None:
    t = data.draw(st.integers(1, n))
    xs = data.draw(
        st.lists(st.integers(1, 1 << 31), min_size=n, max_size=n, unique=True)
    )
    shares = split(secret, xs, t)
    points = list(zip(xs, shares, strict=True))
    subset = data.draw(st.permutations(points))[:t]
    assert reconstruct(subset, t) == secret
    assert share_from_bytes(share_to_bytes(shares[0])) == shares[0]


def test_a_corrupted_share_is_routed_around_with_spare_shares() -> None:
    secret = 123456789
    xs = [1, 2, 3, 4, 5]
    points = list(zip(xs, split(secret, xs, 3), strict=True))
    points[0] = (1, (points[0][1] + 1) % PRIME)  # a lying holder

    def verify(s: int) -> bool:
        return s == secret

    assert reconstruct(points, 3) != secret
    assert reconstruct_checked(points, 3, verify) == secret
    with pytest.raises(SecAggError, match="corrupted"):
        reconstruct_checked(points[:3], 3, verify)
    with pytest.raises(SecAggError, match="need 3"):
        reconstruct_checked(points[:2], 3, verify)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(SecAggError, match="threshold"):
        split(1, [1, 2], 3)
    with pytest.raises(SecAggError, match="distinct"):
        split(1, [1, 1], 2)
    with pytest.raises(SecAggError, match="distinct"):
        split(1, [0, 1], 2)  # x = 0 would hand out the secret
    with pytest.raises(SecAggError, match="33 bytes"):
        share_from_bytes(b"\x00" * 32)
    with pytest.raises(SecAggError, match="field element"):
        share_from_bytes((PRIME).to_bytes(SHARE_BYTES, "little"))
    with pytest.raises(SecAggError, match="32-byte"):
        secret_to_bytes(1 << 256)
