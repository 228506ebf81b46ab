"""Gram matrices and pairwise distances against exact float64 references: a far
row must not change the honest rows' distances, and overflow is +inf, never NaN
(issue 11)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fedplat.aggregators.kernels.distances import (
    accurate_gram,
    central_row,
    combination_sq_distances,
    gram,
    pairwise_sq_distances,
)


def ref_sq_distances(x: torch.Tensor) -> np.ndarray:
    """Exact-as-float64 ``||x_i - x_j||^2`` by differences of rows."""
    rows = x.double().numpy()
    n = len(rows)
    out = np.zeros((n, n))
    with np.errstate(over="ignore"):  # 1e200 rows: inf, as expected
        for i in range(n):
            for j in range(n):
                diff = rows[i] - rows[j]
                out[i, j] = float(np.dot(diff, diff))
    return out


def stack(offset: float, d: int = 3000, n: int = 9, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (offset + 0.01 * torch.randn(n, d, generator=gen)).float()


@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize("huge", [1e20, -3e38])
def test_a_far_row_leaves_the_other_distances_exact(offset: float, huge: float) -> None:
    x = stack(offset)
    x[4] = huge
    got = pairwise_sq_distances(x).numpy()
    want = ref_sq_distances(x)
    assert np.isfinite(got).all()  # float64 holds the Gram of any float32 rows
    honest = [i for i in range(len(x)) if i != 4]
    sub = np.ix_(honest, honest)
    assert np.allclose(got[sub], want[sub], rtol=1e-4)
    assert np.allclose(got[4], want[4], rtol=1e-6)
    # ... so the nearest rows of every honest row are the honest ones, in order
    for i in honest:
        assert np.argsort(got[i], kind="stable")[-1] == 4


def test_large_common_offset_is_handled_by_an_origin_row() -> None:
    # Honest rows close together far from the origin: the plain float32 Gram
    # identity would cancel; the Gram around a central row keeps them exact.
    x = stack(1000.0)
    got = pairwise_sq_distances(x).numpy()
    assert np.allclose(got, ref_sq_distances(x), rtol=1e-4)


def test_overflowing_float64_distances_are_inf_not_nan() -> None:
    x = stack(0.0, d=50).double()
    x[2] = 1e200
    x[5] = -1e200
    d2 = pairwise_sq_distances(x).numpy()
    assert not np.isnan(d2).any()
    assert (np.diag(d2) == 0).all()
    for bad in (2, 5):
        others = [j for j in range(len(x)) if j != bad]
        assert np.isposinf(d2[bad, others]).all()
    honest = [i for i in range(len(x)) if i not in (2, 5)]
    sub = np.ix_(honest, honest)
    assert np.allclose(d2[sub], ref_sq_distances(x)[sub], rtol=1e-9)


def test_central_row_ignores_a_far_minority() -> None:
    x = stack(5.0, n=7)
    x[0] = 1e20
    x[1] = -1e20
    r = central_row(pairwise_sq_distances(x))
    assert r not in (0, 1)


def test_raw_gram_falls_back_to_float64_on_overflow() -> None:
    x = stack(1.0, d=100, n=4)
    x[3] = 1e20
    g = gram(x).numpy()
    rows = x.double().numpy()
    assert np.allclose(g, rows @ rows.T, rtol=1e-6)


def test_combination_distances_with_a_far_row() -> None:
    x = stack(3.0, n=6)
    x[0] = 1e20
    g = accurate_gram(x)
    coef = torch.tensor([1e-21, 0.2, 0.2, 0.2, 0.2, 0.2 - 1e-21], dtype=torch.float64)
    v = coef.numpy() @ x.double().numpy()
    want = [float(np.sum((row - v) ** 2)) for row in x.double().numpy()]
    got = combination_sq_distances(g, coef).numpy()
    assert np.allclose(got[1:], want[1:], rtol=1e-4)
    assert got[0] == pytest.approx(want[0], rel=1e-6)
    assert math.isfinite(float(got.sum()))
