"""MeaMed against an exact float64 reference: which values are closest to the
median, and a mean that excluded values cannot touch (issue 11)."""

from __future__ import annotations

import pytest
import torch
from fedplat.aggregators import create_aggregator
from hypothesis import given, settings
from hypothesis import strategies as st


def ref_closest(column: list[float], f: int) -> list[float]:
    """The ``n - f`` values closest to the median, the smaller value first on
    equal distance; plain float64 Python."""
    s = sorted(column)
    n = len(s)
    med = (s[(n - 1) // 2] + s[n // 2]) / 2
    return sorted(s, key=lambda v: (abs(v - med), v))[: n - f]


def ref_meamed_column(column: list[float], f: int) -> float:
    closest = ref_closest(column, f)
    return sum(closest) / len(closest)


def meamed(x: torch.Tensor, f: int) -> torch.Tensor:
    return create_aggregator("meamed", f=f)(x).aggregate


def test_a_strictly_closer_value_beats_a_tied_window() -> None:
    # median 1: the four closest values are 1, 1.5, 1.6 and one 0. The lowest
    # window of the same largest distance, [0, 0, 1, 1.5], gave 0.625.
    x = torch.tensor([[0.0], [0.0], [1.0], [1.5], [1.6]], dtype=torch.float64)
    assert float(meamed(x, 1)) == pytest.approx(1.025, rel=1e-15)
    assert float(meamed(x.float(), 1)) == pytest.approx(1.025, rel=1e-7)


def test_equal_distances_keep_the_smaller_value() -> None:
    x = torch.tensor([[0.0], [2.0], [4.0]])  # 0 and 4 tie at distance 2
    assert float(meamed(x, 1)) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_huge_excluded_value_does_not_shift_the_mean(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (1.3 + 0.1 * torch.randn(7, 40, generator=gen)).to(dtype)
    x[0] = -1e7  # excluded in every column
    got = meamed(x, 2).double()
    want = [ref_meamed_column(x[:, j].double().tolist(), 2) for j in range(40)]
    # The running window sum was off by ~0.2 here (float32).
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-6)


# Values on a 1/64 grid (and a few huge ones): every sum the rule and the
# reference form is exact, so ties are real ties and the choice must match.
grid = st.one_of(
    st.integers(-(2**16), 2**16).map(lambda k: k / 64),
    st.sampled_from([-1e7, 1e7]),
)


@settings(max_examples=200, deadline=None)
@given(
    columns=st.integers(3, 12).flatmap(
        lambda n: st.lists(
            st.lists(grid, min_size=n, max_size=n), min_size=1, max_size=4
        )
    ),
    data=st.data(),
)
def test_meamed_matches_the_reference_on_exact_grids(
    columns: list[list[float]], data: st.DataObject
) -> None:
    n = len(columns[0])
    f = data.draw(st.integers(0, (n - 1) // 2))
    x = torch.tensor(columns, dtype=torch.float32).T.contiguous()  # [n, d]
    got = meamed(x, f).double()
    for j, column in enumerate(columns):
        kept = ref_closest(column, f)
        # float32 accumulation error only; a wrong choice is off by >= 1/64/n
        scale = max(abs(v) for v in kept) + 1.0
        assert abs(float(got[j]) - sum(kept) / len(kept)) <= 1e-6 * scale, (column, f)
