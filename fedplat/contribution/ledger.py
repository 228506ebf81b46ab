"""The tamper-evident contribution ledger: hash chain, signatures, verification.

Each entry is a canonical JSON object (sorted keys, no spaces, no NaN) holding the
run, its sequence number ``seq``, round, client, scores, flags, reward share and
the previous entry's hash ``prev``. Its hash is SHA-256 over a domain tag and that
text, so changing one byte of an entry changes its hash, and every later entry's
``prev`` stops matching. The coordinator's Ed25519 key signs every entry hash and
the chain head (run, last ``seq``, last hash, key id); the head is what proves no
entry was removed from the end.

:func:`fedplat.contribution.ledger_verify.verify_ledger` walks the stored chain
and reports each problem with the entry it concerns: an edited entry (content vs.
hash, or a signature that fails after re-hashing), deleted entries (a gap in
``seq``, or a head naming a later entry), reordered entries (an entry stored at
another position than the one it was signed for), and a head or entries signed
by another key.

Limits (documented in docs/contribution.md): whoever holds the private key can
rewrite history, and someone who can write the database can replace the stored
public key together with a wholly re-signed chain; pin the coordinator's public
key (``--public-key``) to catch that.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
)

from fedplat.security.keys import (
    key_id,
    public_key_pem,
)

#: ``prev`` of the first entry.
GENESIS_HASH = "0" * 64
LEDGER_VERSION = 1
# Domain separation: an entry hash can never be confused with a head message.
_ENTRY_TAG = b"fedplat-ledger-entry-v1\n"
_ENTRY_SIG_TAG = b"fedplat-ledger-entry-signature-v1\n"
_HEAD_TAG = b"fedplat-ledger-head-v1\n"


class LedgerError(ValueError):
    """Entries that cannot be chained (bad content, wrong sequence)."""


# --------------------------------------------------------------------- records
@dataclass(frozen=True)
class LedgerEntry:
    """A chained entry, ready to store (satisfies ``fedplat.store.LedgerEntryLike``).

    ``payload_json`` is the canonical text the hash covers; ``round_number``,
    ``client_id``, ``seq`` and ``prev_hash`` repeat fields of it for querying.
    """

    seq: int
    round_number: int
    client_id: str
    payload_json: str
    prev_hash: str
    entry_hash: str
    signature: str | None

    @property
    def payload(self) -> dict[str, Any]:
        """The decoded entry content."""
        return dict(json.loads(self.payload_json))


@dataclass(frozen=True)
class LedgerHead:
    """The chain head (satisfies ``fedplat.store.LedgerHeadLike``)."""

    seq: int
    head_hash: str
    signature: str | None
    public_key_pem: str | None
    key_id: str | None


class StoredEntry(Protocol):
    """A ledger entry as read back from the store."""

    @property
    def seq(self) -> int: ...
    @property
    def round_number(self) -> int: ...
    @property
    def client_id(self) -> str: ...
    @property
    def payload_json(self) -> str: ...
    @property
    def prev_hash(self) -> str: ...
    @property
    def entry_hash(self) -> str: ...
    @property
    def signature(self) -> str | None: ...


class StoredHead(Protocol):
    """A ledger head as read back from the store."""

    @property
    def seq(self) -> int: ...
    @property
    def head_hash(self) -> str: ...
    @property
    def signature(self) -> str | None: ...
    @property
    def public_key_pem(self) -> str | None: ...
    @property
    def key_id(self) -> str | None: ...


class LedgerReader(Protocol):
    """What verification and export need of :class:`fedplat.store.Store`."""

    def list_ledger_entries(self, run_id: str) -> Sequence[StoredEntry]: ...

    def get_ledger_head(self, run_id: str) -> StoredHead | None: ...


# ------------------------------------------------------------------- hashing
def canonical_json(obj: Mapping[str, Any]) -> str:
    """Deterministic JSON: sorted keys, compact separators, UTF-8, no NaN.

    Python's float ``repr`` is the shortest string that round-trips, so a float
    survives ``json.loads`` -> ``canonical_json`` unchanged.
    """
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def entry_hash(payload_json: str) -> str:
    """Hex SHA-256 of an entry's canonical text (with a domain tag)."""
    return hashlib.sha256(_ENTRY_TAG + payload_json.encode("utf-8")).hexdigest()


def _entry_message(run_id: str, digest: str) -> bytes:
    return _ENTRY_SIG_TAG + canonical_json({"hash": digest, "run_id": run_id}).encode()


def _head_message(run_id: str, seq: int, head_hash: str, kid: str | None) -> bytes:
    body = {"head_hash": head_hash, "key_id": kid, "run_id": run_id, "seq": seq}
    return _HEAD_TAG + canonical_json(body).encode()


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become None, tuples lists, numpy/torch scalars
    plain numbers (via ``.item()``)."""
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)
    if callable(item):
        return _clean(item())
    raise LedgerError(f"{type(value).__name__} cannot go into a ledger entry")


# ------------------------------------------------------------------- writing
def chain_entries(
    run_id: str,
    contents: Sequence[Mapping[str, Any]],
    *,
    start_seq: int,
    prev_hash: str,
    signing_key: Ed25519PrivateKey | None,
) -> list[LedgerEntry]:
    """Turn entry contents into chained (and signed) entries.

    Parameters
    ----------
    run_id
        The run; every entry names it, so entries cannot be moved between runs.
    contents
        Per entry: ``round`` (int >= 1), ``client_id`` (str) and any other
        JSON-able fields (scores, flags, reward share, ...).
    start_seq
        ``seq`` of the first new entry (1 for an empty ledger).
    prev_hash
        Hash of the entry before it (:data:`GENESIS_HASH` for an empty ledger).
    signing_key
        Signs every entry hash; ``None`` leaves entries unsigned.

    Returns
    -------
    list of LedgerEntry
    """
    kid = None if signing_key is None else key_id(signing_key.public_key())
    out: list[LedgerEntry] = []
    prev = prev_hash
    for offset, content in enumerate(contents):
        seq = start_seq + offset
        body = _clean(content)
        round_number, client_id = body.get("round"), body.get("client_id")
        if not isinstance(round_number, int) or round_number < 1:
            raise LedgerError(f"entry content needs an int round >= 1: {content!r}")
        if not isinstance(client_id, str) or not client_id:
            raise LedgerError(f"entry content needs a client_id: {content!r}")
        reserved = {"v", "run_id", "seq", "prev", "key_id"} & set(body)
        if reserved:
            raise LedgerError(f"entry content may not set {sorted(reserved)}")
        body.update(v=LEDGER_VERSION, run_id=run_id, seq=seq, prev=prev, key_id=kid)
        text = canonical_json(body)
        digest = entry_hash(text)
        signature = (
            None
            if signing_key is None
            else signing_key.sign(_entry_message(run_id, digest)).hex()
        )
        out.append(
            LedgerEntry(seq, round_number, client_id, text, prev, digest, signature)
        )
        prev = digest
    return out


def sign_head(
    run_id: str, seq: int, head_hash: str, signing_key: Ed25519PrivateKey | None
) -> LedgerHead:
    """The head naming entry ``seq`` with hash ``head_hash``, signed if a key is
    given (the public key and its id travel with it)."""
    if signing_key is None:
        return LedgerHead(seq, head_hash, None, None, None)
    public = signing_key.public_key()
    kid = key_id(public)
    signature = signing_key.sign(_head_message(run_id, seq, head_hash, kid)).hex()
    return LedgerHead(seq, head_hash, signature, public_key_pem(public), kid)
