"""Identity, fp16 wrapper, top-k with error feedback, the registry, state files,
and the import rule (algorithm packages never import grpc/protobuf/SQLAlchemy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.compression import (
    FP16,
    CompressionError,
    Compressor,
    Identity,
    Payload,
    TopK,
    available_compressors,
    create_compressor,
    load_state,
    register_compressor,
    save_state,
)
from fedplat.vectors import Layout, TensorSpec

ALL: dict[str, dict[str, Any]] = {
    "identity": {},
    "topk": {"ratio": 0.05},
    "dgc": {"ratio": 0.01},
    "countsketch": {"rows": 3, "cols": 64},
    "gaussian_sketch": {"b": 16},
    "ams_sketch": {"b": 16},
    "fp16": {"inner": "topk", "inner_params": {"ratio": 0.1}},
}


def test_every_registered_compressor_round_trips_through_bytes() -> None:
    assert set(available_compressors()) == set(ALL)
    v = torch.randn(700)
    for name, params in ALL.items():
        c = create_compressor(name, **params)
        assert isinstance(c, Compressor)
        p = c.encode(v, round=1, seed=2)
        blob = p.to_bytes()
        assert len(blob) == p.nbytes
        out = c.decode(Payload.from_bytes(blob, expected_d=700))
        assert out.shape == (700,) and out.dtype == torch.float32
        assert bool(torch.isfinite(out).all())


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=400),
    st.integers(1, 50),
)
def test_identity_and_topk_round_trip_property(xs: list[float], k: int) -> None:
    v = torch.tensor(xs, dtype=torch.float32)
    ident = Identity()
    assert torch.equal(
        ident.decode(Payload.from_bytes(ident.encode(v, round=0, seed=0).to_bytes())), v
    )
    tk = TopK(k=k)
    out = tk.decode(Payload.from_bytes(tk.encode(v, round=0, seed=0).to_bytes()))
    kept = out != 0
    # Sent values are exact, and no unsent entry is larger than a sent one.
    assert torch.equal(out[kept], v[kept])
    if int(kept.sum()) and int((~kept).sum()):
        assert float(v[~kept].abs().max()) <= float(v[kept].abs().min())


def test_topk_error_feedback_conserves_mass() -> None:
    g = torch.Generator().manual_seed(0)
    tk = TopK(0.01)
    total_in = torch.zeros(5000)
    total_out = torch.zeros(5000)
    for t in range(20):
        v = torch.randn(5000, generator=g)
        total_in += v
        total_out += tk.decode(tk.encode(v, round=t, seed=0))
    assert tk.state.residual is not None
    torch.testing.assert_close(
        total_out + tk.state.residual, total_in, rtol=1e-5, atol=1e-4
    )
    no_ef = TopK(0.01, error_feedback=False)
    no_ef.encode(torch.randn(5000), round=0, seed=0)
    assert no_ef.state.residual is None


def test_topk_sampled_selection_and_state_round_trip(tmp_path: Path) -> None:
    vs = [torch.randn(100_000) for _ in range(4)]
    a = TopK(0.001, selection="sampled")
    p = a.encode(vs[0], round=0, seed=1)
    assert 80 <= p.nnz <= 100
    save_state(tmp_path / "tk.safetensors", a.state_dict())
    b = TopK(0.001, selection="sampled")
    b.load_state_dict(load_state(tmp_path / "tk.safetensors"))
    for t, v in enumerate(vs[1:]):
        assert (
            a.encode(v, round=t, seed=1).to_bytes()
            == b.encode(v, round=t, seed=1).to_bytes()
        )


def test_fp16_wrapper_halves_values_and_keeps_inner_state() -> None:
    v = torch.randn(10_000)
    inner = TopK(0.01)
    wrapped = FP16(inner)
    p = wrapped.encode(v, round=0, seed=0)
    plain = TopK(0.01).encode(v, round=0, seed=0)
    assert p.values.dtype == torch.float16
    assert p.nbytes < plain.nbytes
    torch.testing.assert_close(
        wrapped.decode(p), TopK(0.01).decode(plain), rtol=1e-3, atol=1e-3
    )
    # The residual keeps float32 precision (the wire rounding is not fed back).
    assert inner.state.residual is not None
    assert inner.state.residual.dtype == torch.float32
    assert wrapped.state_dict().keys() == inner.state_dict().keys()
    # Values beyond float16's range stay float32 instead of becoming Inf.
    big = FP16(Identity()).encode(torch.tensor([1e6, 1.0]), round=0, seed=0)
    assert big.values.dtype == torch.float32
    assert Payload.from_bytes(big.to_bytes()).values[0] == 1e6


def test_registry_rejects_duplicates_unknown_names_and_keys() -> None:
    with pytest.raises(CompressionError, match="already registered"):
        register_compressor("topk", TopK)
    with pytest.raises(CompressionError, match=r"unknown compressor 'top_k'.*topk"):
        create_compressor("top_k")
    with pytest.raises(
        CompressionError, match=r"unknown parameter\(s\) 'ratoi'.*accepted: ratio"
    ):
        create_compressor("topk", ratoi=0.1)
    with pytest.raises(CompressionError, match="momentum_correction"):
        create_compressor("dgc", momentum_corection=False)
    with pytest.raises(CompressionError, match="ratio must be in"):
        create_compressor("dgc", ratio=2.0)


def test_registry_builds_dgc_from_config_values() -> None:
    layout = Layout((TensorSpec("w", (10, 10)), TensorSpec("b", (10,))))
    c = create_compressor(
        "dgc",
        ratio=0.01,
        layout=layout.to_dict(),
        warmup_densities=[0.5],
        nesterov=True,
        min_sparse_numel=100,  # the 10x10 matrix is just large enough to sparsify
    )
    p = c.encode(torch.randn(110), round=0, seed=0)
    # All 10 bias entries + 0.8k..k of the 50 picked from the matrix.
    assert p.indices is not None
    assert torch.equal(p.indices[-10:], torch.arange(100, 110))
    assert 40 + 10 <= p.nnz <= 50 + 10
    # By default a tensor under 1,024 entries travels dense (layer-size threshold).
    small = create_compressor("dgc", ratio=0.01, layout=layout.to_dict())
    assert small.encode(torch.randn(110), round=9, seed=0).nnz == 110
    wrapped = create_compressor("fp16", inner="dgc", inner_params={"ratio": 0.5})
    assert isinstance(wrapped, FP16)


def test_state_file_holds_tensors_and_scalars(tmp_path: Path) -> None:
    state: dict[str, Any] = {
        "residual": torch.arange(5, dtype=torch.float32),
        "steps": 3,
        "name": "x",
        "flag": True,
        "lr": 0.5,
    }
    save_state(tmp_path / "s.safetensors", state)
    back = load_state(tmp_path / "s.safetensors")
    assert back.keys() == state.keys()
    assert torch.equal(back["residual"], state["residual"])  # type: ignore[arg-type]
    scalars = (back["steps"], back["name"], back["flag"], back["lr"])
    assert scalars == (3, "x", True, 0.5)
    with pytest.raises(CompressionError, match="unsupported type"):
        save_state(tmp_path / "bad.safetensors", {"x": [1, 2]})  # type: ignore[dict-item]


def test_encode_rejects_bad_vectors() -> None:
    for c in (Identity(), TopK(0.1), create_compressor("countsketch")):
        with pytest.raises(CompressionError, match="flat"):
            c.encode(torch.ones(2, 2), round=0, seed=0)
        with pytest.raises(CompressionError, match="float32"):
            c.encode(torch.ones(4, dtype=torch.float64), round=0, seed=0)
        with pytest.raises(CompressionError, match="non-finite"):
            c.encode(torch.tensor([1.0, float("inf")]), round=0, seed=0)


def test_algorithm_packages_do_not_import_network_or_db_stacks() -> None:
    code = (
        "import sys, fedplat.compression, fedplat.privacy; "
        "bad = [m for m in ('grpc', 'google.protobuf', 'sqlalchemy', 'opacus') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
