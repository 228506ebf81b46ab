"""Geometric median (RFA): the stopping rule converges when one row is huge
(issue 11), against an exact float64 Weiszfeld loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fedplat.aggregators import create_aggregator

from tests.support import ref_geometric_median


@pytest.mark.parametrize("scale", [1e6, 1e12, 1e20])
def test_default_stopping_rule_converges_with_one_huge_row(scale: float) -> None:
    gen = torch.Generator().manual_seed(0)
    x = 1.15 + torch.randn(10, 100, generator=gen, dtype=torch.float64)
    x[0] = scale * torch.randn(100, generator=gen, dtype=torch.float64)
    want = ref_geometric_median(x.numpy())
    got = create_aggregator("geometric_median")(x).aggregate.numpy()
    # The objective-based rule stopped ~2500 away at 1e12 (norm of the answer ~12).
    assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want)


def test_tol_zero_runs_every_iteration_and_tol_scales_with_the_data() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 20, generator=gen, dtype=torch.float64)
    loose = create_aggregator("geometric_median", tol=1e-2)(x).aggregate
    scaled = create_aggregator("geometric_median", tol=1e-2)(1e6 * x + 3e6).aggregate
    # Invariant to translating and scaling all rows: same iterations, same point.
    assert torch.allclose((scaled - 3e6) / 1e6, loose, atol=1e-9)
    exact = create_aggregator("geometric_median", tol=0.0, max_iter=3000)(x).aggregate
    assert torch.allclose(exact, torch.from_numpy(ref_geometric_median(x.numpy())))
