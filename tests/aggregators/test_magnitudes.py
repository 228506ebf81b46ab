"""The robust rules at every magnitude float32 holds, 1e-30 .. 1e30 (issue 25).

Hand-checkable reproductions of the three silent failures the audit found, then
hypothesis properties: scaling all rows by a power of two ``c`` scales the output
by ``c`` (radii ``tau`` and ``nu``, which have the units of the updates, scale
too), selection rules pick the same rows at every scale, and one attacker at
``1e30`` among honest rows at ``1e20`` never becomes the result.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fedplat.aggregators import (
    AggregationError,
    Bucketing,
    Bulyan,
    CenteredClipping,
    CoordinateMedian,
    GeometricMedian,
    Krum,
    MeaMed,
    MultiKrum,
    NearestNeighborMixing,
    Pipeline,
    Rule,
    TrimmedMean,
)
from fedplat.aggregators.kernels.distances import pairwise_sq_distances
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import ref_geometric_median

FAST = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def gaussian(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def chosen(rule: Rule, x: torch.Tensor) -> list[int]:
    return [d.index for d in rule(x).decisions if d.selected]


# --------------------------------------------------------------------------- #
# Bug 1: every value below ~1e-19 made every float32 squared distance 0.


def test_krum_at_1e_minus_25_picks_what_it_picks_at_1() -> None:
    x = gaussian(11, 64, seed=0)
    tiny = x * 1e-25
    # Squares of 1e-25 are 1e-50, below float32's smallest subnormal (1.4e-45):
    # the old code saw all distances as 0 and picked row 0 by the tie rule.
    assert float((tiny[1] - tiny[2]).square().sum()) == 0.0
    want = chosen(Krum(f=1), x)
    assert want != [0]
    assert chosen(Krum(f=1), tiny) == want
    d2 = pairwise_sq_distances(tiny)
    assert torch.allclose(d2, pairwise_sq_distances(x) * 1e-50, rtol=1e-5, atol=0)


def test_nnm_at_1e_minus_25_mixes_the_nearest_rows() -> None:
    # Rows 0, 1 close, row 2 far, on a line; f = 1 mixes each row with its
    # nearest other row: 0 <-> 1, and 2 with 1. At 1e-25 the old code saw all
    # distances as 0 and mixed every row with rows 0 and 1 (index order).
    x = torch.tensor([[0.0], [1.0], [5.0]]) * 1e-25
    out = NearestNeighborMixing(f=1)(x, torch.full((3,), 1 / 3)).updates
    want = torch.tensor([[0.5], [0.5], [3.0]]) * 1e-25
    assert torch.allclose(out, want, rtol=1e-6, atol=0)


def test_centered_clipping_at_1e_minus_25_clips_only_the_far_row() -> None:
    x = torch.tensor([[3.0, 4.0], [0.5, 0.0]]) * 1e-25
    r = CenteredClipping(tau=1e-25, iterations=1)(x)
    assert [d.flags for d in r.decisions] == [("clipped",), ()]
    want = torch.tensor([0.55, 0.4]) * 1e-25
    assert torch.allclose(r.aggregate, want, rtol=1e-6, atol=0)


# --------------------------------------------------------------------------- #
# Bug 2: when the honest rows' squared norms overflow float32, the origin row
# for the accurate Gram matrix came from an all-inf ranking: row 0, the attacker.


def honest_1e20_attacker_1e30(seed: int, n: int = 9, d: int = 100) -> torch.Tensor:
    x = 1e20 * gaussian(n, d, seed)
    x[0] = 1e30 * gaussian(1, d, seed + 1000)[0]
    return x


def test_distances_with_an_attacker_at_row_0_are_exact() -> None:
    x = honest_1e20_attacker_1e30(seed=0)
    rows = x.double()
    want = torch.cdist(rows, rows).square()
    got = pairwise_sq_distances(x)
    # The old code measured the honest rows around the attacker (1e30): their
    # 1e41 distances drowned in float64 rounding of 1e62 norms (errors ~2e4x).
    assert torch.allclose(got, want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("rule", [Krum(f=1), MultiKrum(f=1), Bulyan(f=1)])
def test_selection_with_an_attacker_at_row_0_matches_float64(rule: Rule) -> None:
    for seed in range(3):
        x = honest_1e20_attacker_1e30(seed)
        assert chosen(rule, x) == chosen(rule, x.double())


def test_geometric_median_with_an_attacker_at_row_0_matches_float64() -> None:
    x = honest_1e20_attacker_1e30(seed=1)
    got = GeometricMedian()(x).aggregate.double().numpy()
    want = ref_geometric_median(x.double().numpy())
    # The old code was off by ~100% of the answer's norm.
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


def test_float64_rows_whose_distances_overflow_are_refused() -> None:
    x = 1e200 * gaussian(7, 5, seed=0).double()
    with pytest.raises(AggregationError, match="overflow float64"):
        Krum(f=1)(x)


def test_float64_rows_whose_distances_underflow_are_refused() -> None:
    x = 1e-200 * gaussian(7, 5, seed=0).double()
    with pytest.raises(AggregationError, match="underflow float64"):
        Krum(f=1)(x)


# --------------------------------------------------------------------------- #
# Bug 3: the Weiszfeld iteration stopped at max_iter far from the median,
# silently.

WEIGHTS = torch.tensor([436.0, 831.0, 55.0, 209.0, 127.0, 77.0])


def weighted_weiszfeld(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Plain float64 weighted Weiszfeld from the weighted mean, 20000 updates
    (the far row's 8% per update needs a few hundred)."""
    z = alpha @ x
    for _ in range(20000):
        beta = alpha / np.maximum(np.linalg.norm(x - z, axis=1), 1e-12)
        z = beta @ x / beta.sum()
    return z


def far_heavy_row(seed: int) -> torch.Tensor:
    x = gaussian(6, 10, seed)
    x[1] = 1e7 * gaussian(1, 10, seed + 1000)[0]
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_geometric_median_converges_with_a_far_row_of_48_percent_weight(
    seed: int,
) -> None:
    # Row 1 holds 831 / 1735 = 48% of the weight at 1e7: from the weighted mean,
    # each update closes only ~8% of the gap, so 100 updates stopped ~1e3 away
    # from a median among rows of spread ~3.
    x = far_heavy_row(seed)
    r = GeometricMedian()(x, WEIGHTS)
    assert r.diagnostics["converged"] is True
    alpha = (WEIGHTS / WEIGHTS.sum()).numpy()
    want = weighted_weiszfeld(x.double().numpy(), alpha)
    spread = float(x[[0, 2, 3, 4, 5]].double().std(dim=0).norm())
    assert np.linalg.norm(r.aggregate.double().numpy() - want) <= 1e-4 * spread
    assert "unconverged" not in r.decisions[0].flags


def test_non_convergence_is_reported_not_silent() -> None:
    x = far_heavy_row(0)
    r = GeometricMedian(max_iter=2)(x, WEIGHTS)
    assert r.diagnostics == {"converged": False, "iterations": 2}
    assert all("unconverged" in d.flags for d in r.decisions)
    piped = Pipeline([Bucketing(bucket_size=1)], GeometricMedian(max_iter=2))
    assert piped(x, WEIGHTS).diagnostics["converged"] is False


# --------------------------------------------------------------------------- #
# Properties over 1e-30 .. 1e30 (2^-100 .. 2^100).

exponents = st.integers(-100, 100)


def rule_at(name: str, c: float) -> Rule:
    """The rule ``name``, its radius (if any) scaled by ``c``."""
    rules: dict[str, Rule] = {
        "krum": Krum(f=1),
        "multi_krum": MultiKrum(f=1),
        "bulyan": Bulyan(f=1),
        "median": CoordinateMedian(),
        "trimmed_mean": TrimmedMean(f=1),
        "meamed": MeaMed(f=1),
        "geometric_median": GeometricMedian(nu=1e-6 * c),
        "centered_clipping": CenteredClipping(tau=2.0 * c),
        "nnm+geometric_median": Pipeline(
            [NearestNeighborMixing(f=1)], GeometricMedian(nu=1e-6 * c)
        ),
        "nnm+krum": Pipeline([NearestNeighborMixing(f=1)], Krum(f=1)),
    }
    return rules[name]


RULES = [
    "krum",
    "multi_krum",
    "bulyan",
    "median",
    "trimmed_mean",
    "meamed",
    "geometric_median",
    "centered_clipping",
    "nnm+geometric_median",
    "nnm+krum",
]
SELECTING = ["krum", "multi_krum", "bulyan", "nnm+krum"]


@pytest.mark.parametrize("name", RULES)
@FAST
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(7, 12),
    # d >= 2: on a line an even number of rows has a whole interval of
    # geometric medians, and rounding picks any point of it.
    d=st.integers(2, 40),
    k=exponents,
)
def test_scaling_rows_by_a_power_of_two_scales_the_output(
    name: str, seed: int, n: int, d: int, k: int
) -> None:
    c = math.ldexp(1.0, k)
    x = gaussian(n, d, seed)
    base = rule_at(name, 1.0)(x)
    scaled = rule_at(name, c)(x * c)
    want = base.aggregate.double() * c
    err = float((scaled.aggregate.double() - want).norm())
    assert err <= 1e-4 * c * (1.0 + float(base.aggregate.double().norm()))
    if name in SELECTING:
        assert [d.selected for d in scaled.decisions] == [
            d.selected for d in base.decisions
        ]


@pytest.mark.parametrize("name", RULES)
@FAST
@given(seed=st.integers(0, 2**16), at=st.integers(0, 8), d=st.integers(2, 40))
def test_an_attacker_at_1e30_among_honest_rows_at_1e20_is_not_the_result(
    name: str, seed: int, at: int, d: int
) -> None:
    n = 9
    x = 1e20 * gaussian(n, d, seed)
    x[at] = 1e30 * gaussian(1, d, seed + 1)[0]
    honest = torch.cat([x[:at], x[at + 1 :]]).double()
    r = rule_at(name, 1e20)(x)
    agg = r.aggregate.double()
    center = honest.mean(dim=0)
    radius = float((honest - center).norm(dim=1).max())
    # Every rule here keeps the output among the honest rows; the attacker's
    # row is ~1e10 radii away.
    assert float((agg - center).norm()) <= 2.0 * radius, name
    assert r.decisions[at].weight < 1e-6
