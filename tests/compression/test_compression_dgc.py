"""Deep Gradient Compression: faithful to the recipe of Lin, Han, Mao, Wang & Dally,
"Deep Gradient Compression: Reducing the Communication Bandwidth for Distributed
Training", ICLR 2018 (arXiv 1712.01887), Sec. 3."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedplat.compression import (
    DGC,
    PAPER_WARMUP_DENSITIES,
    CompressionError,
    Payload,
    load_state,
    sampled_topk,
    save_state,
)
from fedplat.compression.dgc import local_clip_norm
from fedplat.compression.selection import sample_stride
from fedplat.vectors import Layout, TensorSpec


def quad_grad(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Gradient of 0.5 ||A w - b||^2: deterministic, depends on the trajectory."""
    return a.t() @ (a @ w - b)


@pytest.mark.parametrize("with_layout", [False, True])
def test_ratio_one_is_exactly_momentum_sgd(with_layout: bool) -> None:
    torch.manual_seed(0)
    d, lr, m = 60, 0.01, 0.9
    a, b = torch.randn(40, d), torch.randn(40)
    layout = Layout((TensorSpec("w", (5, 10)), TensorSpec("b", (10,))))
    w_ref = torch.nn.Parameter(torch.zeros(d))
    opt = torch.optim.SGD([w_ref], lr=lr, momentum=m)
    w = torch.zeros(d)
    dgc = DGC(1.0, momentum=m, layout=layout if with_layout else None)
    for _ in range(25):
        w_ref.grad = quad_grad(w_ref.detach(), a, b)
        opt.step()
        payload = dgc.step(quad_grad(w, a, b))
        w.add_(dgc.decode(Payload.from_bytes(payload.to_bytes())), alpha=-lr)
    assert torch.equal(w, w_ref.detach())


def test_ratio_one_nesterov_matches_torch_nesterov() -> None:
    torch.manual_seed(1)
    d, lr, m = 30, 0.01, 0.9
    a, b = torch.randn(20, d), torch.randn(20)
    w_ref = torch.nn.Parameter(torch.zeros(d))
    opt = torch.optim.SGD([w_ref], lr=lr, momentum=m, nesterov=True)
    w = torch.zeros(d)
    dgc = DGC(1.0, momentum=m, nesterov=True)
    for _ in range(25):
        w_ref.grad = quad_grad(w_ref.detach(), a, b)
        opt.step()
        w.add_(dgc.decode(dgc.step(quad_grad(w, a, b))), alpha=-lr)
    # u <- m (u + g) is m * buf of torch's form, up to float rounding.
    torch.testing.assert_close(w, w_ref.detach(), rtol=1e-5, atol=1e-6)


def test_warmup_schedule_is_the_papers() -> None:
    dgc = DGC(0.001)
    densities = [dgc.density_at(s) for s in range(7)]
    assert densities == [0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001, 0.001]
    sparsity = [1 - x for x in densities[:5]]
    assert sparsity == pytest.approx([0.75, 0.9375, 0.984375, 0.996, 0.999], abs=1e-4)
    assert PAPER_WARMUP_DENSITIES == (0.25, 0.0625, 0.015625, 0.00390625)
    slow = DGC(0.001, warmup_steps_per_stage=3)
    assert [slow.density_at(s) for s in (0, 2, 3, 11, 12)] == [
        0.25,
        0.25,
        0.0625,
        0.00390625,
        0.001,
    ]
    assert DGC(0.01, warmup_densities=()).density_at(0) == 0.01
    # Never sparser than the target during warm-up.
    assert DGC(0.1).density_at(2) == 0.1


def test_warmup_counter_drives_what_is_sent() -> None:
    torch.manual_seed(2)
    d = 200_000
    dgc = DGC(0.001)
    for step in range(6):
        assert dgc.state.warmup_step == step
        k = math.ceil(d * dgc.density())
        p = dgc.step(torch.randn(d))
        assert 0.8 * k <= p.nnz <= k
        assert dgc.state.last_sent == p.nnz
    assert dgc.state.warmup_step == 6


@pytest.mark.parametrize("momentum_masking", [True, False])
def test_momentum_factor_masking_zeroes_exactly_the_sent_coordinates(
    momentum_masking: bool,
) -> None:
    torch.manual_seed(3)
    d, m = 20_000, 0.9
    dgc = DGC(0.01, momentum=m, momentum_masking=momentum_masking, warmup_densities=())
    for _ in range(3):
        dgc.step(torch.randn(d))
    assert dgc.state.momentum is not None and dgc.state.velocity is not None
    u0, v0 = dgc.state.momentum.clone(), dgc.state.velocity.clone()
    g = torch.randn(d)
    p = dgc.step(g)
    u_corr = m * u0 + g  # momentum correction, Eq. 6-7
    v_corr = v0 + u_corr
    assert p.kind == "sparse" and p.indices is not None
    sent = torch.zeros(d, dtype=torch.bool)
    sent[p.indices] = True
    torch.testing.assert_close(p.values, v_corr[p.indices])
    u, v = dgc.state.momentum, dgc.state.velocity
    assert bool((v[sent] == 0).all())
    torch.testing.assert_close(v[~sent], v_corr[~sent])
    assert bool((v[~sent] != 0).all())
    if momentum_masking:
        assert bool((u[sent] == 0).all())
        torch.testing.assert_close(u[~sent], u_corr[~sent])
    else:
        torch.testing.assert_close(u, u_corr)


def test_sent_entries_are_the_largest_velocities() -> None:
    torch.manual_seed(4)
    d = 50_000
    dgc = DGC(0.001, warmup_densities=())
    g = torch.randn(d)
    p = dgc.step(g)
    assert p.indices is not None
    # First step: v = g; every sent |v| is at least the smallest-k-th magnitude
    # among the top 1.3 k.
    kth = torch.topk(g.abs(), math.ceil(1.3 * 50)).values[-1]
    assert bool((p.values.abs() >= kth).all())


def test_only_multi_dim_tensors_are_sparsified() -> None:
    torch.manual_seed(5)
    layout = Layout(
        (
            TensorSpec("conv", (16, 3, 5, 5)),
            TensorSpec("conv.bias", (16,)),
            TensorSpec("fc", (100, 400)),
            TensorSpec("fc.bias", (100,)),
        )
    )
    d = layout.numel
    dgc = DGC(0.001, layout=layout, warmup_densities=())
    p = dgc.step(torch.randn(d))
    assert p.kind == "sparse" and p.indices is not None
    offs = dict(zip(layout.names, layout.offsets(), strict=True))
    for name in ("conv.bias", "fc.bias"):
        a, b = offs[name]
        got = p.indices[(p.indices >= a) & (p.indices < b)]
        assert torch.equal(got, torch.arange(a, b))
    for name, numel in (("conv", 1200), ("fc", 40_000)):
        a, b = offs[name]
        n = int(((p.indices >= a) & (p.indices < b)).sum())
        k = math.ceil(numel * 0.001)
        assert 0.8 * k <= n <= k
    with pytest.raises(CompressionError, match="expected"):
        dgc.step(torch.randn(d + 1))


def draw(dist: str, n: int, g: torch.Generator) -> torch.Tensor:
    """Gradient-like vectors: light, heavy and extremely heavy tails, sparse."""
    u = torch.rand(n, generator=g)
    z = torch.randn(n, generator=g)
    return {
        "normal": lambda: z,
        "uniform": lambda: u,
        "laplace": lambda: torch.log(u) * torch.sign(z),
        "cauchy": lambda: torch.tan(math.pi * (u - 0.5)),
        "lognormal": lambda: torch.exp(2 * z),
        "spiky": lambda: z * (u < 0.02),
    }[dist]()


@pytest.mark.parametrize(
    "dist", ["normal", "uniform", "laplace", "cauchy", "lognormal", "spiky"]
)
@pytest.mark.parametrize("ratio", [0.001, 0.01])
def test_sampled_threshold_keeps_between_08k_and_13k(dist: str, ratio: float) -> None:
    n = 300_000
    k = math.ceil(n * ratio)
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        imp = draw(dist, n, g).abs()
        sel = sampled_topk(imp, k, generator=g)
        assert 0.8 * k <= sel.candidates <= 1.3 * k, (seed, sel)
        assert sel.indices.numel() == min(k, sel.candidates)
        assert len(set(sel.indices.tolist())) == sel.indices.numel()
        if not sel.exact_fallback:
            # Without the exact fallback every pick passes the final threshold.
            assert bool((imp[sel.indices] >= sel.threshold).all())


def test_sample_stride_follows_reference() -> None:
    # 10M entries at 0.1%: 1% = 100k samples; stride ceil(100/32)*32+1 = 129
    # gives 77k < 100k, so it shrinks by 8 until enough fit: 97 -> 103k.
    assert sample_stride(10_000_000, 0.001) == (97, 103_092)
    # Tiny tensors are sampled entirely.
    assert sample_stride(1500, 0.001) == (1, 1500)


def test_state_round_trip_continues_identically(tmp_path: Path) -> None:
    torch.manual_seed(6)
    d = 30_000
    grads = [torch.randn(d) for _ in range(8)]
    a = DGC(0.001, nesterov=True, clip_norm=50.0)
    for g in grads[:4]:
        a.step(g)
    save_state(tmp_path / "dgc.safetensors", a.state_dict())
    b = DGC(0.001, nesterov=True, clip_norm=50.0)
    b.load_state_dict(load_state(tmp_path / "dgc.safetensors"))
    for g in grads[4:]:
        assert a.step(g).to_bytes() == b.step(g).to_bytes()
    # Federated mode is deterministic in (state, round, seed) too.
    sd = a.state_dict()
    c = DGC(0.001, nesterov=True, clip_norm=50.0)
    c.load_state_dict(sd)
    assert (
        a.encode(grads[0], round=9, seed=1).to_bytes()
        == c.encode(grads[0], round=9, seed=1).to_bytes()
    )


def test_load_state_rejects_bad_state() -> None:
    dgc = DGC(0.01)
    with pytest.raises(CompressionError, match="unknown keys"):
        dgc.load_state_dict({"warmup_stpe": 3})
    with pytest.raises(CompressionError, match="equal-size"):
        dgc.load_state_dict({"momentum": torch.zeros(3)})
    with pytest.raises(CompressionError, match="non-finite"):
        dgc.load_state_dict(
            {"momentum": torch.full((3,), float("nan")), "velocity": torch.zeros(3)}
        )
    with pytest.raises(CompressionError, match="non-negative"):
        dgc.load_state_dict({"warmup_step": -1})


def test_non_finite_gradient_is_rejected_before_touching_state() -> None:
    dgc = DGC(0.01)
    dgc.step(torch.ones(100))
    before = dgc.state_dict()
    g = torch.ones(100)
    g[3] = float("nan")
    with pytest.raises(CompressionError, match="non-finite"):
        dgc.step(g)
    after = dgc.state_dict()
    assert after["warmup_step"] == before["warmup_step"]
    assert torch.equal(after["momentum"], before["momentum"])  # type: ignore[arg-type]


def test_local_gradient_clipping() -> None:
    dgc = DGC(1.0, clip_norm=2.0)
    out = dgc.decode(dgc.step(torch.full((100,), 10.0)))  # ||g|| = 100
    assert float(out.norm()) == pytest.approx(2.0, rel=1e-5)
    assert local_clip_norm(8.0, 4) == 4.0


def test_ablation_without_momentum_correction_accumulates_raw_gradients() -> None:
    d = 10_000
    dgc = DGC(0.001, momentum_correction=False, warmup_densities=())
    g = torch.randn(d, generator=torch.Generator().manual_seed(7))
    p1 = dgc.step(g)
    p2 = dgc.step(g)
    assert dgc.state.velocity is not None and p1.indices is not None
    sent = torch.zeros(d, dtype=torch.bool)
    sent[p1.indices] = True
    assert p2.indices is not None
    sent2 = torch.zeros(d, dtype=torch.bool)
    sent2[p2.indices] = True
    expected = torch.where(sent, g, 2 * g)
    expected[sent2] = 0
    torch.testing.assert_close(dgc.state.velocity, expected)
    assert dgc.state.momentum is not None
    assert bool((dgc.state.momentum == 0).all())


def test_sparse_dgc_training_tracks_dense_momentum_sgd() -> None:
    """Per-step mode on a least-squares problem: sparse DGC still converges.

    The step size is kept well inside the stable range: sparse updates are
    delayed updates (a coordinate waits ~1/density steps), and on a strongly
    coupled quadratic a step size near dense SGD's limit diverges.
    """
    torch.manual_seed(8)
    d, lr, m = 100, 1e-4, 0.9
    a, b = torch.randn(300, d), torch.randn(300)
    w_star = torch.linalg.lstsq(a, b.unsqueeze(1)).solution.squeeze(1)
    loss = lambda w: float(0.5 * ((a @ w - b) ** 2).sum())  # noqa: E731
    q, c = a.t() @ a, a.t() @ b  # grad = Q w - c, cheaper than two matvecs
    w_sgd, buf = torch.zeros(d), torch.zeros(d)
    w = torch.zeros(d)
    dgc = DGC(0.1, momentum=m, warmup_steps_per_stage=10)
    for _ in range(300):
        buf.mul_(m).add_(q @ w_sgd - c)
        w_sgd.add_(buf, alpha=-lr)
        w.add_(dgc.decode(dgc.step(q @ w - c)), alpha=-lr)
    gap0 = loss(torch.zeros(d)) - loss(w_star)
    assert loss(w_sgd) - loss(w_star) < 1e-4 * gap0
    # 90%-sparse DGC (after warm-up) closes the gap as well.
    assert loss(w) - loss(w_star) < 1e-3 * gap0


def test_federated_warmup_follows_the_round_number_not_participation() -> None:
    # A client that sits out rounds must use the run's current stage: rounds
    # 1-2 are stage 0 (25%), 3-4 stage 1 (6.25%), ... with 2 rounds per stage.
    d = 40_000
    dgc = DGC(0.001, warmup_steps_per_stage=2)
    gen = torch.Generator().manual_seed(5)
    for rnd in (1, 5, 9, 10, 11):
        p = dgc.encode(torch.randn(d, generator=gen), round=rnd, seed=3)
        k = math.ceil(d * dgc.density_at(rnd - 1))
        assert 0.8 * k <= p.nnz <= k, rnd
    densities = [dgc.density_at(r - 1) for r in (1, 5, 9, 11)]
    assert densities == [0.25, 0.015625, 0.001, 0.001]
    assert dgc.state.warmup_step == 5  # still counts calls (statistics, step mode)


def test_layout_reaches_a_dgc_inside_the_fp16_wrapper() -> None:
    from fedplat.compression import create_compressor

    layout = Layout([TensorSpec("w", (100, 50)), TensorSpec("b", (50,))])
    dgc = {"ratio": 0.01, "warmup_densities": []}
    for name, params in [
        ("dgc", dgc),
        ("fp16", {"inner": "dgc", "inner_params": dgc}),
    ]:
        comp = create_compressor(name, layout=layout, **params)
        p = comp.encode(torch.randn(layout.numel), round=1, seed=0)
        # The bias (1-D) travels dense, the matrix at 1%.
        dense = comp.decode(p)
        assert torch.count_nonzero(dense[5000:]) == 50, name
        assert torch.count_nonzero(dense[:5000]) <= 50, name
    # A layout set explicitly in the params wins; a factory without one ignores it.
    create_compressor("topk", layout=layout, ratio=0.1)


def test_tensors_under_the_size_threshold_go_dense_with_local_momentum() -> None:
    # Lin et al. 2018: small layers are not worth sparsifying. A 4x4 matrix under
    # min_sparse_numel=20 behaves like a bias (dense, u <- m u + g sent); the 8x8
    # matrix above it is sparsified to ceil(64 * 0.1) = 7 entries.
    from fedplat.vectors import Layout, TensorSpec

    layout = Layout((TensorSpec("small", (4, 4)), TensorSpec("big", (8, 8))))
    dgc = DGC(
        0.1, momentum=0.5, warmup_densities=(), layout=layout, min_sparse_numel=20
    )
    g = torch.arange(1.0, 81.0)
    first = dgc.encode(g, round=1, seed=0)
    assert first.indices is not None
    assert torch.equal(first.indices[:16], torch.arange(16))
    assert first.nnz == 16 + 7
    second = dgc.encode(g, round=2, seed=0)
    assert torch.allclose(second.values[:16], 1.5 * g[:16])  # u = 0.5 g + g
    with pytest.raises(CompressionError, match="min_sparse_numel"):
        DGC(0.1, min_sparse_numel=0)
