"""Signed peer exchanges: what each message's signature covers, and freshness.

Every peer holds an Ed25519 identity (:class:`fedplat.security.identity.Identity`,
its key kept in the peer's state folder) whose public half the membership pins.
A signature covers a domain-separated statement
(:func:`fedplat.security.identity.statement`) of:

* ``Hello`` (``PEER_HELLO``): sender id and address, receiver id, round, layout
  fingerprint, link wish, timestamp, nonce;
* its answer (``PEER_HELLO``, marked ``"reply"``): responder id and address,
  round, layout fingerprint, whether it linked, the peers it lists, and the
  request's nonce;
* a model header (``PEER_MODEL``): sender, receiver, round, layout fingerprint,
  mixing inputs (examples, degree, push-sum weight), link reference versions,
  payload size and SHA-256, timestamp, nonce (a pull's answer repeats the
  request's nonce);
* a ping, pull or status call (``PEER_CALL``): the call's name, sender,
  receiver, round, timestamp, nonce.

Naming the receiver stops a message sent to one peer from being replayed to
another; the timestamp and nonce (:class:`ReplayGuard`) stop it from being
replayed to the same one.
"""

from __future__ import annotations

import math
import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from fedplat.gossip.messages import CallAuth, Hello, HelloReply, ModelHeader
from fedplat.security.identity import (
    PEER_CALL,
    PEER_HELLO,
    PEER_MODEL,
    Field,
    Identity,
    verify,
)

__all__ = [
    "NONCE_BYTES",
    "ReplayGuard",
    "Signer",
    "call_signed_by",
    "hello_reply_signed_by",
    "hello_signed_by",
    "model_signed_by",
]

NONCE_BYTES = 16


def _hello_fields(h: Hello) -> tuple[Field, ...]:
    return (
        "hello",
        h.sender.node_id,
        h.sender.address,
        h.receiver_id,
        h.round,
        h.layout_fingerprint,
        int(h.want_link),
        h.timestamp_ms,
        h.nonce,
    )


def _reply_fields(r: HelloReply) -> tuple[Field, ...]:
    known = tuple(f for p in r.known for f in (p.node_id, p.address))
    return (
        "reply",
        r.responder.node_id,
        r.responder.address,
        r.round,
        r.layout_fingerprint,
        int(r.linked),
        len(r.known),
        *known,
        r.request_nonce,
    )


def _model_fields(h: ModelHeader, fingerprint: str) -> tuple[Field, ...]:
    return (
        h.sender_id,
        h.receiver_id,
        h.round,
        fingerprint,
        h.num_examples,
        h.degree,
        struct.pack("<d", h.push_weight),
        h.base_version,
        h.version,
        h.total_bytes,
        h.sha256,
        h.timestamp_ms,
        h.nonce,
    )


def _call_fields(rpc: str, c: CallAuth) -> tuple[Field, ...]:
    return (rpc, c.sender_id, c.receiver_id, c.round, c.timestamp_ms, c.nonce)


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
        return replace(h, signature=self.identity.sign(PEER_HELLO, *_hello_fields(h)))

    def hello_reply(self, r: HelloReply, request_nonce: bytes) -> HelloReply:
        r = replace(r, request_nonce=request_nonce, signature=b"")
        return replace(r, signature=self.identity.sign(PEER_HELLO, *_reply_fields(r)))

    def model(
        self, h: ModelHeader, fingerprint: str, nonce: bytes | None = None
    ) -> ModelHeader:
        """Sign a model header; ``nonce`` repeats a pull request's nonce."""
        ts, fresh_nonce = self.fresh()
        h = replace(h, timestamp_ms=ts, nonce=nonce or fresh_nonce, signature=b"")
        sig = self.identity.sign(PEER_MODEL, *_model_fields(h, fingerprint))
        return replace(h, signature=sig)

    def call(self, rpc: str, receiver_id: str, round: int) -> CallAuth:
        ts, nonce = self.fresh()
        c = CallAuth(self.node_id, receiver_id, round, ts, nonce)
        return replace(
            c, signature=self.identity.sign(PEER_CALL, *_call_fields(rpc, c))
        )


def hello_signed_by(public_key: bytes, h: Hello) -> bool:
    return verify(public_key, h.signature, PEER_HELLO, *_hello_fields(h))


def hello_reply_signed_by(public_key: bytes, r: HelloReply) -> bool:
    return verify(public_key, r.signature, PEER_HELLO, *_reply_fields(r))


def model_signed_by(public_key: bytes, h: ModelHeader, fingerprint: str) -> bool:
    return verify(public_key, h.signature, PEER_MODEL, *_model_fields(h, fingerprint))


def call_signed_by(public_key: bytes, rpc: str, c: CallAuth) -> bool:
    return verify(public_key, c.signature, PEER_CALL, *_call_fields(rpc, c))


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
