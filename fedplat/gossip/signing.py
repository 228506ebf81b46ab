"""Signed peer exchanges: signing, checking signatures, and freshness.

Every peer holds an Ed25519 identity (:class:`fedplat.security.identity.Identity`,
its key kept in the peer's state folder) whose public half the membership pins.
What each message's signature covers is the peer protocol's knowledge
(:mod:`fedplat.protocol.peer`: ``hello_statement`` and its siblings); this module
signs those statements (:class:`Signer`) and verifies them (``*_signed_by``).

Naming the receiver stops a message sent to one peer from being replayed to
another; the timestamp and nonce (:class:`ReplayGuard`) stop it from being
replayed to the same one.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from fedplat.protocol.peer import (
    NONCE_BYTES,
    CallAuth,
    Hello,
    HelloReply,
    ModelHeader,
    call_statement,
    hello_reply_statement,
    hello_statement,
    model_statement,
)
from fedplat.security.identity import (
    PEER_CALL,
    PEER_HELLO,
    PEER_MODEL,
    Identity,
    verify,
)

__all__ = [
    "ReplayGuard",
    "Signer",
    "call_signed_by",
    "hello_reply_signed_by",
    "hello_signed_by",
    "model_signed_by",
]


class Signer:
    """Signs this peer's messages with its identity key.

    Parameters
    ----------
    node_id : str
    identity : Identity
    clock : callable
        Wall clock in seconds (injectable for tests).
    """

    def __init__(
        self, node_id: str, identity: Identity, clock: Callable[[], float] = time.time
    ) -> None:
        self.node_id = node_id
        self.identity = identity
        self.clock = clock

    def fresh(self) -> tuple[int, bytes]:
        """``(timestamp_ms, nonce)`` for a new message."""
        return int(self.clock() * 1000), secrets.token_bytes(NONCE_BYTES)

    def hello(self, h: Hello) -> Hello:
        ts, nonce = self.fresh()
        h = replace(h, timestamp_ms=ts, nonce=nonce, signature=b"")
        return replace(h, signature=self.identity.sign(PEER_HELLO, *hello_statement(h)))

    def hello_reply(self, r: HelloReply, request_nonce: bytes) -> HelloReply:
        r = replace(r, request_nonce=request_nonce, signature=b"")
        return replace(
            r, signature=self.identity.sign(PEER_HELLO, *hello_reply_statement(r))
        )

    def model(
        self, h: ModelHeader, fingerprint: str, nonce: bytes | None = None
    ) -> ModelHeader:
        """Sign a model header; ``nonce`` repeats a pull request's nonce."""
        ts, fresh_nonce = self.fresh()
        h = replace(h, timestamp_ms=ts, nonce=nonce or fresh_nonce, signature=b"")
        sig = self.identity.sign(PEER_MODEL, *model_statement(h, fingerprint))
        return replace(h, signature=sig)

    def call(self, rpc: str, receiver_id: str, round: int) -> CallAuth:
        ts, nonce = self.fresh()
        c = CallAuth(self.node_id, receiver_id, round, ts, nonce)
        return replace(
            c, signature=self.identity.sign(PEER_CALL, *call_statement(rpc, c))
        )


def hello_signed_by(public_key: bytes, h: Hello) -> bool:
    return verify(public_key, h.signature, PEER_HELLO, *hello_statement(h))


def hello_reply_signed_by(public_key: bytes, r: HelloReply) -> bool:
    return verify(public_key, r.signature, PEER_HELLO, *hello_reply_statement(r))


def model_signed_by(public_key: bytes, h: ModelHeader, fingerprint: str) -> bool:
    return verify(public_key, h.signature, PEER_MODEL, *model_statement(h, fingerprint))


def call_signed_by(public_key: bytes, rpc: str, c: CallAuth) -> bool:
    return verify(public_key, c.signature, PEER_CALL, *call_statement(rpc, c))


class ReplayGuard:
    """Admits each signed message once, and only while it is fresh.

    A message is fresh when its timestamp is within ``window_s`` of this peer's
    clock (peers' clocks must agree that well) and its nonce was not seen from
    the same sender. Nonces are remembered until their timestamps leave the
    window, at most ``per_sender`` per sender; when that bound evicts a nonce
    still inside the window, messages older than it are refused from then on
    (the floor), so the bound never lets a replay through.

    Parameters
    ----------
    window_s : float
    per_sender : int
    clock : callable
        Wall clock in seconds.
    """

    def __init__(
        self,
        window_s: float,
        per_sender: int = 4096,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (math.isfinite(window_s) and window_s > 0) or per_sender < 1:
            raise ValueError("need window_s > 0 and per_sender >= 1")
        self.window_ms = int(window_s * 1000)
        self.per_sender = per_sender
        self.clock = clock
        self._seen: dict[str, OrderedDict[bytes, int]] = {}
        self._floor: dict[str, int] = {}

    def admit(self, sender: str, timestamp_ms: int, nonce: bytes) -> str | None:
        """Record the message; returns why it is refused, or ``None``."""
        now = int(self.clock() * 1000)
        if abs(now - timestamp_ms) > self.window_ms:
            return (
                f"timestamp {(timestamp_ms - now) / 1000:+.1f} s from this peer's "
                f"clock, outside the {self.window_ms / 1000:g} s window (a replay, "
                "or clocks too far apart)"
            )
        if timestamp_ms < self._floor.get(sender, 0):
            return "older than messages already forgotten (replay window full)"
        seen = self._seen.setdefault(sender, OrderedDict())
        while seen and next(iter(seen.values())) < now - self.window_ms:
            seen.popitem(last=False)
        if nonce in seen:
            return "replayed message (nonce seen before)"
        seen[nonce] = timestamp_ms
        if len(seen) > self.per_sender:
            _, oldest = seen.popitem(last=False)
            self._floor[sender] = max(self._floor.get(sender, 0), oldest + 1)
        return None
