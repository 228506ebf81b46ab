"""Key agreement, key derivation, share encryption and mask expansion.

The primitives SecAgg needs (Bonawitz et al., CCS 2017, Sec. 3), all from the
``cryptography`` package:

* key agreement: X25519 (RFC 7748); every derived key goes through HKDF-SHA256
  (RFC 5869) with a label and the round's session id, so keys of different
  purposes, pairs or rounds never coincide;
* authenticated encryption of the shares: AES-256-GCM, its nonce fixed by the
  direction of the message. Each encryption key belongs to one (session, pair)
  and encrypts exactly one message per direction, so a nonce never repeats
  under a key;
* pseudorandom generator for the masks: AES-256 in counter mode over zeros,
  read as little-endian uint32, i.e. a uniform element of ``Z_{2^32}`` per
  coordinate (about 5 GB/s with AES-NI).
"""

from __future__ import annotations

import functools
import hashlib
import struct

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedplat.secagg.errors import SecAggError

__all__ = [
    "KEY_BYTES",
    "TAG_BYTES",
    "KeyPair",
    "MaskExpander",
    "agree",
    "commit",
    "decrypt_for",
    "derive",
    "encrypt_for",
    "public_of",
]

KEY_BYTES = 32
TAG_BYTES = 16
_AES_BLOCK = 16
_U32 = struct.Struct("<I")


class KeyPair:
    """A fresh X25519 key pair (one per purpose per round)."""

    def __init__(self, private: bytes | None = None) -> None:
        key = (
            X25519PrivateKey.generate()
            if private is None
            else X25519PrivateKey.from_private_bytes(_check_key(private))
        )
        self._key = key
        self.private = key.private_bytes_raw()
        self.public = key.public_key().public_bytes_raw()


def _check_key(key: bytes) -> bytes:
    if len(key) != KEY_BYTES:
        raise SecAggError(f"an X25519 key is {KEY_BYTES} bytes, got {len(key)}")
    return key


def public_of(private: bytes) -> bytes:
    """The public key of a (reconstructed) private key."""
    return KeyPair(private).public


def agree(private: bytes, peer_public: bytes) -> bytes:
    """X25519 shared secret; an all-zero result (a low-order peer key) is refused."""
    key = X25519PrivateKey.from_private_bytes(_check_key(private))
    try:
        shared = key.exchange(
            X25519PublicKey.from_public_bytes(_check_key(peer_public))
        )
    except ValueError as exc:  # cryptography refuses the all-zero output
        raise SecAggError(f"key agreement failed: {exc}") from exc
    return shared


def derive(secret: bytes, label: bytes, session: bytes, *ids: int) -> bytes:
    """32 bytes from HKDF-SHA256 bound to a purpose, a round and client ids."""
    info = label + b"|" + session + b"".join(_U32.pack(i) for i in ids)
    return HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info
    ).derive(secret)


def commit(label: bytes, session: bytes, client_id: int, secret: bytes) -> bytes:
    """SHA-256 commitment to a 32-byte secret (hiding: the secret is uniform)."""
    return hashlib.sha256(label + session + _U32.pack(client_id) + secret).digest()


def _nonce(sender: int, receiver: int) -> bytes:
    # Direction is part of the nonce: the pair's key encrypts u->v and v->u.
    return _U32.pack(sender) + _U32.pack(receiver) + b"\x00\x00\x00\x00"


def encrypt_for(
    key: bytes, session: bytes, sender: int, receiver: int, plaintext: bytes
) -> bytes:
    """AES-256-GCM of ``plaintext`` from ``sender`` to ``receiver`` (ids as AAD)."""
    aad = session + _U32.pack(sender) + _U32.pack(receiver)
    return AESGCM(key).encrypt(_nonce(sender, receiver), plaintext, aad)


def decrypt_for(
    key: bytes, session: bytes, sender: int, receiver: int, ciphertext: bytes
) -> bytes:
    """Inverse of :func:`encrypt_for`; a forged or misrouted message raises."""
    aad = session + _U32.pack(sender) + _U32.pack(receiver)
    try:
        return AESGCM(key).decrypt(_nonce(sender, receiver), ciphertext, aad)
    except InvalidTag:
        raise SecAggError(
            f"share from {sender} to {receiver} fails authentication"
        ) from None


@functools.lru_cache(maxsize=4)
def _zeros(nbytes: int) -> bytes:
    # The counter-mode input: shared read-only, allocated once per length.
    return bytes(nbytes)


class MaskExpander:
    """Expands 32-byte seeds into uint32 masks ``[d]`` in one reusable buffer.

    ``expand`` returns a view of the internal buffer, valid until the next call:
    callers add or subtract it into their accumulator at once, so expanding ``k``
    masks costs ``k`` passes over ``4 d`` bytes and no allocation.
    """

    def __init__(self, d: int) -> None:
        if d < 1:
            raise SecAggError(f"mask length must be >= 1, got {d}")
        self.d = d
        self._zeros = _zeros(4 * d)
        # update_into needs room for one block beyond the input.
        self._buf = bytearray(4 * d + _AES_BLOCK - 1)
        self._view = np.frombuffer(self._buf, dtype="<u4", count=d)

    def expand(self, seed: bytes) -> np.ndarray:
        """PRG(seed): uniform uint32 ``[d]`` (a view, overwritten by the next call)."""
        enc = Cipher(
            algorithms.AES(_check_key(seed)), modes.CTR(bytes(_AES_BLOCK))
        ).encryptor()
        enc.update_into(self._zeros, self._buf)
        return self._view

    def add(self, acc: np.ndarray, seed: bytes, sign: int) -> None:
        """``acc += sign * PRG(seed)`` in ``Z_{2^32}`` (uint32 wraps)."""
        mask = self.expand(seed)
        if sign > 0:
            np.add(acc, mask, out=acc)
        else:
            np.subtract(acc, mask, out=acc)
