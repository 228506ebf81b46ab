"""An upload's payload as a few buffers, hashed once and streamed without joining.

Every update travels as one ``fedplat-payload-v1`` payload
(:mod:`fedplat.compression.wire`). A dense float32 update is the 57-byte dense
header followed by the vector's own memory: :func:`dense_body` wraps the tensor's
buffer instead of copying it, so a client holds no second model-sized copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from fedplat.compression.wire import dense_header


@dataclass(frozen=True)
class EncodedBody:
    parts: tuple[memoryview, ...]
    nbytes: int
    sha256: str

    @classmethod
    def of(cls, *parts: bytes | bytearray | memoryview) -> EncodedBody:
        views = tuple(memoryview(p).cast("B") for p in parts)
        h = hashlib.sha256()
        for v in views:
            h.update(v)
        return cls(views, sum(len(v) for v in views), h.hexdigest())

    def chunks(self, size: int) -> Iterator[memoryview | bytes]:
        """The body in pieces of exactly ``size`` bytes (the last may be shorter):
        views of the parts, except a piece that spans two parts (joined)."""
        carry = b""
        for part in self.parts:
            start = 0
            if carry:
                take = min(size - len(carry), len(part))
                carry += part[:take].tobytes()
                start = take
                if len(carry) < size:
                    continue
                yield carry
                carry = b""
            while len(part) - start >= size:
                yield part[start : start + size]
                start += size
            if start < len(part):
                carry = part[start:].tobytes()
        if carry:
            yield carry

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


def dense_body(vector: torch.Tensor) -> EncodedBody:
    """The dense payload of a flat float32 ``[d]`` vector, over its own memory."""
    v = vector.detach()
    if v.dtype != torch.float32 or not v.is_contiguous() or v.dim() != 1:
        v = v.to(torch.float32).contiguous().reshape(-1)
    # Little-endian on every platform we run; the view shares the memory.
    data = v.numpy().view(np.uint8).data
    return EncodedBody.of(dense_header(v.numel()), data)


__all__ = ["EncodedBody", "dense_body"]
