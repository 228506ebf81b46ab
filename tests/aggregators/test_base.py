"""The rule skeleton: non-finite rows are refused, half precision is computed in
float32 and returned in the input dtype (issue 11)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fedplat.aggregators import AggregationError, build_aggregator, create_aggregator

from tests.support import EVERY_RULE


def stack(n: int = 7, d: int = 50, scale: float = 100.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return scale * torch.randn(n, d, generator=gen)


@pytest.mark.parametrize(("name", "params"), EVERY_RULE)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_row_is_refused_by_every_rule(
    name: str, params: dict[str, Any], bad: float
) -> None:
    x = stack()
    x[2, 7] = bad
    x[5, 0] = bad
    # Krum used to return row 0 silently (every score NaN).
    with pytest.raises(AggregationError, match=r"NaN or Inf in row\(s\) \[2, 5\]"):
        create_aggregator(name, **params)(x)


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_fedavg_refuses_a_non_finite_row_whatever_its_weight(weight: float) -> None:
    # FedAvg skips the input pass and reads non-finite rows off its output; a
    # zero weight must not hide one (BLAS may skip 0 * inf).
    x = stack()
    x[4, 3] = float("inf")
    w = torch.ones(7)
    w[4] = weight
    with pytest.raises(AggregationError, match=r"row\(s\) \[4\]"):
        create_aggregator("fedavg")(x, w)


def test_a_pipeline_refuses_non_finite_rows_too() -> None:
    x = stack()
    x[1, 1] = float("nan")
    agg = build_aggregator("krum", {"f": 0}, [{"name": "bucketing", "params": {}}])
    with pytest.raises(AggregationError, match="NaN or Inf"):
        agg(x)


@pytest.mark.parametrize(("name", "params"), EVERY_RULE)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_a_float64_reference(
    name: str, params: dict[str, Any], dtype: torch.dtype
) -> None:
    # |x| ~ 100 over 50 entries: squared norms (~5e5) overflow float16, and
    # bfloat16's 8-bit mantissa ruins Gram-matrix distances.
    x = stack().to(dtype)
    got = create_aggregator(name, **params)(x).aggregate
    want = create_aggregator(name, **params)(x.double()).aggregate
    assert got.dtype == dtype
    eps = torch.finfo(dtype).eps
    # one rounding of the float64 answer to the dtype, plus float32 arithmetic
    assert torch.allclose(
        got.double(), want, rtol=eps, atol=eps * float(want.abs().max())
    )
