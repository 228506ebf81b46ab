"""Fixed-point encoding into Z_2^32 and the randomized Hadamard rotation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.secagg.errors import SecAggError
from fedplat.secagg.quantize import FixedPoint, fwht, padded_dim

SESSION = b"s" * 16


def _hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@pytest.mark.parametrize("p", [0, 1, 3, 5, 6, 11, 12])
def test_fwht_is_the_hadamard_matrix(p: int) -> None:
    n = 1 << p
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(p))
    torch.testing.assert_close(fwht(x), _hadamard(n) @ x)
    torch.testing.assert_close(fwht(fwht(x)), n * x)  # H H = n I


def test_fwht_by_hand_and_bad_length() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert fwht(x).tolist() == [10.0, -2.0, -4.0, 0.0]
    with pytest.raises(SecAggError, match="power-of-two"):
        fwht(torch.ones(3))
    assert padded_dim(1) == 1 and padded_dim(5) == 8 and padded_dim(8) == 8


def test_encoding_without_rotation_by_hand() -> None:
    fp = FixedPoint(3, 1.0, 3, rotate=False)
    m = (2**31 - 1) // 3  # M = 715827882; B = S = 1, s = M
    assert fp.levels == m and fp.bound == 1.0 and fp.scale == m
    enc = fp.encode(torch.tensor([0.5, -0.5, 0.0]))  # norm 0.71: not clipped
    # M / 2 = 357913941; -M / 2 is stored as its two's complement.
    assert enc.ring.tolist() == [357913941, 2**32 - 357913941, 0]
    assert not enc.clipped and enc.clamped == 0
    # Three extreme encodings sum to 3M < 2^31 - 1: no wrap-around.
    one = fp.encode(torch.tensor([1.0, 0.0, 0.0])).ring
    total = one + one + one  # uint32 arithmetic
    assert total[0] == 3 * m
    assert fp.decode(total, 3)[0].item() == pytest.approx(3.0, abs=1.5 / m)


def test_clipping_and_bad_updates() -> None:
    fp = FixedPoint(2, 1.0, 4, rotate=False)
    enc = fp.encode(torch.tensor([3.0, 4.0]))
    assert enc.clipped
    got = fp.decode(enc.ring, 1)
    torch.testing.assert_close(got, torch.tensor([0.6, 0.8], dtype=torch.float64))
    with pytest.raises(SecAggError, match="NaN"):
        fp.encode(torch.tensor([float("nan"), 0.0]))
    with pytest.raises(SecAggError, match=r"update \[2\]"):
        fp.encode(torch.ones(3))
    with pytest.raises(SecAggError, match="count"):
        fp.decode(enc.ring, 5)


def test_rotation_bound_is_far_below_the_clip_norm() -> None:
    fp = FixedPoint(1_000_000, 1.0, 100, rotate=True, failure_prob=1e-9)
    n = 1 << 20
    assert fp.ring_dim == n
    assert fp.bound == pytest.approx(math.sqrt(2 * math.log(2 * n * 100 / 1e-9) / n))
    assert 100 < 1.0 / fp.bound < 130  # the grid is > 100x finer than B = S


def test_a_coordinate_beyond_the_bound_is_clamped_and_counted() -> None:
    # x = S * D h_j / sqrt(d') rotates to S e_j, far above B.
    fp = FixedPoint(64, 1.0, 8, rotate=True, session=SESSION)
    signs = fp._signs(torch.float64)
    x = (signs * _hadamard(64)[:, 5] / 8.0).to(torch.float32)
    enc = fp.encode(x)
    assert enc.clamped == 1 and not enc.clipped
    back = fp.decode(enc.ring, 1).to(torch.float32)
    assert float(torch.linalg.vector_norm(back)) == pytest.approx(fp.bound, rel=1e-3)


@settings(max_examples=25, deadline=None)
@given(
    d=st.integers(1, 300),
    count=st.integers(1, 6),
    rotate=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_sum_error_is_within_the_stated_bound(
    d: int, count: int, rotate: bool, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    fp = FixedPoint(d, 2.0, 8, rotate=rotate, session=SESSION)
    xs = [torch.randn(d, generator=g) for _ in range(count)]
    total = np.zeros(fp.ring_dim, dtype=np.uint32)
    clipped = []
    for x in xs:
        enc = fp.encode(x)
        assert enc.clamped == 0
        total += enc.ring
        n = float(x.double().norm())
        clipped.append(x.double() * min(1.0, 2.0 / n))
    err = float(torch.linalg.vector_norm(fp.decode(total, count) - sum(clipped)))
    # Rotation runs in float32 on the client: allow its rounding on top.
    slack = 1e-6 * count * 2.0 if rotate else 0.0
    assert err <= fp.error_bound(count) + slack
