"""Compressed payloads and their wire codec: little-endian raw bytes, no pickle/JSON.

A :class:`Payload` is what a compressor hands to the transport: a dense vector, a
sparse ``(indices, values)`` pair, or a sketch. ``to_bytes`` / ``from_bytes`` are the
only conversions to and from bytes; ``from_bytes`` faces the network and validates
every field before allocating anything sized by the sender.

Layout on the wire (all integers little-endian), a fixed 57-byte header::

    offset size field
    0      4    magic  b"FPW1"
    4      1    version (1)
    5      1    kind            0 dense, 1 sparse, 2 sketch
    6      1    value dtype     0 float32, 1 float16
    7      1    index codec     0 none, 1 delta + LEB128 varint (sparse only)
    8      1    sketch method   0 none, 1 count, 2 gaussian, 3 ams
    9      8    d               length of the decoded vector
    17     8    n               number of values that follow the header
    25     8    index bytes     length of the index block (sparse only, else 0)
    33     8    seed            shared sketch seed   (sketch only, else 0)
    41     8    round           round of the sketch  (sketch only, else 0)
    49     4    rows            sketch rows          (sketch only, else 0)
    53     4    cols            sketch columns       (sketch only, else 0)
    57          values (n * 4 or n * 2 bytes), then the index block

Sparse indices are sorted, delta-encoded (the first delta is the first index) and
written as unsigned LEB128 varints. Varint rather than fixed-width bit packing because
DGC's index sets mix two regimes: whole tensors sent densely (Lin et al. 2018, Sec. 3
sends biases and norms uncompressed), whose deltas are 1 and cost one byte each, and
sparse picks at 0.1% density whose gaps (~1000) cost two bytes. A fixed bit width
would pay the largest gap's width (often 20+ bits) for every index, runs included.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal

import numpy as np
import torch

from fedplat.compression.index_codec import (
    MAX_VARINT_BYTES,
    IndexCodecError,
    check_sorted_in_range,
    deltas,
    varint_decode,
    varint_encode,
    varint_size,
)
from fedplat.vectors import check_finite

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "Payload",
    "PayloadError",
    "PayloadHeader",
    "PayloadKind",
    "SketchMethod",
    "SketchSpec",
    "dense_header",
    "dense_payload",
    "dense_size",
    "parse_header",
    "sketch_payload",
    "sparse_payload",
    "varint_size",
]

PayloadKind = Literal["dense", "sparse", "sketch"]
SketchMethod = Literal["count", "gaussian", "ams"]

MAGIC = b"FPW1"
_VERSION = 1
_HEADER = struct.Struct("<4sBBBBBQQQQQII")
HEADER_SIZE = _HEADER.size  # 57

_KIND_NAMES: dict[int, PayloadKind] = {0: "dense", 1: "sparse", 2: "sketch"}
_KIND_CODES: dict[str, int] = {v: k for k, v in _KIND_NAMES.items()}
_DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.float16: 1}
_DTYPE_BY_CODE = {0: (torch.float32, "<f4", 4), 1: (torch.float16, "<f2", 2)}
_INDEX_NONE, _INDEX_VARINT = 0, 1
_METHOD_NAMES: dict[int, SketchMethod] = {1: "count", 2: "gaussian", 3: "ams"}
_METHOD_CODES: dict[str, int] = {v: k for k, v in _METHOD_NAMES.items()}

_U64 = 1 << 64
_U32 = 1 << 32
# Sanity bound on the declared dimension (2^48 floats is far beyond any model here).
MAX_D = 1 << 48


class PayloadError(ValueError):
    """A payload is malformed, truncated or inconsistent; the message says why."""


@dataclass(frozen=True)
class SketchSpec:
    """What the coordinator needs to rebuild the sketch matrix ``R`` of one round.

    ``R`` is a pure function of ``(method, rows, cols, d, seed, round)``; the
    sketch values on the wire are ``R @ h`` flattened to ``[rows * cols]``.
    Gaussian and AMS sketches have ``rows == 1`` and ``cols == b``.
    """

    method: SketchMethod
    rows: int
    cols: int
    seed: int
    round: int

    def __post_init__(self) -> None:
        if self.method not in _METHOD_CODES:
            raise PayloadError(
                f"unknown sketch method {self.method!r}; valid: {sorted(_METHOD_CODES)}"
            )
        if not 1 <= self.rows < _U32 or not 1 <= self.cols < _U32:
            raise PayloadError(f"sketch shape {self.rows}x{self.cols} out of range")
        if self.method != "count" and self.rows != 1:
            raise PayloadError(f"{self.method} sketch must have rows == 1")
        if not 0 <= self.seed < _U64 or not 0 <= self.round < _U64:
            raise PayloadError("sketch seed and round must fit in 64 unsigned bits")

    @property
    def size(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True, eq=False)
class Payload:
    """One compressed vector, ready for :meth:`to_bytes`.

    Attributes
    ----------
    kind : {"dense", "sparse", "sketch"}
    d : int
        Length of the decoded vector ``[d]``.
    values : torch.Tensor
        float32 or float16, 1-D: ``[d]`` (dense), ``[nnz]`` (sparse) or
        ``[rows * cols]`` (sketch, row-major).
    indices : torch.Tensor or None
        int64 ``[nnz]``, strictly increasing, in ``[0, d)``; sparse only.
    sketch : SketchSpec or None
        Sketch only.
    """

    kind: PayloadKind
    d: int
    values: torch.Tensor
    indices: torch.Tensor | None = None
    sketch: SketchSpec | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KIND_CODES:
            raise PayloadError(f"unknown payload kind {self.kind!r}")
        if not 0 <= self.d <= MAX_D:
            raise PayloadError(f"dimension {self.d} out of range [0, {MAX_D}]")
        v = self.values
        if v.dim() != 1 or v.dtype not in _DTYPE_CODES or v.device.type != "cpu":
            raise PayloadError(
                f"values must be a 1-D float32/float16 CPU tensor, got "
                f"{tuple(v.shape)} {v.dtype} on {v.device}"
            )
        if self.kind == "dense":
            if v.numel() != self.d or self.indices is not None or self.sketch:
                raise PayloadError(f"dense payload needs exactly d={self.d} values")
        elif self.kind == "sparse":
            idx = self.indices
            if idx is None or idx.dim() != 1 or idx.dtype != torch.int64:
                raise PayloadError("sparse payload needs 1-D int64 indices")
            if idx.numel() != v.numel() or self.sketch is not None:
                raise PayloadError(
                    f"sparse payload has {idx.numel()} indices for {v.numel()} values"
                )
            try:
                check_sorted_in_range(idx.numpy(), self.d)
            except IndexCodecError as exc:
                raise PayloadError(str(exc)) from None
        else:
            if self.sketch is None or self.indices is not None:
                raise PayloadError("sketch payload needs a SketchSpec and no indices")
            if v.numel() != self.sketch.size:
                raise PayloadError(
                    f"sketch payload has {v.numel()} values, spec needs "
                    f"{self.sketch.rows}x{self.sketch.cols}"
                )

    @property
    def nnz(self) -> int:
        """Number of values carried (``d`` for dense payloads)."""
        return int(self.values.numel())

    @cached_property
    def _index_block(self) -> bytes:
        if self.kind != "sparse":
            return b""
        assert self.indices is not None
        return varint_encode(deltas(self.indices.numpy()))

    @property
    def nbytes(self) -> int:
        """Exact length of :meth:`to_bytes` (header included)."""
        return (
            HEADER_SIZE + self.nnz * self.values.element_size() + len(self._index_block)
        )

    def to_bytes(self) -> bytes:
        """Serialise to the wire format described in the module docstring."""
        spec = self.sketch
        header = _HEADER.pack(
            MAGIC,
            _VERSION,
            _KIND_CODES[self.kind],
            _DTYPE_CODES[self.values.dtype],
            _INDEX_VARINT if self.kind == "sparse" else _INDEX_NONE,
            _METHOD_CODES[spec.method] if spec else 0,
            self.d,
            self.nnz,
            len(self._index_block),
            spec.seed if spec else 0,
            spec.round if spec else 0,
            spec.rows if spec else 0,
            spec.cols if spec else 0,
        )
        np_dtype = _DTYPE_BY_CODE[_DTYPE_CODES[self.values.dtype]][1]
        vals = self.values.detach().contiguous().numpy().astype(np_dtype, copy=False)
        # join() reads the array's buffer directly: one copy of the values.
        return b"".join((header, vals.data.cast("B"), self._index_block))

    @classmethod
    def from_bytes(
        cls,
        data: bytes | bytearray | memoryview,
        *,
        expected_d: int | None = None,
        expected_kinds: tuple[PayloadKind, ...] | None = None,
        expected_seed: int | None = None,
        expected_round: int | None = None,
    ) -> Payload:
        """Parse and validate untrusted bytes.

        Parameters
        ----------
        data : bytes
            The received message.
        expected_d : int, optional
            Dimension the receiver's model has; a different declared ``d`` is
            rejected.
        expected_kinds : tuple of str, optional
            Payload kinds the receiver accepts.
        expected_seed, expected_round : int, optional
            For sketches: the seed and round the coordinator handed out.

        Raises
        ------
        PayloadError
            With the reason, on any inconsistency.
        """
        # A receive buffer is parsed in place: every value is copied out of it
        # below, so nothing keeps a view of the caller's (mutable) bytes.
        buf = data if isinstance(data, bytes | bytearray) else bytes(data)
        return _parse(buf, expected_d, expected_kinds, expected_seed, expected_round)

    def with_values(self, values: torch.Tensor) -> Payload:
        """Same payload with replaced values (e.g. cast to float16, noised)."""
        return replace(self, values=values)


@dataclass(frozen=True)
class PayloadHeader:
    """The validated fixed-size header of a payload (what a receiver checks
    before it accepts any of the body)."""

    kind: PayloadKind
    dtype: torch.dtype
    np_dtype: str
    itemsize: int
    d: int
    n: int
    index_nbytes: int
    sketch: SketchSpec | None

    @property
    def length(self) -> int:
        """Total payload length the header implies (header included)."""
        return HEADER_SIZE + self.n * self.itemsize + self.index_nbytes


def parse_header(
    data: bytes | bytearray | memoryview,
    *,
    expected_d: int | None = None,
    expected_kinds: tuple[PayloadKind, ...] | None = None,
    expected_seed: int | None = None,
    expected_round: int | None = None,
) -> PayloadHeader:
    """Parse and validate the first :data:`HEADER_SIZE` bytes of a payload."""
    if len(data) < HEADER_SIZE:
        raise PayloadError(f"payload has {len(data)} bytes, header needs {HEADER_SIZE}")
    (
        magic,
        version,
        kind_code,
        dtype_code,
        index_codec,
        method_code,
        d,
        n,
        index_nbytes,
        seed,
        rnd,
        rows,
        cols,
    ) = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise PayloadError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != _VERSION:
        raise PayloadError(f"unsupported payload version {version}")
    if kind_code not in _KIND_NAMES:
        raise PayloadError(f"unknown payload kind code {kind_code}")
    kind = _KIND_NAMES[kind_code]
    if expected_kinds is not None and kind not in expected_kinds:
        raise PayloadError(
            f"payload kind {kind!r} not accepted; expected {list(expected_kinds)}"
        )
    if dtype_code not in _DTYPE_BY_CODE:
        raise PayloadError(f"unknown value dtype code {dtype_code}")
    torch_dtype, np_dtype, itemsize = _DTYPE_BY_CODE[dtype_code]
    if d > MAX_D:
        raise PayloadError(f"declared dimension {d} exceeds {MAX_D}")
    if expected_d is not None and d != expected_d:
        raise PayloadError(f"declared dimension {d}, expected {expected_d}")

    spec: SketchSpec | None = None
    if kind == "sparse":
        if index_codec != _INDEX_VARINT:
            raise PayloadError(f"sparse payload needs index codec 1, got {index_codec}")
        if n > d:
            raise PayloadError(f"sparse payload has {n} values for dimension {d}")
        if not n <= index_nbytes <= MAX_VARINT_BYTES * n:
            raise PayloadError(f"index block of {index_nbytes} bytes for {n} indices")
    elif index_codec != _INDEX_NONE or index_nbytes:
        raise PayloadError(f"{kind} payload must not carry an index block")
    if kind == "sketch":
        if method_code not in _METHOD_NAMES:
            raise PayloadError(f"unknown sketch method code {method_code}")
        spec = SketchSpec(_METHOD_NAMES[method_code], rows, cols, seed, rnd)
        if n != spec.size:
            raise PayloadError(f"sketch has {n} values, spec needs {rows}x{cols}")
        if expected_seed is not None and seed != expected_seed:
            raise PayloadError(f"sketch seed {seed}, expected {expected_seed}")
        if expected_round is not None and rnd != expected_round:
            raise PayloadError(f"sketch round {rnd}, expected {expected_round}")
    elif method_code or seed or rnd or rows or cols:
        raise PayloadError(f"{kind} payload must have zero sketch fields")
    if kind == "dense" and n != d:
        raise PayloadError(f"dense payload has {n} values, dimension is {d}")
    return PayloadHeader(
        kind, torch_dtype, np_dtype, itemsize, d, n, index_nbytes, spec
    )


def _parse(
    data: bytes | bytearray,
    expected_d: int | None,
    expected_kinds: tuple[PayloadKind, ...] | None,
    expected_seed: int | None,
    expected_round: int | None,
) -> Payload:
    h = parse_header(
        data,
        expected_d=expected_d,
        expected_kinds=expected_kinds,
        expected_seed=expected_seed,
        expected_round=expected_round,
    )
    kind, d, n, spec = h.kind, h.d, h.n, h.sketch
    np_dtype, torch_dtype, itemsize = h.np_dtype, h.dtype, h.itemsize
    # Only now is the declared size trusted enough to compare with the real one.
    expected_len = h.length
    if len(data) != expected_len:
        what = "truncated" if len(data) < expected_len else "has trailing bytes"
        raise PayloadError(
            f"payload {what}: {len(data)} bytes, header implies {expected_len}"
        )
    arr = np.frombuffer(data, dtype=np_dtype, count=n, offset=HEADER_SIZE)
    values = torch.from_numpy(arr.astype(np_dtype, copy=True)).to(torch_dtype)
    check_finite(values, "payload", PayloadError)

    indices: torch.Tensor | None = None
    if kind == "sparse":
        try:
            gaps = varint_decode(data[HEADER_SIZE + n * itemsize :], n)
        except IndexCodecError as exc:
            raise PayloadError(str(exc)) from None
        if n and bool((gaps >= np.uint64(d)).any()):
            raise PayloadError(f"sparse index out of range [0, {d})")
        if n > 1 and bool((gaps[1:] == 0).any()):
            raise PayloadError(
                "sparse indices must be strictly increasing "
                "(zero delta: duplicate index)"
            )
        # Every delta < d <= 2^48, so a uint64 wrap in cumsum would show up as a
        # decrease; the range check on the last index catches everything else.
        idx = np.cumsum(gaps, dtype=np.uint64)
        if n and (
            int(idx[-1]) >= d
            or (n > 1 and not bool((np.diff(idx.astype(np.int64)) > 0).all()))
        ):
            raise PayloadError(f"sparse index out of range [0, {d})")
        indices = torch.from_numpy(idx.astype(np.int64))
    payload = Payload(kind, d, values, indices, spec)
    return payload


def dense_header(d: int) -> bytes:
    """The header of a dense float32 payload of ``d`` values: followed by the
    values' little-endian bytes, it is exactly ``dense_payload(v).to_bytes()``
    (lets a sender stream a large vector without concatenating it)."""
    return _HEADER.pack(MAGIC, _VERSION, 0, 0, _INDEX_NONE, 0, d, d, 0, 0, 0, 0, 0)


def dense_payload(values: torch.Tensor) -> Payload:
    """A dense payload carrying ``values`` ``[d]`` (float32 or float16)."""
    return Payload("dense", int(values.numel()), values.detach().contiguous())


def sparse_payload(
    d: int, indices: torch.Tensor, values: torch.Tensor, *, dense_fallback: bool = True
) -> Payload:
    """A sparse payload, or a dense one when that is not larger on the wire.

    Parameters
    ----------
    d : int
        Length of the decoded vector.
    indices : torch.Tensor
        int64 ``[nnz]``, strictly increasing, in ``[0, d)``.
    values : torch.Tensor
        float32/float16 ``[nnz]``, aligned with ``indices``.
    dense_fallback : bool
        Send ``[d]`` values instead when ``nnz * (itemsize) + index bytes`` is at
        least ``d * itemsize`` (e.g. DGC's warm-up at 25% density).
    """
    indices = indices.detach().to(torch.int64).contiguous()
    values = values.detach().contiguous()
    payload = Payload("sparse", d, values, indices)
    if dense_fallback:
        sparse_body = payload.nbytes - HEADER_SIZE
        if sparse_body >= d * values.element_size():
            dense = torch.zeros(d, dtype=values.dtype)
            dense[indices] = values
            return Payload("dense", d, dense)
    return payload


def sketch_payload(spec: SketchSpec, d: int, values: torch.Tensor) -> Payload:
    """A sketch payload: ``values`` ``[rows * cols]`` = ``R @ h`` for ``h`` ``[d]``."""
    return Payload("sketch", d, values.detach().reshape(-1).contiguous(), sketch=spec)


def dense_size(d: int, itemsize: int = 4) -> int:
    """Wire size of an uncompressed ``[d]`` payload (the baseline for ratios)."""
    return HEADER_SIZE + d * itemsize
