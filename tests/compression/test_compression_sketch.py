"""Sketches of Song, Wang, Yu & Zhang, "Sketching for First Order Method: Efficient
Algorithm for Low-Bandwidth Channel and Vulnerability", ICML 2023 (arXiv
2210.08371): E[RᵀR] = I, shared seeds, coordinator-side de-sketching, heavy-hitter
recovery."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fedplat.compression import (
    AMSSketch,
    Compressor,
    CountSketch,
    GaussianSketch,
    Payload,
    PayloadError,
    mean_sketch,
)

SKETCHES: dict[str, Callable[[], Compressor]] = {
    "gaussian": lambda: GaussianSketch(8),
    "ams": lambda: AMSSketch(8),
    "count": lambda: CountSketch(rows=3, cols=8),
}


@pytest.mark.parametrize("name", sorted(SKETCHES))
def test_monte_carlo_desketch_is_unbiased(name: str) -> None:
    """Average of ``Rᵀ R h`` over fresh rounds -> ``h`` (E[RᵀR] = I)."""
    d, trials = 32, 2000
    h = torch.randn(d, generator=torch.Generator().manual_seed(0))
    sk = SKETCHES[name]()
    acc = torch.zeros(d, dtype=torch.float64)
    for t in range(trials):
        acc += sk.decode(sk.encode(h, round=t, seed=11)).double()
    mean = (acc / trials).float()
    # Per-coordinate variance is about ||h||^2 / b, so the relative error of the
    # mean is about sqrt(d / (b * trials)) ~ 0.045 for b = 8; allow 2x that.
    rel = float((mean - h).norm() / h.norm())
    assert rel < 0.1, rel
    # A single sketch is far from h: the check above is not trivial.
    single = sk.decode(sk.encode(h, round=0, seed=11))
    assert float((single - h).norm() / h.norm()) > 0.3


@pytest.mark.parametrize("name", ["gaussian", "ams"])
def test_dense_sketch_matrix_statistics(name: str) -> None:
    sk = SKETCHES[name]()
    assert isinstance(sk, GaussianSketch | AMSSketch)
    d = 20
    gram = torch.zeros(d, d, dtype=torch.float64)
    trials = 2000
    for t in range(trials):
        r = sk.matrix(d, round=t, seed=3).double()
        gram += r.t() @ r
    torch.testing.assert_close(
        gram / trials, torch.eye(d, dtype=torch.float64), atol=0.12, rtol=0
    )
    r = sk.matrix(d, round=0, seed=3)
    if name == "ams":
        assert bool((r.abs() == 1 / 8**0.5).all())
    # Encoding is R @ h, decoding Rᵀ s, with the same R on both sides.
    h = torch.randn(d)
    p = sk.encode(h, round=0, seed=3)
    torch.testing.assert_close(p.values, r @ h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sk.decode(p), r.t() @ (r @ h), rtol=1e-4, atol=1e-4)


def test_dense_sketch_chunking_matches_one_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fedplat.compression.sketch as mod

    h = torch.randn(1000)
    sk = GaussianSketch(16)
    whole = sk.encode(h, round=1, seed=2)
    monkeypatch.setattr(mod, "_CHUNK_ELEMS", 16 * 100)  # ten column blocks
    chunked = sk.encode(h, round=1, seed=2)
    # Different chunking is a different (but equally valid) R: both sides must
    # agree on it, which they do because the width depends on b only.
    assert not torch.equal(whole.values, chunked.values)
    torch.testing.assert_close(
        sk.decode(chunked),
        sk.matrix(1000, round=1, seed=2).t() @ chunked.values,
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("name", sorted(SKETCHES))
def test_same_seed_and_round_same_sketch_on_both_sides(name: str) -> None:
    h = torch.randn(500)
    client, coordinator = SKETCHES[name](), SKETCHES[name]()
    p1 = client.encode(h, round=4, seed=99)
    p2 = client.encode(h, round=4, seed=99)
    assert p1.to_bytes() == p2.to_bytes()
    assert not torch.equal(p1.values, client.encode(h, round=5, seed=99).values)
    assert not torch.equal(p1.values, client.encode(h, round=4, seed=98).values)
    # The coordinator needs nothing but the bytes to de-sketch.
    wire = Payload.from_bytes(
        p1.to_bytes(), expected_d=500, expected_round=4, expected_seed=99
    )
    assert torch.equal(coordinator.decode(wire), client.decode(p1))


def test_count_sketch_shape_and_mismatch_rejected() -> None:
    cs = CountSketch(rows=5, cols=40)
    p = cs.encode(torch.randn(1000), round=0, seed=0)
    assert p.kind == "sketch" and p.sketch is not None
    assert (p.sketch.rows, p.sketch.cols) == (5, 40) and p.nnz == 200
    with pytest.raises(PayloadError, match="expects count 5x50"):
        CountSketch(rows=5, cols=50).decode(p)
    with pytest.raises(PayloadError, match="expected a sketch"):
        GaussianSketch(8).decode(Payload("dense", 3, torch.ones(3)))


def test_count_sketch_heavy_hitter_recovery() -> None:
    g = torch.Generator().manual_seed(1)
    d = 50_000
    h = 0.01 * torch.randn(d, generator=g)
    heavy = torch.randperm(d, generator=g)[:10]
    h[heavy] = torch.tensor([5.0, -4.0, 3.5, -3.0, 2.5, 6.0, -5.5, 4.5, -2.0, 3.0])
    # A light coordinate is a false positive when it shares a bucket with a heavy
    # one in a majority of rows: ~C(7,4) (10/1000)^4 * d = 0.02 expected here.
    cs = CountSketch(rows=7, cols=1000, recovery="topk", k=10)
    out = cs.decode(cs.encode(h, round=0, seed=5))
    assert set(out.nonzero().view(-1).tolist()) == set(heavy.tolist())
    torch.testing.assert_close(out[heavy], h[heavy], atol=0.15, rtol=0)
    # 7,000 numbers on the wire for a 50,000-dim vector.
    assert cs.encode(h, round=0, seed=5).nnz == 7000
    linear = CountSketch(rows=7, cols=1000).decode(cs.encode(h, round=0, seed=5))
    # The unbiased linear de-sketch spreads noise over all coordinates.
    assert float((linear - h).norm()) > float((out - h).norm())


def test_mean_sketch_equals_mean_of_desketches() -> None:
    cs = CountSketch(rows=3, cols=64)
    hs = [torch.randn(300) for _ in range(4)]
    ps = [cs.encode(h, round=2, seed=7) for h in hs]
    merged = mean_sketch(ps)
    expected = torch.stack([cs.decode(p) for p in ps]).mean(0)
    torch.testing.assert_close(cs.decode(merged), expected, rtol=1e-5, atol=1e-5)
    weighted = mean_sketch(ps, weights=[1, 0, 0, 0])
    torch.testing.assert_close(weighted.values, ps[0].values)
    with pytest.raises(PayloadError, match="differ"):
        mean_sketch([ps[0], cs.encode(hs[0], round=3, seed=7)])
