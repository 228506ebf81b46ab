"""The index block of sparse payloads: sorted indices, delta-encoded, as unsigned
LEB128 varints (see :mod:`fedplat.compression.wire` for why varints).

Every function validates what it is given; decoding faces the network and checks
each varint is terminated, at most 9 bytes and minimally encoded (so every index
set has exactly one encoding).
"""

from __future__ import annotations

import numpy as np
import torch

# Longest accepted varint: 9 bytes carry 63 bits, so the decoded deltas never
# overflow uint64 while being shifted into place.
MAX_VARINT_BYTES = 9


class IndexCodecError(ValueError):
    """Malformed indices or index block; the message says why."""


def check_sorted_in_range(idx: np.ndarray, d: int) -> None:
    if idx.size == 0:
        return
    if int(idx[0]) < 0 or int(idx[-1]) >= d:
        raise IndexCodecError(f"sparse index out of range [0, {d})")
    if idx.size > 1 and not bool((np.diff(idx) > 0).all()):
        raise IndexCodecError("sparse indices must be strictly increasing")


def deltas(idx: np.ndarray) -> np.ndarray:
    out = np.empty(idx.size, dtype=np.uint64)
    if idx.size:
        out[0] = idx[0]
        out[1:] = np.diff(idx)
    return out


def varint_lengths(values: np.ndarray) -> np.ndarray:
    lengths = np.ones(values.size, dtype=np.int64)
    for j in range(1, 10):
        lengths += values >= np.uint64(1 << (7 * j))
    return lengths


def varint_size(indices: torch.Tensor) -> int:
    """Bytes the delta+varint block takes for sorted ``indices`` ``[nnz]``."""
    return int(varint_lengths(deltas(indices.numpy())).sum())


def varint_encode(values: np.ndarray) -> bytes:
    """Unsigned LEB128 of each uint64, vectorised over byte positions (<= 10)."""
    if values.size == 0:
        return b""
    lengths = varint_lengths(values)
    starts = np.cumsum(lengths) - lengths
    out = np.zeros(int(lengths.sum()), dtype=np.uint8)
    for j in range(int(lengths.max())):
        live = lengths > j
        chunk = (values[live] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = (lengths[live] - 1 > j).astype(np.uint64) << np.uint64(7)
        out[starts[live] + j] = (chunk | more).astype(np.uint8)
    return out.tobytes()


def varint_decode(block: bytes | bytearray, n: int) -> np.ndarray:
    """Exactly ``n`` canonical LEB128 varints filling ``block`` -> uint64 ``[n]``."""
    b = np.frombuffer(block, dtype=np.uint8)
    if n == 0:
        if b.size:
            raise IndexCodecError("index block must be empty when there are no values")
        return np.zeros(0, dtype=np.uint64)
    is_last = b < 0x80
    if not bool(is_last[-1]):
        raise IndexCodecError("index block is truncated (last varint unterminated)")
    ends = np.flatnonzero(is_last)
    if ends.size != n:
        raise IndexCodecError(f"index block holds {ends.size} varints, header says {n}")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if int(lengths.max()) > MAX_VARINT_BYTES:
        raise IndexCodecError("index varint longer than 9 bytes")
    # Canonical form: a multi-byte varint may not end in a zero byte, so every
    # index set has exactly one encoding and ``nbytes`` is unambiguous.
    if bool(((lengths > 1) & (b[ends] == 0)).any()):
        raise IndexCodecError("index varint is not minimally encoded")
    pos = np.arange(b.size, dtype=np.int64) - np.repeat(starts, lengths)
    parts = (b & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, starts)


__all__ = [
    "MAX_VARINT_BYTES",
    "IndexCodecError",
    "check_sorted_in_range",
    "deltas",
    "varint_decode",
    "varint_encode",
    "varint_lengths",
    "varint_size",
]
