"""Client SDK (imported as ``fedplat.client``)."""

from fedplat.client.backoff import Backoff
from fedplat.client.client import Client, FitResult
from fedplat.client.middleware import ByteCounter, ClipNorm, Middleware, OutgoingUpdate

__all__ = [
    "Backoff",
    "ByteCounter",
    "Client",
    "ClipNorm",
    "FitResult",
    "Middleware",
    "OutgoingUpdate",
]
