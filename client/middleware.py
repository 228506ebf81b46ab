"""The upload middleware chain.

Each layer wraps the upload: it receives the outgoing update and ``send`` (the rest of
the chain), may transform the update before calling ``send`` and observe the ack
after. The innermost step encodes the vector (dense float32 unless a layer already set
an encoding) and sends it. Compression, differential privacy and signing plug in as
layers; they never touch the network themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from fedplat.protocol.messages import OutgoingUpdate, Send, UploadAck

log = logging.getLogger("fedplat.client")


class Middleware(Protocol):
    def __call__(self, update: OutgoingUpdate, send: Send) -> UploadAck: ...


def chain(layers: Sequence[Middleware], terminal: Send) -> Send:
    """Compose ``layers`` (outermost first) around ``terminal``."""
    send = terminal
    for layer in reversed(layers):
        send = (lambda lyr, nxt: lambda u: lyr(u, nxt))(layer, send)
    return send


class ByteCounter:
    """Counts bytes and updates sent (observability layer)."""

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.updates_sent = 0

    def __call__(self, update: OutgoingUpdate, send: Send) -> UploadAck:
        ack = send(update)
        self.bytes_sent += ack.bytes_received
        self.updates_sent += 1
        return ack


class ClipNorm:
    """Scale the update down to L2 norm ``max_norm`` (no-op when already smaller)."""

    def __init__(self, max_norm: float) -> None:
        if not max_norm > 0:
            raise ValueError("max_norm must be > 0")
        self.max_norm = max_norm

    def __call__(self, update: OutgoingUpdate, send: Send) -> UploadAck:
        norm = float(update.vector.norm())
        if norm > self.max_norm:
            update = replace(
                update,
                vector=update.vector * (self.max_norm / norm),
                metrics={**update.metrics, "clipped_from_norm": norm},
            )
        return send(update)
