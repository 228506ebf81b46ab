"""Shared pieces of the aggregator tests: the registered rules with settings
valid for ``n >= 7`` rows, and independent float64 references."""

from __future__ import annotations

from typing import Any

import numpy as np

# Every registered rule, with settings valid for n >= 7 rows (f = 1).
EVERY_RULE: list[tuple[str, dict[str, Any]]] = [
    ("fedavg", {}),
    ("median", {}),
    ("trimmed_mean", {"f": 1}),
    ("meamed", {"f": 1}),
    ("krum", {"f": 1}),
    ("multi_krum", {"f": 1}),
    ("bulyan", {"f": 1}),
    ("geometric_median", {}),
    ("centered_clipping", {}),
    ("flag", {"m": 2}),
]


def ref_geometric_median(x: np.ndarray, iters: int = 5000) -> np.ndarray:
    """Plain float64 Weiszfeld from the mean of the rows of ``x`` ``[n, d]``, run
    to a fixed point (or ``iters`` updates)."""
    z = x.mean(axis=0)
    for _ in range(iters):
        dist = np.maximum(np.linalg.norm(x - z, axis=1), 1e-12)
        new = (x / dist[:, None]).sum(axis=0) / (1.0 / dist).sum()
        if np.array_equal(new, z):
            break
        z = new
    return z
