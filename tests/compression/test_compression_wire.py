"""Wire codec of compressed payloads: round trips, exact sizes, and rejection of
malformed, truncated, out-of-range and non-finite input (it faces the network)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedplat.compression.wire import (
    HEADER_SIZE,
    MAGIC,
    Payload,
    PayloadError,
    SketchSpec,
    dense_payload,
    sketch_payload,
    sparse_payload,
)

HEADER = struct.Struct("<4sBBBBBQQQQQII")


def raw(
    *,
    magic: bytes = MAGIC,
    version: int = 1,
    kind: int = 1,
    dtype: int = 0,
    codec: int = 1,
    method: int = 0,
    d: int = 10,
    n: int = 0,
    index_nbytes: int = 0,
    seed: int = 0,
    rnd: int = 0,
    rows: int = 0,
    cols: int = 0,
    values: bytes = b"",
    index: bytes = b"",
) -> bytes:
    """Hand-built message, so every field can be made wrong on purpose."""
    return (
        HEADER.pack(
            magic,
            version,
            kind,
            dtype,
            codec,
            method,
            d,
            n,
            index_nbytes,
            seed,
            rnd,
            rows,
            cols,
        )
        + values
        + index
    )


def f32(*xs: float) -> bytes:
    return np.asarray(xs, dtype="<f4").tobytes()


def sparse_raw(d: int, deltas: bytes, values: list[float], **kw: Any) -> bytes:
    return raw(
        d=d,
        n=len(values),
        index_nbytes=len(deltas),
        values=f32(*values),
        index=deltas,
        **kw,
    )


def test_header_is_fixed_57_bytes() -> None:
    assert HEADER_SIZE == HEADER.size == 57


def test_sparse_round_trip_and_exact_size() -> None:
    idx = torch.tensor([0, 1, 2, 127, 128, 16_511, 99_999])
    vals = torch.tensor([1.0, -2.0, 3.5, 0.0, 1e-30, -7.0, 2.25])
    p = sparse_payload(100_000, idx, vals)
    assert p.kind == "sparse"
    data = p.to_bytes()
    assert len(data) == p.nbytes
    # deltas 0,1,1,125,1,16383,83488 -> varint bytes 1,1,1,1,1,2,3
    assert p.nbytes == HEADER_SIZE + 7 * 4 + 10
    q = Payload.from_bytes(data, expected_d=100_000)
    assert q.kind == "sparse" and q.d == 100_000
    assert q.indices is not None and torch.equal(q.indices, idx)
    assert torch.equal(q.values, vals)


def test_dense_fallback_when_sparse_is_not_smaller() -> None:
    d = 100
    # 80 values: 80 * 4 + 80 index bytes > 100 * 4 -> dense.
    idx = torch.arange(0, 80)
    p = sparse_payload(d, idx, torch.ones(80))
    assert p.kind == "dense" and p.nbytes == HEADER_SIZE + 400
    expected = torch.zeros(d)
    expected[:80] = 1
    assert torch.equal(p.values, expected)
    # 10 values: clearly sparse.
    assert sparse_payload(d, torch.arange(10), torch.ones(10)).kind == "sparse"


def test_fp16_values_round_trip() -> None:
    vals = torch.tensor([0.5, -1.25, 1000.0], dtype=torch.float16)
    p = sparse_payload(1000, torch.tensor([3, 30, 300]), vals)
    q = Payload.from_bytes(p.to_bytes())
    assert q.values.dtype == torch.float16 and torch.equal(q.values, vals)
    assert p.nbytes == HEADER_SIZE + 3 * 2 + 4


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 5000), st.data(), st.sampled_from([torch.float32, torch.float16]))
def test_sparse_and_dense_round_trip_property(
    d: int, data: st.DataObject, dtype: torch.dtype
) -> None:
    idx_list = sorted(data.draw(st.sets(st.integers(0, d - 1), max_size=min(d, 300))))
    vals = data.draw(
        st.lists(
            st.floats(-1e4, 1e4, width=16),
            min_size=len(idx_list),
            max_size=len(idx_list),
        )
    )
    idx = torch.tensor(idx_list, dtype=torch.int64)
    values = torch.tensor(vals, dtype=dtype)
    p = sparse_payload(d, idx, values)
    blob = p.to_bytes()
    assert len(blob) == p.nbytes
    q = Payload.from_bytes(blob, expected_d=d)
    dense = torch.zeros(d, dtype=dtype)
    dense[idx] = values
    got = (
        q.values
        if q.kind == "dense"
        else torch.zeros(d, dtype=dtype).index_put_((q.indices,), q.values)
    )
    assert torch.equal(got, dense)
    # The choice between the two forms always picks the smaller one.
    dense_size = HEADER_SIZE + d * values.element_size()
    assert p.nbytes <= dense_size


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(["count", "gaussian", "ams"]),
    st.integers(1, 7),
    st.integers(1, 50),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
def test_sketch_round_trip_property(
    method: str, rows: int, cols: int, seed: int, rnd: int
) -> None:
    rows = rows if method == "count" else 1
    spec = SketchSpec(method, rows, cols, seed, rnd)  # type: ignore[arg-type]
    vals = torch.randn(rows * cols)
    p = sketch_payload(spec, 12345, vals)
    q = Payload.from_bytes(
        p.to_bytes(), expected_d=12345, expected_seed=seed, expected_round=rnd
    )
    assert q.sketch == spec and torch.equal(q.values, vals) and q.d == 12345
    assert len(p.to_bytes()) == p.nbytes == HEADER_SIZE + 4 * rows * cols


def test_dense_round_trip() -> None:
    v = torch.randn(1000)
    p = dense_payload(v)
    q = Payload.from_bytes(p.to_bytes(), expected_d=1000, expected_kinds=("dense",))
    assert torch.equal(q.values, v) and p.nbytes == HEADER_SIZE + 4000


# --- rejection -------------------------------------------------------------------


def good_sparse() -> bytes:
    return sparse_payload(
        1000, torch.tensor([5, 200, 999]), torch.tensor([1.0, 2.0, 3.0])
    ).to_bytes()


@pytest.mark.parametrize("cut", range(0, 57 + 12 + 5))
def test_every_truncation_is_rejected(cut: int) -> None:
    data = good_sparse()
    assert len(data) == 57 + 12 + 5  # 3 values, varints 5 | 195 (2 B) | 799 (2 B)
    with pytest.raises(PayloadError):
        Payload.from_bytes(data[:cut])


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (good_sparse() + b"\x00", "trailing"),
        (b"XXXX" + good_sparse()[4:], "magic"),
        (raw(version=2), "version"),
        (raw(kind=7), "kind"),
        (raw(dtype=5), "dtype"),
        (raw(kind=1, codec=0), "codec"),
        (raw(kind=0, codec=1, d=1, n=1, values=f32(1.0)), "index block"),
        (raw(kind=0, codec=0, d=2, n=1, values=f32(1.0)), "dense payload has 1"),
        (raw(kind=0, codec=0, d=1, n=1, seed=3, values=f32(1.0)), "sketch fields"),
        (sparse_raw(1000, b"\x01\x81\x01", [1.0, 2.0, 3.0]), "holds 2 varints"),
        (sparse_raw(10, b"\x01\x81", [1.0, 2.0]), "unterminated"),
        (sparse_raw(10, b"\x01\x80\x00", [1.0, 2.0]), "minimally"),
        (sparse_raw(10, b"\x0a", [1.0]), "out of range"),
        (sparse_raw(10, b"\x05\x05", [1.0, 2.0]), "out of range"),
        (sparse_raw(10, b"\x03\x00", [1.0, 2.0]), "strictly increasing"),
        (sparse_raw(2, b"\x00\x01\x01", [1.0, 2.0, 3.0]), "3 values for dimension 2"),
        (sparse_raw(10, b"\x01", [float("nan")]), "non-finite"),
        (sparse_raw(10, b"\x01", [float("inf")]), "non-finite"),
        (raw(kind=0, codec=0, d=2, n=2, values=f32(1.0, float("-inf"))), "non-finite"),
        (
            raw(kind=2, codec=0, method=9, d=5, n=1, rows=1, cols=1, values=f32(1.0)),
            "method",
        ),
        (
            raw(
                kind=2, codec=0, method=1, d=5, n=3, rows=2, cols=2, values=f32(1, 2, 3)
            ),
            "spec needs 2x2",
        ),
        (
            raw(
                kind=2,
                codec=0,
                method=2,
                d=5,
                n=4,
                rows=2,
                cols=2,
                values=f32(1, 2, 3, 4),
            ),
            "rows == 1",
        ),
        (raw(d=(1 << 48) + 1), "exceeds"),
        (
            raw(kind=1, d=10, n=2, index_nbytes=1, values=f32(1, 2), index=b"\x01"),
            "index block of 1 bytes",
        ),
    ],
)
def test_malformed_payloads_are_rejected_with_a_reason(
    blob: bytes, reason: str
) -> None:
    with pytest.raises(PayloadError, match=reason):
        Payload.from_bytes(blob)


def test_declared_dimension_and_kind_and_round_must_match() -> None:
    data = good_sparse()
    with pytest.raises(PayloadError, match="expected 999"):
        Payload.from_bytes(data, expected_d=999)
    with pytest.raises(PayloadError, match="not accepted"):
        Payload.from_bytes(data, expected_kinds=("dense",))
    sk = sketch_payload(SketchSpec("count", 1, 3, 7, 2), 10, torch.ones(3)).to_bytes()
    with pytest.raises(PayloadError, match="seed 7, expected 8"):
        Payload.from_bytes(sk, expected_seed=8)
    with pytest.raises(PayloadError, match="round 2, expected 3"):
        Payload.from_bytes(sk, expected_round=3)


def test_huge_declared_sizes_do_not_allocate() -> None:
    # Claims 2^40 dense values in a 57-byte message: rejected on length alone.
    blob = raw(kind=0, codec=0, d=1 << 40, n=1 << 40)
    with pytest.raises(PayloadError, match="truncated"):
        Payload.from_bytes(blob)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_corruption_raises_only_payload_error(data: st.DataObject) -> None:
    blob = bytearray(good_sparse())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    try:
        p = Payload.from_bytes(bytes(blob))
    except PayloadError:
        return
    # Whatever parsed is internally consistent and re-encodes to the same bytes.
    assert p.to_bytes() == bytes(blob)


def test_payload_constructor_validates() -> None:
    with pytest.raises(PayloadError, match="strictly increasing"):
        Payload("sparse", 10, torch.ones(2), torch.tensor([3, 3]))
    with pytest.raises(PayloadError, match="out of range"):
        Payload("sparse", 10, torch.ones(1), torch.tensor([10]))
    with pytest.raises(PayloadError, match="exactly d"):
        Payload("dense", 10, torch.ones(3))
    with pytest.raises(PayloadError, match="float32/float16"):
        Payload("dense", 3, torch.ones(3, dtype=torch.float64))


def test_huge_but_finite_values_are_accepted() -> None:
    # Their float32 sum overflows to Inf: the fast finiteness check must fall
    # back to the exact one instead of rejecting them.
    v = torch.tensor([3e38, 3e38, -1.0])
    assert Payload.from_bytes(dense_payload(v).to_bytes()).values[0] == 3e38
    with pytest.raises(PayloadError, match="1 non-finite"):
        Payload.from_bytes(
            raw(kind=0, codec=0, d=3, n=3, values=f32(3e38, float("nan"), 1.0))
        )
