"""Property tests (hypothesis) for the robust rules."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from fedplat.aggregators import AggregationError, create_aggregator
from fedplat.aggregators.kernels.bitonic import sort_columns
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tests.support import EVERY_RULE

FAST = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
values = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@st.composite
def stacks(
    draw: st.DrawFn, min_n: int = 1, max_n: int = 12, max_d: int = 6
) -> np.ndarray:
    n = draw(st.integers(min_n, max_n))
    d = draw(st.integers(1, max_d))
    return draw(arrays(np.float32, (n, d), elements=values))


def agg(name: str, x: np.ndarray, **params: object) -> np.ndarray:
    return create_aggregator(name, **params)(torch.from_numpy(x)).aggregate.numpy()


def tol(x: np.ndarray) -> float:
    return 1e-4 * (1.0 + float(np.abs(x).max()))


# Rules whose output does not depend on the order of the clients (for Krum-type
# selection only up to ties, excluded with ``assume`` below).
ORDER_FREE = [
    ("median", {}),
    ("trimmed_mean", {"f": 1}),
    ("meamed", {"f": 1}),
    ("geometric_median", {}),
    ("centered_clipping", {"tau": 5.0}),
    ("fedavg", {}),
]


@pytest.mark.parametrize(("name", "params"), ORDER_FREE)
@FAST
@given(x=stacks(min_n=3), seed=st.integers(0, 2**16))
def test_permutation_invariance(
    name: str, params: dict[str, object], x: np.ndarray, seed: int
) -> None:
    perm = np.random.default_rng(seed).permutation(len(x))
    a, b = agg(name, x, **params), agg(name, x[perm], **params)
    assert np.allclose(a, b, atol=tol(x)), (a, b)


@FAST
@given(x=stacks(min_n=5), seed=st.integers(0, 2**16))
def test_krum_permutation_invariance_without_ties(x: np.ndarray, seed: int) -> None:
    r = create_aggregator("multi_krum", f=1, m=2)(torch.from_numpy(x))
    scores = sorted(d.score for d in r.decisions if d.score is not None)
    assume(scores[1] < scores[2] * (1 - 1e-6) - 1e-6)  # no tie at the cut
    perm = np.random.default_rng(seed).permutation(len(x))
    assert np.allclose(
        agg("multi_krum", x[perm], f=1, m=2), r.aggregate.numpy(), atol=tol(x)
    )


@st.composite
def honest_and_byzantine(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    n = draw(st.integers(3, 12))
    f = draw(st.integers(0, (n - 1) // 2))
    d = draw(st.integers(1, 5))
    honest = draw(arrays(np.float32, (n - f, d), elements=st.floats(-10, 10, width=32)))
    byz = draw(arrays(np.float32, (f, d), elements=st.floats(-1e6, 1e6, width=32)))
    return np.concatenate([honest, byz]), f


@pytest.mark.parametrize("name", ["median", "trimmed_mean"])
@FAST
@given(data=honest_and_byzantine())
def test_output_within_honest_coordinate_range(
    name: str, data: tuple[np.ndarray, int]
) -> None:
    # With f < n/2 arbitrary rows, each coordinate of the median and of the
    # f-trimmed mean lies between the smallest and largest honest value.
    x, f = data
    honest = x[: len(x) - f]
    params = {"f": f} if name == "trimmed_mean" else {}
    out = agg(name, x, **params)
    assert np.all(out >= honest.min(axis=0) - 1e-4)
    assert np.all(out <= honest.max(axis=0) + 1e-4)


# Rules whose output stays inside the range of the inputs (not FA, whose
# output scale is set by n/m, nor centered clipping, which starts from 0).
HULL = [
    (name, params)
    for name, params in EVERY_RULE
    if name not in ("fedavg", "centered_clipping", "flag")
]


@pytest.mark.parametrize(("name", "params"), HULL)
@FAST
@given(x=stacks(min_n=7))
def test_output_within_range_of_all_inputs(
    name: str, params: dict[str, object], x: np.ndarray
) -> None:
    out = agg(name, x, **params)
    assert np.all(out >= x.min(axis=0) - tol(x))
    assert np.all(out <= x.max(axis=0) + tol(x))


# (rule, smallest f that violates the bound for n clients, the bound's text)
BOUNDS: list[tuple[str, Callable[[int], int], str]] = [
    ("trimmed_mean", lambda n: (n + 1) // 2, "2f < n"),
    ("meamed", lambda n: (n + 1) // 2, "2f < n"),
    ("krum", lambda n: (n - 1) // 2, r"n >= 2f \+ 3"),
    ("multi_krum", lambda n: (n - 1) // 2, r"n >= 2f \+ 3"),
    ("bulyan", lambda n: (n - 3) // 4 + 1, r"n >= 4f \+ 3"),
]


@pytest.mark.parametrize(("name", "first_bad_f", "bound"), BOUNDS)
@FAST
@given(n=st.integers(3, 20), extra=st.integers(0, 5))
def test_clear_error_when_f_too_large(
    name: str, first_bad_f: Callable[[int], int], bound: str, n: int, extra: int
) -> None:
    f = first_bad_f(n)
    x = torch.zeros(n, 3)
    create_aggregator(name, f=f - 1)(x)  # the largest valid f works
    f += extra
    with pytest.raises(
        AggregationError, match=rf"{name} needs {bound}, got f={f}, n={n}"
    ):
        create_aggregator(name, f=f)(x)


@FAST
@given(
    x=arrays(
        np.float32,
        st.tuples(st.integers(1, 70), st.integers(1, 9)),
        elements=st.sampled_from(
            [0.0, 1.0, -1.0, 2.5, float("inf"), -float("inf"), 1e30]
        ),
    )
)
def test_sorting_network_sorts_with_ties_and_infinities(x: np.ndarray) -> None:
    t = torch.from_numpy(x)
    assert torch.equal(sort_columns(t), torch.sort(t, dim=0).values)


@FAST
@given(x=stacks(min_n=2), m=st.integers(1, 4))
def test_flag_output_lies_in_span_and_weights_normalised(x: np.ndarray, m: int) -> None:
    assume(np.linalg.norm(x, axis=1).min() > 1e-3)
    r = create_aggregator("flag", m=m)(torch.from_numpy(x))
    assert np.isfinite(r.aggregate.numpy()).all()
    assert sum(d.weight for d in r.decisions) == pytest.approx(1.0)
    assert all(-1e-6 <= (d.score or 0.0) <= 1 + 1e-6 for d in r.decisions)
