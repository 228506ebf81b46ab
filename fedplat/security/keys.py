"""Ed25519 key files: created once, kept as 0600 PKCS#8 PEM files.

One home for every long-lived signing key: the coordinator's ledger key (its
public half is stored with the run and pinned with ``fedplat ledger verify
--public-key``), a client's identity key (registered at enrolment, signs updates)
and a gossip peer's key (signs exchanges).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

_PRIVATE_MODE = 0o600


class KeyFileError(ValueError):
    """A key file is missing, unreadable, not Ed25519, or readable by others."""


def raw_public_key(public_key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of a public key (what travels in protocol messages)."""
    return public_key.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def key_id(public_key: Ed25519PublicKey) -> str:
    """Fingerprint: hex SHA-256 of the raw 32-byte public key (64 characters)."""
    return hashlib.sha256(raw_public_key(public_key)).hexdigest()


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    """The public key as a SubjectPublicKeyInfo PEM string."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def public_key_from_pem(pem: str | bytes) -> Ed25519PublicKey:
    """Parse a public PEM, or derive the public key from a private PEM."""
    data = pem.encode("ascii") if isinstance(pem, str) else pem
    try:
        if b"PRIVATE KEY" in data:
            private = serialization.load_pem_private_key(data, password=None)
            if not isinstance(private, Ed25519PrivateKey):
                raise KeyFileError("not an Ed25519 private key")
            return private.public_key()
        public = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"not a PEM key: {exc}") from exc
    if not isinstance(public, Ed25519PublicKey):
        raise KeyFileError("not an Ed25519 public key")
    return public


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Read a public key PEM file (a private key PEM works too)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {p}: {exc}") from exc
    return public_key_from_pem(data)


def load_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Read an unencrypted PKCS#8 Ed25519 private key PEM.

    Raises
    ------
    KeyFileError
        If the file is missing, not an Ed25519 key, or readable by group or
        others (like OpenSSH, a private key anyone can read is refused).
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
        data = p.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {p}: {exc}") from exc
    if os.name == "posix" and stat.S_IMODE(mode) & 0o077:
        raise KeyFileError(
            f"key file {p} is accessible by others (mode "
            f"{stat.S_IMODE(mode):04o}); run `chmod 600 {p}`"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{p} is not an unencrypted PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{p} holds a {type(key).__name__}, not Ed25519")
    return key


def load_or_create_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load the key at ``path``, or create it there (mode 0600) if absent.

    Creation uses ``O_CREAT | O_EXCL`` so two coordinators starting together
    cannot both write a key: the loser loads the winner's.
    """
    p = Path(path)
    if p.exists():
        return load_signing_key(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _PRIVATE_MODE)
    except FileExistsError:
        return load_signing_key(p)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(p, _PRIVATE_MODE)  # the umask may have narrowed it; never widen
    return key
