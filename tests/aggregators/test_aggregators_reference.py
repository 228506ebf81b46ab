"""Agreement with independent, straightforward reference implementations.

Every reference below is written from the papers (and, for the Flag Aggregator, a
direct translation of the authors' list-of-columns code) with plain Python/numpy
loops, no shared code with ``fedplat.aggregators``; inputs are random.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fedplat.aggregators import (
    Bucketing,
    FlagAggregator,
    NearestNeighborMixing,
    create_aggregator,
)
from fedplat.aggregators.base import check_updates

SEEDS = [0, 1, 2]


def sample(seed: int, n: int, d: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x[: max(1, n // 5)] += rng.normal(scale=5.0, size=(max(1, n // 5), d))  # outliers
    return x.astype(np.float32)


def run(name: str, x: np.ndarray, **params: object) -> np.ndarray:
    out = create_aggregator(name, **params)(torch.from_numpy(x)).aggregate
    return out.double().numpy()


def ref_trimmed_mean(x: np.ndarray, f: int) -> np.ndarray:
    n, d = x.shape
    out = np.empty(d)
    for j in range(d):
        column = sorted(float(v) for v in x[:, j])
        out[j] = sum(column[f : n - f]) / (n - 2 * f)
    return out


def ref_meamed(x: np.ndarray, f: int) -> np.ndarray:
    n, d = x.shape
    out = np.empty(d)
    for j in range(d):
        column = [float(v) for v in x[:, j]]
        med = float(np.median(column))
        closest = sorted(column, key=lambda v: (abs(v - med), v))[: n - f]
        out[j] = sum(closest) / len(closest)
    return out


def ref_sq_dist(a: np.ndarray, b: np.ndarray) -> float:
    diff = a.astype(np.float64) - b.astype(np.float64)
    return float(np.dot(diff, diff))


def ref_krum_scores(x: np.ndarray, f: int, rows: list[int]) -> dict[int, float]:
    k = max(1, min(len(rows) - 1, len(rows) - f - 2))
    scores = {}
    for i in rows:
        dists = sorted(ref_sq_dist(x[i], x[j]) for j in rows if j != i)
        scores[i] = sum(dists[:k])
    return scores


def ref_multi_krum(x: np.ndarray, f: int, m: int) -> np.ndarray:
    scores = ref_krum_scores(x, f, list(range(len(x))))
    best = sorted(scores, key=lambda i: (scores[i], i))[:m]
    return x[best].astype(np.float64).mean(axis=0)


def ref_bulyan(x: np.ndarray, f: int) -> np.ndarray:
    n = len(x)
    remaining = list(range(n))
    chosen = []
    for _ in range(n - 2 * f):
        scores = ref_krum_scores(x, f, remaining)
        best = min(remaining, key=lambda i: (scores[i], i))
        chosen.append(best)
        remaining.remove(best)
    return ref_meamed(x[chosen], 2 * f)


def ref_weiszfeld(x: np.ndarray, nu: float, iters: int) -> np.ndarray:
    pts = x.astype(np.float64)
    z = pts.mean(axis=0)
    for _ in range(iters):
        beta = np.array([1.0 / max(nu, np.linalg.norm(z - p)) for p in pts])
        z = (beta[:, None] * pts).sum(axis=0) / beta.sum()
    return z


def ref_cclip(x: np.ndarray, tau: float, iters: int, v: np.ndarray) -> np.ndarray:
    pts = x.astype(np.float64)
    for _ in range(iters):
        total = np.zeros_like(v)
        for p in pts:
            diff = p - v
            norm = np.linalg.norm(diff)
            total += diff * min(1.0, tau / norm) if norm > 0 else diff
        v = v + total / len(pts)
    return v


def ref_flag(x: torch.Tensor, r: int, lam: float, seed: int) -> torch.Tensor:
    """Direct translation of hamidralmasi/FlagAggregator ``flag.aggregate`` with
    ``irls_flag(n_its=1, 'sine')`` and ``flag_mean_iteration`` (float64)."""
    eps = 1e-7
    data = [torch.nn.functional.normalize(g.double(), dim=0)[:, None] for g in x]
    p, d = len(data), data[0].shape[0]

    def err(y: torch.Tensor) -> float:
        total = 0.0
        for v in data:
            sin_sq = 1 - float(torch.trace(y.T @ v @ v.T @ y))
            total += math.sqrt(max(sin_sq, 0.0))
        return total

    gen = torch.Generator().manual_seed(seed)
    y_raw = torch.rand(d, r, generator=gen) - 0.5
    y = torch.linalg.qr(y_raw.double()).Q[:, :r]
    e0 = err(y)
    columns = []
    for v in data:
        w = (abs(1 - float(torch.trace(y.T @ v @ v.T @ y))) + eps) ** (-1 / 4)
        columns.append(w * v)
    if lam > 0:
        for a in range(p):
            for b in range(p):
                if a != b:
                    diff = data[a] - data[b]
                    s = abs(1 - float(torch.trace(y.T @ diff @ diff.T @ y)))
                    columns.append((s + eps) ** (-1 / 4) * lam / (p * (p - 1)) * diff)
    y1 = torch.linalg.svd(torch.hstack(columns), full_matrices=False).U[:, :r]
    if e0 - err(y1) > 0:
        y = y1
    return sum(y @ (y.T @ v) for v in data)[:, 0] / r


@pytest.mark.parametrize("seed", SEEDS)
def test_coordinatewise_rules_match_loops(seed: int) -> None:
    x = sample(seed, n=9 + seed, d=37)
    assert np.allclose(run("median", x), np.median(x.astype(np.float64), axis=0))
    assert np.allclose(run("trimmed_mean", x, f=2), ref_trimmed_mean(x, 2), atol=1e-5)
    assert np.allclose(run("meamed", x, f=3), ref_meamed(x, 3), atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
def test_krum_family_matches_loops(seed: int) -> None:
    x = sample(seed, n=11, d=25)
    assert np.allclose(run("krum", x, f=2), ref_multi_krum(x, 2, 1), atol=1e-6)
    assert np.allclose(run("multi_krum", x, f=2), ref_multi_krum(x, 2, 9), atol=1e-5)
    assert np.allclose(
        run("multi_krum", x, f=3, m=4), ref_multi_krum(x, 3, 4), atol=1e-5
    )
    assert np.allclose(run("bulyan", x, f=2), ref_bulyan(x, 2), atol=1e-5)


def test_krum_scores_are_exact_despite_a_large_common_offset() -> None:
    # honest updates close together far from the origin: the naive float32 Gram
    # identity would cancel; the centered blocks keep the ranking exact.
    rng = np.random.default_rng(0)
    x = (1000.0 + 0.01 * rng.normal(size=(9, 4000))).astype(np.float32)
    r = create_aggregator("krum", f=2)(torch.from_numpy(x))
    scores = [d.score for d in r.decisions]
    want = ref_krum_scores(x, 2, list(range(9)))
    assert np.allclose(scores, [want[i] for i in range(9)], rtol=1e-4)


@pytest.mark.parametrize("seed", SEEDS)
def test_geometric_median_matches_weiszfeld_loop(seed: int) -> None:
    x = sample(seed, n=10, d=20)
    got = run("geometric_median", x, nu=1e-8, max_iter=15, tol=0.0)
    assert np.allclose(got, ref_weiszfeld(x, 1e-8, 15), atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
def test_centered_clipping_matches_loop_over_rounds(seed: int) -> None:
    rounds = [sample(seed + 10 * t, n=8, d=15) for t in range(3)]
    agg = create_aggregator("centered_clipping", tau=2.0, iterations=3)
    v = np.zeros(15)
    for x in rounds:
        v = ref_cclip(x, 2.0, 3, v)
        got = agg(torch.from_numpy(x)).aggregate.double().numpy()
        assert np.allclose(got, v, atol=1e-5)


@pytest.mark.parametrize(
    ("seed", "lam", "m", "d"), [(0, 0.0, 3, 40), (1, 2.0, 2, 40), (2, 0.0, 4, 3)]
)
def test_flag_matches_reference_translation(
    seed: int, lam: float, m: int, d: int
) -> None:
    x = torch.from_numpy(sample(seed, n=7, d=d))
    got = FlagAggregator(m=m, lam=lam, seed=1)(x).aggregate.double()
    want = ref_flag(x, m, lam, seed=1)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_nnm_matches_loop() -> None:
    x = sample(4, n=9, d=12)
    f = 3
    out = NearestNeighborMixing(f=f)(
        torch.from_numpy(x), check_updates(torch.from_numpy(x))
    )
    for i in range(9):
        order = sorted(range(9), key=lambda j: (ref_sq_dist(x[i], x[j]), j))[: 9 - f]
        assert np.allclose(out.updates[i].numpy(), x[order].mean(axis=0), atol=1e-5)


def test_bucketing_matches_manual_buckets() -> None:
    x = sample(5, n=7, d=6)
    out = Bucketing(bucket_size=3, seed=11)(
        torch.from_numpy(x), check_updates(torch.from_numpy(x))
    )
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(11)).tolist()
    buckets = [perm[0:3], perm[3:6], perm[6:7]]
    for j, members in enumerate(buckets):
        assert np.allclose(out.updates[j].numpy(), x[members].mean(axis=0), atol=1e-6)
        assert float(out.weights[j]) == pytest.approx(len(members) / 7)
        assert all(int(out.owner[i]) == j for i in members)
