"""Who may take part in a gossip deployment: the membership list.

A membership file (YAML or TOML) names every peer and every observer (a tool
such as the launcher that may read status and models but never links or
pushes)::

    members:
      - id: "0"
        public_key: 3b6a27bc...   # Ed25519, 32 bytes as hex: signs its messages
        cert_sha256: 9f86d081...  # optional: pins its TLS certificate
        address: 127.0.0.1:5001   # optional: where it serves
    observers:
      - id: launcher
        public_key: ...

A peer admits a caller only if the caller's certificate names a member (and
matches the pinned fingerprint, if any) and its signature verifies with the
member's pinned key. Addresses come from this file when it gives them;
otherwise a member announces its own address in a ``Hello`` it signed, and no
one can announce another member's address. ``fedplat gossip identity`` prints
the entry of a peer; ``fedplat gossip run`` writes the whole file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from fedplat.config import Strict, read_mapping, validation_message

__all__ = [
    "NODE_ID",
    "Member",
    "Membership",
    "MembershipError",
    "check_node_id",
    "load_membership",
    "parse_membership",
]

#: A node id is one DNS label (it appears in the peer certificate's DNS name).
NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9\-]{0,62}$")
_HEX64 = r"^[0-9a-f]{64}$"
_ADDRESS = re.compile(r"^[^\s@]{1,253}:[0-9]{1,5}$")


class MembershipError(ValueError):
    """A membership file or entry is invalid; the message says where."""


def check_node_id(node_id: str) -> str:
    """``node_id`` if it is a valid node id (letters, digits, '-'; <= 63)."""
    if not NODE_ID.match(node_id):
        raise MembershipError(
            f"node id {node_id!r}: use 1-63 letters, digits or '-', starting with "
            "a letter or digit"
        )
    return node_id


@dataclass(frozen=True)
class Member:
    """One entry of the membership.

    Attributes
    ----------
    node_id : str
    public_key : bytes
        Raw 32-byte Ed25519 key its messages are signed with.
    cert_sha256 : str, optional
        Hex SHA-256 of its certificate's DER bytes, when pinned.
    address : str, optional
        ``host:port`` it serves on, when fixed by the membership.
    observer : bool
        May call ``GetStatus`` and ``PullModel`` only.
    """

    node_id: str
    public_key: bytes
    cert_sha256: str | None = None
    address: str | None = None
    observer: bool = False


class _Entry(Strict):
    id: str
    public_key: str = Field(pattern=_HEX64)
    cert_sha256: str | None = Field(default=None, pattern=_HEX64)
    address: str | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return check_node_id(value)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not _ADDRESS.match(value):
            raise ValueError(f"address {value!r} is not host:port")
        return value


class _File(Strict):
    members: list[_Entry] = Field(min_length=1)
    observers: list[_Entry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> _File:
        ids = [e.id for e in [*self.members, *self.observers]]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"ids listed twice: {twice}")
        return self


class Membership:
    """The admitted peers and observers, by node id (immutable)."""

    def __init__(self, members: Iterable[Member]) -> None:
        self._by_id: dict[str, Member] = {}
        for m in members:
            check_node_id(m.node_id)
            if m.node_id in self._by_id:
                raise MembershipError(f"node id {m.node_id!r} listed twice")
            if len(m.public_key) != 32:
                raise MembershipError(f"{m.node_id}: public key must be 32 bytes")
            self._by_id[m.node_id] = m

    def get(self, node_id: str) -> Member | None:
        return self._by_id.get(node_id)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._by_id

    def __iter__(self) -> Iterator[Member]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def peer(self, node_id: str) -> Member | None:
        """The member ``node_id`` if it is a peer (not an observer)."""
        m = self._by_id.get(node_id)
        return m if m is not None and not m.observer else None

    def by_address(self, address: str) -> Member | None:
        """The peer whose pinned address is ``address``, if any."""
        return next(
            (
                m
                for m in self._by_id.values()
                if m.address == address and not m.observer
            ),
            None,
        )

    def restricted_to(self, peer_ids: Iterable[str]) -> Membership:
        """Only the peers in ``peer_ids`` (a scenario's nodes), and every observer."""
        keep = set(peer_ids)
        return Membership(m for m in self if m.observer or m.node_id in keep)

    def to_mapping(self) -> dict[str, Any]:
        """The file form (see the module docstring)."""

        def entry(m: Member) -> dict[str, Any]:
            out: dict[str, Any] = {"id": m.node_id, "public_key": m.public_key.hex()}
            if m.cert_sha256:
                out["cert_sha256"] = m.cert_sha256
            if m.address:
                out["address"] = m.address
            return out

        return {
            "members": [entry(m) for m in self if not m.observer],
            "observers": [entry(m) for m in self if m.observer],
        }

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the membership as YAML to ``path``."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(self.to_mapping(), sort_keys=False))
        return p


def parse_membership(data: Any, source: str = "<membership>") -> Membership:
    """Validate a parsed mapping into a :class:`Membership`."""
    try:
        f = _File.model_validate(data)
    except ValidationError as exc:
        raise MembershipError(
            validation_message(exc, f"invalid membership {source}:")
        ) from None

    def member(e: _Entry, observer: bool) -> Member:
        return Member(
            e.id, bytes.fromhex(e.public_key), e.cert_sha256, e.address, observer
        )

    return Membership(
        [
            *(member(e, False) for e in f.members),
            *(member(e, True) for e in f.observers),
        ]
    )


def load_membership(path: str | os.PathLike[str]) -> Membership:
    """Read and validate a ``.yaml``/``.yml``/``.toml`` membership file."""
    return parse_membership(
        read_mapping(path, "membership", MembershipError), str(path)
    )
