"""The messages of one round and their wire codec (raw little-endian, no pickle).

Four client->server messages, one per phase, and three server->client replies
(Bonawitz et al., CCS 2017, Fig. 4, semi-honest protocol, rounds 0-2 and 4):

======================  ==================================================
client -> server        server -> client
======================  ==================================================
:class:`AdvertiseKeys`  :class:`KeyDirectory` (roster + neighbours' keys)
:class:`EncryptedShares` :class:`ShareBundle` (ciphertexts addressed to you)
:class:`MaskedInput`    :class:`UnmaskRequest` (who sent a masked input)
:class:`UnmaskShares`   (the server outputs the sum)
======================  ==================================================

Every message starts with ``magic b"FSA1" | type (1 byte) | session (16) |
party id (uint32)``. Lists are a uint32 count then fixed-size entries sorted by
strictly increasing id, so a duplicate is a parse error. :func:`decode` faces the
network: it checks the type, session, counts against the round's bounds and the
exact length before building anything sized by the sender.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from fedplat.secagg.config import MAX_CLIENT_ID, SESSION_BYTES, SecAggConfig
from fedplat.secagg.crypto import KEY_BYTES, TAG_BYTES
from fedplat.secagg.errors import SecAggError
from fedplat.secagg.shamir import SHARE_BYTES

__all__ = [
    "CIPHERTEXT_BYTES",
    "AdvertiseKeys",
    "EncryptedShares",
    "KeyDirectory",
    "MaskedInput",
    "Message",
    "PeerKeys",
    "Sealed",
    "ShareBundle",
    "ShareOf",
    "UnmaskRequest",
    "UnmaskShares",
    "decode",
]

MAGIC = b"FSA1"
_HEAD = struct.Struct(f"<4sB{SESSION_BYTES}sI")
_U32 = struct.Struct("<I")
# A sealed share: the key share and the self-mask share, AES-GCM tagged.
CIPHERTEXT_BYTES = 2 * SHARE_BYTES + TAG_BYTES

(
    _ADVERTISE,
    _KEYS,
    _SHARES,
    _BUNDLE,
    _MASKED,
    _REQUEST,
    _UNMASK,
) = range(1, 8)


def _check_id(i: int, what: str = "client id") -> None:
    if not 0 <= i <= MAX_CLIENT_ID:
        raise SecAggError(f"{what} {i} out of range [0, 2^31)")


def _check_increasing(ids: list[int], what: str) -> None:
    for i in ids:
        _check_id(i, what)
    if any(a >= b for a, b in itertools.pairwise(ids)):
        raise SecAggError(f"{what}s must be strictly increasing (no duplicates)")


def _check_bytes(value: bytes, size: int, what: str) -> None:
    if not isinstance(value, bytes) or len(value) != size:
        raise SecAggError(f"{what} must be {size} bytes")


@dataclass(frozen=True)
class PeerKeys:
    """One client's two public keys: for share encryption and for masks."""

    client_id: int
    enc_public: bytes
    mask_public: bytes

    def __post_init__(self) -> None:
        _check_id(self.client_id)
        _check_bytes(self.enc_public, KEY_BYTES, "enc_public")
        _check_bytes(self.mask_public, KEY_BYTES, "mask_public")


@dataclass(frozen=True)
class Sealed:
    """A ciphertext to (or from) ``peer``."""

    peer: int
    ciphertext: bytes

    def __post_init__(self) -> None:
        _check_id(self.peer, "peer id")
        _check_bytes(self.ciphertext, CIPHERTEXT_BYTES, "ciphertext")


@dataclass(frozen=True)
class ShareOf:
    """A Shamir share of ``owner``'s secret."""

    owner: int
    share: bytes

    def __post_init__(self) -> None:
        _check_id(self.owner, "owner id")
        _check_bytes(self.share, SHARE_BYTES, "share")


@dataclass(frozen=True)
class AdvertiseKeys:
    """Round 0, client -> server."""

    session: bytes
    client_id: int
    keys: PeerKeys

    def __post_init__(self) -> None:
        if self.keys.client_id != self.client_id:
            raise SecAggError("advertised keys name another client")


@dataclass(frozen=True)
class KeyDirectory:
    """Round 0 reply: the roster (all who advertised) and the neighbours' keys."""

    session: bytes
    recipient: int
    roster: tuple[int, ...]
    keys: tuple[PeerKeys, ...]

    def __post_init__(self) -> None:
        _check_increasing(list(self.roster), "roster id")
        _check_increasing([k.client_id for k in self.keys], "neighbour id")


@dataclass(frozen=True)
class EncryptedShares:
    """Round 1, client -> server: one sealed pair of shares per neighbour and a
    commitment to the self-mask seed (lets the server verify its reconstruction)."""

    session: bytes
    client_id: int
    commitment: bytes
    shares: tuple[Sealed, ...]

    def __post_init__(self) -> None:
        _check_bytes(self.commitment, KEY_BYTES, "commitment")
        _check_increasing([s.peer for s in self.shares], "recipient id")


@dataclass(frozen=True)
class ShareBundle:
    """Round 1 reply: the ciphertexts other clients addressed to ``recipient``."""

    session: bytes
    recipient: int
    shares: tuple[Sealed, ...]

    def __post_init__(self) -> None:
        _check_increasing([s.peer for s in self.shares], "sender id")


@dataclass(frozen=True, eq=False)
class MaskedInput:
    """Round 2, client -> server: ``y = q(x) + self mask + pairwise masks``."""

    session: bytes
    client_id: int
    data: np.ndarray  # uint32 [ring_dim]

    def __post_init__(self) -> None:
        if self.data.dtype != np.uint32 or self.data.ndim != 1:
            raise SecAggError("masked input must be a 1-D uint32 array")


@dataclass(frozen=True)
class UnmaskRequest:
    """Round 2 reply: the clients whose masked inputs the server holds."""

    session: bytes
    recipient: int
    survivors: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_increasing(list(self.survivors), "survivor id")


@dataclass(frozen=True)
class UnmaskShares:
    """Round 3 (Bonawitz's round 4), client -> server: for each neighbour, its
    self-mask share if it survived, its mask-key share if it dropped; never both."""

    session: bytes
    client_id: int
    self_mask_shares: tuple[ShareOf, ...]
    key_shares: tuple[ShareOf, ...]

    def __post_init__(self) -> None:
        b = [s.owner for s in self.self_mask_shares]
        k = [s.owner for s in self.key_shares]
        _check_increasing(b, "owner id")
        _check_increasing(k, "owner id")
        if set(b) & set(k):
            raise SecAggError("both shares of one client in one message")


Message: TypeAlias = (
    AdvertiseKeys
    | KeyDirectory
    | EncryptedShares
    | ShareBundle
    | MaskedInput
    | UnmaskRequest
    | UnmaskShares
)


# ------------------------------------------------------------------- encoding
def _head(kind: int, session: bytes, party: int) -> bytes:
    return _HEAD.pack(MAGIC, kind, session, party)


def _ids(ids: tuple[int, ...] | list[int]) -> bytes:
    return _U32.pack(len(ids)) + np.asarray(ids, dtype="<u4").tobytes()


def encode(msg: Message) -> bytes:
    """The wire bytes of ``msg``."""
    if isinstance(msg, AdvertiseKeys):
        k = msg.keys
        return (
            _head(_ADVERTISE, msg.session, msg.client_id) + k.enc_public + k.mask_public
        )
    if isinstance(msg, KeyDirectory):
        body = b"".join(
            _U32.pack(k.client_id) + k.enc_public + k.mask_public for k in msg.keys
        )
        return (
            _head(_KEYS, msg.session, msg.recipient)
            + _ids(msg.roster)
            + _U32.pack(len(msg.keys))
            + body
        )
    if isinstance(msg, EncryptedShares | ShareBundle):
        kind, party = (
            (_SHARES, msg.client_id)
            if isinstance(msg, EncryptedShares)
            else (_BUNDLE, msg.recipient)
        )
        commitment = msg.commitment if isinstance(msg, EncryptedShares) else b""
        body = b"".join(_U32.pack(s.peer) + s.ciphertext for s in msg.shares)
        return (
            _head(kind, msg.session, party)
            + commitment
            + _U32.pack(len(msg.shares))
            + body
        )
    if isinstance(msg, MaskedInput):
        head = _head(_MASKED, msg.session, msg.client_id) + _U32.pack(msg.data.size)
        values = np.ascontiguousarray(msg.data, dtype="<u4")
        return b"".join((head, values.data))  # one copy of the 4 d' bytes
    if isinstance(msg, UnmaskRequest):
        return _head(_REQUEST, msg.session, msg.recipient) + _ids(msg.survivors)
    lists = (msg.self_mask_shares, msg.key_shares)
    body = b"".join(
        _U32.pack(len(shares)) + b"".join(_U32.pack(s.owner) + s.share for s in shares)
        for shares in lists
    )
    return _head(_UNMASK, msg.session, msg.client_id) + body


# ------------------------------------------------------------------- decoding
class _Reader:
    """Cursor over the received bytes; slices are views until a field is built."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = memoryview(data).cast("B")
        self.pos = 0

    def view(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise SecAggError("message truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def take(self, n: int) -> bytes:
        return bytes(self.view(n))

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def count(self, limit: int, entry: int, what: str) -> int:
        n = self.u32()
        if n > limit:
            raise SecAggError(f"{n} {what}, at most {limit} allowed")
        if self.pos + n * entry > len(self.data):
            raise SecAggError("message truncated")
        return n

    def ids(self, limit: int, what: str) -> tuple[int, ...]:
        n = self.count(limit, 4, what)
        return tuple(int(i) for i in np.frombuffer(self.view(4 * n), dtype="<u4"))

    def done(self) -> None:
        if self.pos != len(self.data):
            raise SecAggError(f"{len(self.data) - self.pos} trailing bytes")


def decode(data: bytes | bytearray | memoryview, config: SecAggConfig) -> Message:
    """Parse and validate one untrusted message of the round ``config`` describes."""
    r = _Reader(data)
    magic, kind, session, party = _HEAD.unpack(r.take(_HEAD.size))
    if magic != MAGIC:
        raise SecAggError("not a secure-aggregation message")
    if session != config.session:
        raise SecAggError("message belongs to another session")
    _check_id(party, "party id")
    k_max, n_max = config.max_neighbours, config.max_clients
    msg: Message
    if kind == _ADVERTISE:
        keys = PeerKeys(party, r.take(KEY_BYTES), r.take(KEY_BYTES))
        msg = AdvertiseKeys(session, party, keys)
    elif kind == _KEYS:
        roster = r.ids(n_max, "roster ids")
        n = r.count(k_max, 4 + 2 * KEY_BYTES, "neighbour keys")
        entries = tuple(
            PeerKeys(r.u32(), r.take(KEY_BYTES), r.take(KEY_BYTES)) for _ in range(n)
        )
        msg = KeyDirectory(session, party, roster, entries)
    elif kind in (_SHARES, _BUNDLE):
        commitment = r.take(KEY_BYTES) if kind == _SHARES else b""
        n = r.count(k_max, 4 + CIPHERTEXT_BYTES, "sealed shares")
        sealed = tuple(Sealed(r.u32(), r.take(CIPHERTEXT_BYTES)) for _ in range(n))
        msg = (
            EncryptedShares(session, party, commitment, sealed)
            if kind == _SHARES
            else ShareBundle(session, party, sealed)
        )
    elif kind == _MASKED:
        n = r.u32()
        if n != config.ring_dim:
            raise SecAggError(
                f"masked input has {n} entries, expected {config.ring_dim}"
            )
        # A read-only view of the received buffer: no copy of the 4 d' bytes.
        data_ = np.frombuffer(r.view(4 * n), dtype="<u4").astype(np.uint32, copy=False)
        msg = MaskedInput(session, party, data_)
    elif kind == _REQUEST:
        msg = UnmaskRequest(session, party, r.ids(n_max, "survivor ids"))
    elif kind == _UNMASK:
        lists = []
        for what in ("self-mask shares", "key shares"):
            n = r.count(k_max, 4 + SHARE_BYTES, what)
            lists.append(tuple(ShareOf(r.u32(), r.take(SHARE_BYTES)) for _ in range(n)))
        msg = UnmaskShares(session, party, lists[0], lists[1])
    else:
        raise SecAggError(f"unknown message type {kind}")
    r.done()
    return msg
