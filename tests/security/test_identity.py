"""Signed statements: domain separation, injective encoding, key files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedplat.security.identity import (
    ENROL,
    UPDATE,
    Identity,
    public_key_from_raw,
    statement,
    verify,
)

fields = st.lists(st.one_of(st.binary(max_size=8), st.text(max_size=4)), max_size=4)


@given(fields, fields)
def test_statement_encoding_is_injective(a: list, b: list) -> None:
    enc = [x.encode() if isinstance(x, str) else x for x in a]
    enc_b = [x.encode() if isinstance(x, str) else x for x in b]
    if enc != enc_b:
        assert statement("d", *a) != statement("d", *b)


def test_statement_is_length_prefixed_by_hand() -> None:
    # 4-byte little-endian lengths: "d" (1), b"ab" (2), 7 as int64 (8).
    assert statement("d", b"ab", 7) == (
        b"\x01\x00\x00\x00d"
        + b"\x02\x00\x00\x00ab"
        + b"\x08\x00\x00\x00"
        + (7).to_bytes(8, "little")
    )
    with pytest.raises(TypeError):
        statement("d", True)


def test_sign_verify_and_domain_separation() -> None:
    me, other = Identity.generate(), Identity.generate()
    sig = me.sign(UPDATE, "run", 3, b"nonce")
    assert verify(me.public_key, sig, UPDATE, "run", 3, b"nonce")
    assert not verify(me.public_key, sig, ENROL, "run", 3, b"nonce")
    assert not verify(me.public_key, sig, UPDATE, "run", 4, b"nonce")
    assert not verify(other.public_key, sig, UPDATE, "run", 3, b"nonce")
    assert not verify(me.public_key, sig[:-1], UPDATE, "run", 3, b"nonce")
    assert not verify(b"short", sig, UPDATE, "run", 3, b"nonce")
    assert public_key_from_raw(b"\x00" * 31) is None


def test_identity_file_is_private_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "state" / "identity.key"
    a = Identity.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Identity.load_or_create(path).public_key == a.public_key
