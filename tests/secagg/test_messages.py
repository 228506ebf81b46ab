"""The wire codec: every message round-trips, malformed bytes are refused."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from fedplat.secagg import SecAggConfig, SecAggError, decode, encode
from fedplat.secagg.messages import (
    CIPHERTEXT_BYTES,
    AdvertiseKeys,
    EncryptedShares,
    KeyDirectory,
    MaskedInput,
    PeerKeys,
    Sealed,
    ShareBundle,
    ShareOf,
    UnmaskRequest,
    UnmaskShares,
)

S = bytes(range(16))
CFG = SecAggConfig(
    session=S,
    dim=5,
    clip_norm=1.0,
    max_clients=6,
    threshold=2,
    degree=2,
    min_clients=2,
    rotate=True,
)  # ring_dim 8, at most 2 neighbours, 6 clients
K = PeerKeys(3, b"e" * 32, b"m" * 32)
CT = b"c" * CIPHERTEXT_BYTES
SHARE = b"\x01" * 33
MESSAGES = [
    AdvertiseKeys(S, 3, K),
    KeyDirectory(
        S,
        3,
        (1, 3, 4),
        (PeerKeys(1, b"a" * 32, b"b" * 32), PeerKeys(4, b"c" * 32, b"d" * 32)),
    ),
    EncryptedShares(S, 3, b"h" * 32, (Sealed(1, CT), Sealed(4, CT))),
    ShareBundle(S, 3, (Sealed(4, CT),)),
    MaskedInput(S, 3, np.arange(8, dtype=np.uint32)),
    UnmaskRequest(S, 3, (0, 3, 5)),
    UnmaskShares(S, 3, (ShareOf(1, SHARE),), (ShareOf(4, SHARE),)),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg) -> None:
    wire = encode(msg)
    back = decode(wire, CFG)
    assert type(back) is type(msg)
    assert encode(back) == wire
    assert len(wire) >= 25  # magic, type, session, party id
    with pytest.raises(SecAggError, match="truncated"):
        decode(wire[:-1], CFG)
    with pytest.raises(SecAggError, match="trailing"):
        decode(wire + b"\x00", CFG)
    with pytest.raises(SecAggError, match="another session"):
        decode(wire[:5] + b"x" * 16 + wire[21:], CFG)


def test_sizes_are_what_the_bench_counts() -> None:
    assert len(encode(MESSAGES[0])) == 25 + 64
    assert len(encode(MESSAGES[4])) == 25 + 4 + 4 * 8  # header, count, d' uint32
    assert CIPHERTEXT_BYTES == 33 + 33 + 16  # two shares and the GCM tag


def test_counts_beyond_the_round_bounds_are_refused_before_reading() -> None:
    head = encode(MESSAGES[3])[:25]
    # Three sealed shares where a client has at most 2 neighbours.
    wire = head + struct.pack("<I", 3) + (struct.pack("<I", 1) + CT) * 3
    with pytest.raises(SecAggError, match="at most 2"):
        decode(wire, CFG)
    # A huge declared count is refused without allocating.
    with pytest.raises(SecAggError, match="at most 6"):
        decode(encode(MESSAGES[5])[:25] + struct.pack("<I", 2**31), CFG)
    with pytest.raises(SecAggError, match="expected 8"):
        decode(encode(MaskedInput(S, 3, np.zeros(7, dtype=np.uint32))), CFG)


def test_duplicates_bad_ids_and_types_are_refused() -> None:
    wire = encode(MESSAGES[5])[:25] + struct.pack("<III", 2, 4, 4)
    with pytest.raises(SecAggError, match="strictly increasing"):
        decode(wire, CFG)
    with pytest.raises(SecAggError, match="out of range"):
        decode(encode(MESSAGES[5])[:21] + struct.pack("<I", 2**31) + b"\x00" * 4, CFG)
    with pytest.raises(SecAggError, match="unknown message type"):
        decode(b"FSA1\x09" + S + b"\x00" * 4, CFG)
    with pytest.raises(SecAggError, match="not a secure-aggregation"):
        decode(b"XXXX\x01" + S + b"\x00" * 68, CFG)
    with pytest.raises(SecAggError, match="both shares"):
        UnmaskShares(S, 3, (ShareOf(1, SHARE),), (ShareOf(1, SHARE),))
    with pytest.raises(SecAggError, match="another client"):
        AdvertiseKeys(S, 2, K)
    with pytest.raises(SecAggError, match="32 bytes"):
        PeerKeys(1, b"short", b"m" * 32)
    with pytest.raises(SecAggError, match="uint32"):
        MaskedInput(S, 1, np.zeros(8, dtype=np.int64))


def test_config_round_trips_and_is_validated() -> None:
    assert SecAggConfig.from_dict(CFG.as_dict()) == CFG
    with pytest.raises(SecAggError, match="keys must be"):
        SecAggConfig.from_dict({**CFG.as_dict(), "extra": 1})
    with pytest.raises(SecAggError, match="expected an integer"):
        SecAggConfig.from_dict({**CFG.as_dict(), "dim": "5"})
    with pytest.raises(SecAggError, match="threshold"):
        SecAggConfig.from_dict({**CFG.as_dict(), "threshold": 3})
    with pytest.raises(SecAggError, match="degree"):
        SecAggConfig.from_dict({**CFG.as_dict(), "degree": 3})
    with pytest.raises(SecAggError, match="session"):
        SecAggConfig.from_dict({**CFG.as_dict(), "session": "00"})
