"""Bodies of chunked streams (a header message, then ``data`` messages), received
in place: one buffer preallocated to the declared size, hashed as chunks arrive.

Shared by the coordinator protocol (model downloads, update uploads) and the
gossip peer protocol (pushed and pulled models). The declared size must already
have been checked against the receiver's limit: the buffer is allocated up front.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from fedplat.transport.errors import InvalidArgument

__all__ = ["BodyBuffer", "read_body"]


class BodyBuffer:
    """Collects a stream's payload into a preallocated ``bytearray``.

    Parameters
    ----------
    declared : int
        Bytes the header announced (already bounded by the caller).
    sha256 : str
        Hex digest the header announced.
    what : str
        Names the stream in error messages (``"model"``, ``"update"``).
    """

    def __init__(self, declared: int, sha256: str, what: str) -> None:
        self.declared = declared
        self.sha256 = sha256
        self.what = what
        self.buf = bytearray(declared)
        self.pos = 0
        self._hash = hashlib.sha256()

    def add(self, data: bytes) -> None:
        """Append one chunk; refuses a stream growing past its declared size."""
        end = self.pos + len(data)
        if end > self.declared:
            raise InvalidArgument(
                f"{self.what} stream longer than its declared {self.declared} bytes"
            )
        self.buf[self.pos : end] = data
        self._hash.update(data)
        self.pos = end

    def finish(self) -> bytearray:
        """The whole body, once its length and checksum match the header."""
        if self.pos != self.declared:
            raise InvalidArgument(
                f"{self.what} stream has {self.pos} bytes, header declared "
                f"{self.declared} (truncated)"
            )
        if self._hash.hexdigest() != self.sha256:
            raise InvalidArgument(
                f"{self.what} checksum mismatch (corrupted or truncated)"
            )
        return self.buf


def read_body(rest: Iterator[Any], declared: int, sha256: str, what: str) -> bytes:
    """Read the ``data`` parts that follow a stream's header into one body.

    ``rest`` yields the messages after the header (any message with a ``part``
    oneof of ``header``/``data``). Refuses a second header, more or fewer bytes
    than ``declared``, and a SHA-256 mismatch.
    """
    body = BodyBuffer(declared, sha256, what)
    for c in rest:
        if c.WhichOneof("part") != "data":
            raise InvalidArgument(f"{what} stream has a second header")
        body.add(c.data)
    return bytes(body.finish())
