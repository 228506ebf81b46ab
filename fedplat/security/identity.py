"""Signed statements: what a client or peer signs, and how it is checked.

Every signature in fedplat covers a *statement*: a domain string naming what is
being asserted (``"fedplat-update-v1"``) followed by its fields, each prefixed by
its length. The domain keeps a signature made for one purpose from being replayed
as another (an enrolment proof cannot pass as an update); the length prefixes make
the encoding injective, so no two different field lists share a statement.

Keys are Ed25519 (RFC 8032): 32-byte public keys, 64-byte signatures, fast to
verify (~0.1 ms) and deterministic, so signing needs no randomness on the device.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from fedplat.security.keys import load_or_create_signing_key, raw_public_key

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64

Field = bytes | str | int


def _field(value: Field) -> bytes:
    if isinstance(value, bool):
        raise TypeError("booleans are not statement fields; use an int")
    if isinstance(value, int):
        return struct.pack("<q", value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def statement(domain: str, *fields: Field) -> bytes:
    """The exact bytes signed for ``domain`` and ``fields`` (length-prefixed)."""
    out = bytearray()
    for part in (domain.encode("ascii"), *(_field(f) for f in fields)):
        out += struct.pack("<I", len(part))
        out += part
    return bytes(out)


class Identity:
    """A private Ed25519 key and its raw public key."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self.key = key
        self.public_key = raw_public_key(key.public_key())

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        """The key kept at ``path`` (created with mode 0600 when absent)."""
        return cls(load_or_create_signing_key(Path(path)))

    def sign(self, domain: str, *fields: Field) -> bytes:
        return self.key.sign(statement(domain, *fields))


def public_key_from_raw(raw: bytes) -> Ed25519PublicKey | None:
    """Parse 32 raw bytes as an Ed25519 public key; ``None`` if they are not one."""
    if len(raw) != PUBLIC_KEY_BYTES:
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None


def verify(public_key: bytes, signature: bytes, domain: str, *fields: Field) -> bool:
    """Whether ``signature`` by the raw ``public_key`` covers the statement."""
    key = public_key_from_raw(public_key)
    if key is None or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        key.verify(signature, statement(domain, *fields))
    except InvalidSignature:
        return False
    return True


# The domains in use, in one place so no two purposes share one.
ENROL = "fedplat-enrol-v1"
UPDATE = "fedplat-update-v1"
PEER_HELLO = "fedplat-peer-hello-v1"
PEER_MODEL = "fedplat-peer-model-v1"
PEER_CALL = "fedplat-peer-call-v1"  # a gossip peer's ping, pull and status calls
SECAGG = "fedplat-secagg-v1"  # a client's secure-aggregation message of one task

__all__ = [
    "ENROL",
    "PEER_CALL",
    "PEER_HELLO",
    "PEER_MODEL",
    "PUBLIC_KEY_BYTES",
    "SECAGG",
    "SIGNATURE_BYTES",
    "UPDATE",
    "Identity",
    "public_key_from_raw",
    "statement",
    "verify",
]
