"""Verify a stored contribution ledger and name every problem it has.

The checks (docs/contribution.md): each entry's content against its hash (edited),
gaps in ``seq`` (deleted), an entry stored at another position than the one it
was signed for (reordered), links between entries, signatures of entries and of
the head with the stored or a pinned key, and a head that names another last
entry than the stored one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedplat.contribution.ledger import (
    GENESIS_HASH,
    LedgerReader,
    StoredEntry,
    StoredHead,
    _entry_message,
    _head_message,
    entry_hash,
)
from fedplat.security.keys import KeyFileError, key_id, public_key_from_pem


@dataclass(frozen=True)
class LedgerProblem:
    """One thing wrong with a stored ledger.

    ``kind`` is one of ``edited``, ``deleted``, ``reordered``, ``signature``,
    ``key``, ``head``, ``unsigned``; ``seq`` is the entry concerned (``None``
    for the head as a whole).
    """

    kind: str
    message: str
    seq: int | None = None
    round_number: int | None = None
    client_id: str | None = None


@dataclass(frozen=True)
class LedgerReport:
    """Outcome of :func:`verify_ledger`; ``ok`` when ``problems`` is empty."""

    run_id: str
    entries: int
    head_seq: int | None
    key_id: str | None
    signed: bool
    problems: list[LedgerProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _verify_sig(public: Ed25519PublicKey, signature: str | None, msg: bytes) -> bool:
    if signature is None:
        return False
    try:
        public.verify(bytes.fromhex(signature), msg)
    except (InvalidSignature, ValueError):
        return False
    return True


def _label(e: StoredEntry) -> str:
    return f"entry seq {e.seq} (round {e.round_number}, client {e.client_id!r})"


class _Verifier:
    """One verification pass; collects problems."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.problems: list[LedgerProblem] = []
        self.verify_key: Ed25519PublicKey | None = None
        self.kid: str | None = None

    def problem(self, kind: str, message: str, e: StoredEntry | None = None) -> None:
        self.problems.append(
            LedgerProblem(
                kind,
                message,
                None if e is None else e.seq,
                None if e is None else e.round_number,
                None if e is None else e.client_id,
            )
        )

    # ------------------------------------------------------------ the key
    def key(self, head: StoredHead | None, pinned: Ed25519PublicKey | None) -> None:
        stored: Ed25519PublicKey | None = None
        if head is not None and head.public_key_pem is not None:
            try:
                stored = public_key_from_pem(head.public_key_pem)
            except KeyFileError as exc:
                self.problem("key", f"the stored public key is unusable: {exc}")
        self.verify_key = pinned if pinned is not None else stored
        self.kid = None if self.verify_key is None else key_id(self.verify_key)
        if pinned is not None and stored is not None and key_id(stored) != self.kid:
            self.problem(
                "key",
                f"the ledger head was signed with key {key_id(stored)[:16]}, not "
                f"the given key {self.kid[:16] if self.kid else None} (re-signed "
                "with another key?)",
            )

    # ------------------------------------------------------------ entries
    def chain(self, entries: Sequence[StoredEntry]) -> None:
        expected_seq = 1
        prev = GENESIS_HASH
        # A link check is meaningful only when the entry before was where it
        # should be and unedited; otherwise one moved entry would be reported
        # three times.
        prev_trusted = True
        for e in entries:
            if e.seq > expected_seq:
                missing = (
                    f"seq {expected_seq}"
                    if e.seq == expected_seq + 1
                    else f"seq {expected_seq}..{e.seq - 1}"
                )
                self.problem(
                    "deleted", f"entries missing before {_label(e)}: {missing}", e
                )
            content_ok, moved = self.entry(e)
            if (
                e.prev_hash != prev
                and e.seq == expected_seq
                and content_ok
                and not moved
                and prev_trusted
            ):
                self.problem(
                    "edited",
                    f"{_label(e)} does not link to the entry before it: seq "
                    f"{e.seq - 1} was edited and re-hashed, or replaced",
                    e,
                )
            prev = e.entry_hash
            prev_trusted = content_ok and not moved
            expected_seq = max(expected_seq, e.seq) + 1

    def entry(self, e: StoredEntry) -> tuple[bool, bool]:
        """Check one entry's content and signature; (content ok, moved)."""
        digest = entry_hash(e.payload_json)
        content_ok = digest == e.entry_hash
        if not content_ok:
            self.problem(
                "edited", f"{_label(e)} was edited: content does not match hash", e
            )
        payload = self._payload(e)
        if payload.get("run_id") not in (None, self.run_id):
            self.problem(
                "edited", f"{_label(e)} belongs to run {payload['run_id']!r}", e
            )
        signed_seq = payload.get("seq")
        moved = isinstance(signed_seq, int) and signed_seq != e.seq
        if moved:
            self.problem(
                "reordered",
                f"{_label(e)} holds the entry written as seq {signed_seq}",
                e,
            )
        elif content_ok and (
            payload.get("prev") != e.prev_hash
            or payload.get("round") != e.round_number
            or payload.get("client_id") != e.client_id
        ):  # the query columns disagree with the hashed content
            self.problem("edited", f"{_label(e)} was edited: columns differ", e)
        self._entry_signature(e, digest, payload)
        return content_ok, moved

    def _payload(self, e: StoredEntry) -> dict[str, Any]:
        try:
            payload = json.loads(e.payload_json)
            if not isinstance(payload, dict):
                raise ValueError("not an object")
        except ValueError:
            self.problem("edited", f"{_label(e)} was edited: content is not JSON", e)
            return {}
        return payload

    def _entry_signature(
        self, e: StoredEntry, digest: str, payload: dict[str, Any]
    ) -> None:
        if self.verify_key is None:
            return
        if not _verify_sig(
            self.verify_key, e.signature, _entry_message(self.run_id, digest)
        ):
            self.problem(
                "signature",
                f"{_label(e)}: signature does not verify (edited and re-hashed, "
                "or signed by another key)",
                e,
            )
        entry_kid = payload.get("key_id")
        if entry_kid is not None and entry_kid != self.kid:
            self.problem(
                "key",
                f"{_label(e)} was written under key {str(entry_kid)[:16]}, "
                f"not {self.kid[:16] if self.kid else None}",
                e,
            )

    # ------------------------------------------------------------ the head
    def head(self, entries: Sequence[StoredEntry], head: StoredHead | None) -> None:
        last = entries[-1] if entries else None
        last_seq = 0 if last is None else last.seq
        if head is None:
            if entries:
                self.problem("head", "the ledger has entries but no head")
            return
        if head.seq > last_seq:
            self.problem(
                "deleted",
                f"the signed head names seq {head.seq} but the ledger ends at seq "
                f"{last_seq}: entries seq {last_seq + 1}..{head.seq} were deleted",
            )
        elif head.seq < last_seq:
            self.problem(
                "head",
                f"entries seq {head.seq + 1}..{last_seq} are not covered by the "
                "signed head (appended without the key)",
            )
        elif last is not None and head.head_hash != last.entry_hash:
            self.problem(
                "edited",
                f"entry seq {last_seq} is not the entry the head was signed for",
                last,
            )
        message = _head_message(self.run_id, head.seq, head.head_hash, head.key_id)
        if self.verify_key is not None and not _verify_sig(
            self.verify_key, head.signature, message
        ):
            self.problem(
                "signature",
                "the head signature does not verify with key "
                f"{self.kid[:16] if self.kid else None} (re-signed with another "
                "key, or edited)",
            )


def verify_ledger(
    run_id: str,
    entries: Sequence[StoredEntry],
    head: StoredHead | None,
    public_key: Ed25519PublicKey | None = None,
    *,
    require_signature: bool = True,
) -> LedgerReport:
    """Check a stored ledger; report every problem with the entry it concerns.

    Parameters
    ----------
    run_id
        The run the ledger belongs to.
    entries
        The stored entries in ascending ``seq`` (as the store returns them).
    head
        The stored head, or ``None``.
    public_key
        The key the ledger must be signed with (an auditor's pinned copy). By
        default the public key stored in the head is used; passing one also
        checks that the stored key is this one.
    require_signature
        Report an unsigned ledger as a problem (default).
    """
    v = _Verifier(run_id)
    v.key(head, public_key)
    if require_signature and v.verify_key is None and entries:
        v.problem("unsigned", "the ledger is not signed (no public key to check)")
    v.chain(entries)
    v.head(entries, head)
    return LedgerReport(
        run_id=run_id,
        entries=len(entries),
        head_seq=None if head is None else head.seq,
        key_id=v.kid,
        signed=head is not None and head.signature is not None,
        problems=v.problems,
    )


def verify_run_ledger(
    store: LedgerReader,
    run_id: str,
    public_key: Ed25519PublicKey | None = None,
    *,
    require_signature: bool = True,
) -> LedgerReport:
    """:func:`verify_ledger` on the ledger of ``run_id`` in ``store``."""
    return verify_ledger(
        run_id,
        store.list_ledger_entries(run_id),
        store.get_ledger_head(run_id),
        public_key,
        require_signature=require_signature,
    )


__all__ = ["LedgerProblem", "LedgerReport", "verify_ledger", "verify_run_ledger"]
