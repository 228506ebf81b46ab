"""The tamper-evident contribution ledger: hash chain, signatures, verification.

Each entry is a canonical JSON object (sorted keys, no spaces, no NaN) holding the
run, its sequence number ``seq``, round, client, scores, flags, reward share and
the previous entry's hash ``prev``. Its hash is SHA-256 over a domain tag and that
text, so changing one byte of an entry changes its hash, and every later entry's
``prev`` stops matching. The coordinator's Ed25519 key signs every entry hash and
the chain head (run, last ``seq``, last hash, key id); the head is what proves no
entry was removed from the end.

:func:`verify_ledger` walks the stored chain and reports each problem with the
entry it concerns: an edited entry (content vs. hash, or a signature that fails
after re-hashing), deleted entries (a gap in ``seq``, or a head naming a later
entry), reordered entries (an entry stored at another position than the one it
was signed for), and a head or entries signed by another key.

Limits (documented in docs/contribution.md): whoever holds the private key can
rewrite history, and someone who can write the database can replace the stored
public key together with a wholly re-signed chain; pin the coordinator's public
key (``--public-key``) to catch that.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from fedplat.security.keys import (
    KeyFileError,
    key_id,
    public_key_from_pem,
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


# ------------------------------------------------------------- verification
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

    Returns
    -------
    LedgerReport
    """
    problems: list[LedgerProblem] = []

    def problem(kind: str, message: str, e: StoredEntry | None = None) -> None:
        problems.append(
            LedgerProblem(
                kind,
                message,
                None if e is None else e.seq,
                None if e is None else e.round_number,
                None if e is None else e.client_id,
            )
        )

    # ---- which key
    stored_key: Ed25519PublicKey | None = None
    if head is not None and head.public_key_pem is not None:
        try:
            stored_key = public_key_from_pem(head.public_key_pem)
        except KeyFileError as exc:
            problem("key", f"the stored public key is unusable: {exc}")
    verify_key = public_key if public_key is not None else stored_key
    kid = None if verify_key is None else key_id(verify_key)
    if public_key is not None and stored_key is not None and key_id(stored_key) != kid:
        problem(
            "key",
            f"the ledger head was signed with key {key_id(stored_key)[:16]}, "
            f"not the given key {kid[:16] if kid else None} (re-signed with "
            "another key?)",
        )
    signed = head is not None and head.signature is not None
    if require_signature and verify_key is None and entries:
        problem("unsigned", "the ledger is not signed (no public key to check)")

    def label(e: StoredEntry) -> str:
        return f"entry seq {e.seq} (round {e.round_number}, client {e.client_id!r})"

    # ---- the chain
    expected_seq = 1
    prev = GENESIS_HASH
    # A link check is meaningful only when the entry before was where it should
    # be and unedited; otherwise one moved entry would be reported three times.
    prev_trusted = True
    for e in entries:
        if e.seq > expected_seq:
            missing = (
                f"seq {expected_seq}"
                if e.seq == expected_seq + 1
                else f"seq {expected_seq}..{e.seq - 1}"
            )
            problem("deleted", f"entries missing before {label(e)}: {missing}", e)
        digest = entry_hash(e.payload_json)
        content_ok = digest == e.entry_hash
        if not content_ok:
            problem("edited", f"{label(e)} was edited: content does not match hash", e)
        try:
            payload = json.loads(e.payload_json)
            if not isinstance(payload, dict):
                raise ValueError("not an object")
        except ValueError:
            problem("edited", f"{label(e)} was edited: content is not JSON", e)
            payload = {}
        if payload.get("run_id") not in (None, run_id):
            problem("edited", f"{label(e)} belongs to run {payload['run_id']!r}", e)
        signed_seq = payload.get("seq")
        moved = isinstance(signed_seq, int) and signed_seq != e.seq
        if moved:
            problem(
                "reordered",
                f"{label(e)} holds the entry written as seq {signed_seq}",
                e,
            )
        elif content_ok and (
            payload.get("prev") != e.prev_hash
            or payload.get("round") != e.round_number
            or payload.get("client_id") != e.client_id
        ):  # the query columns disagree with the hashed content
            problem("edited", f"{label(e)} was edited: columns differ", e)
        if (
            e.prev_hash != prev
            and e.seq == expected_seq
            and content_ok
            and not moved
            and prev_trusted
        ):
            problem(
                "edited",
                f"{label(e)} does not link to the entry before it: seq "
                f"{e.seq - 1} was edited and re-hashed, or replaced",
                e,
            )
        if verify_key is not None:
            if not _verify_sig(verify_key, e.signature, _entry_message(run_id, digest)):
                problem(
                    "signature",
                    f"{label(e)}: signature does not verify (edited and re-hashed, "
                    "or signed by another key)",
                    e,
                )
            entry_kid = payload.get("key_id")
            if entry_kid is not None and entry_kid != kid:
                problem(
                    "key",
                    f"{label(e)} was written under key {str(entry_kid)[:16]}, "
                    f"not {kid[:16] if kid else None}",
                    e,
                )
        prev = e.entry_hash
        prev_trusted = content_ok and not moved
        expected_seq = max(expected_seq, e.seq) + 1

    # ---- the head
    last = entries[-1] if entries else None
    last_seq = 0 if last is None else last.seq
    if head is None:
        if entries:
            problem("head", "the ledger has entries but no head")
    else:
        if head.seq > last_seq:
            problem(
                "deleted",
                f"the signed head names seq {head.seq} but the ledger ends at seq "
                f"{last_seq}: entries seq {last_seq + 1}..{head.seq} were deleted",
            )
        elif head.seq < last_seq:
            problem(
                "head",
                f"entries seq {head.seq + 1}..{last_seq} are not covered by the "
                "signed head (appended without the key)",
            )
        elif last is not None and head.head_hash != last.entry_hash:
            problem(
                "edited",
                f"entry seq {last_seq} is not the entry the head was signed for",
                last,
            )
        if verify_key is not None and not _verify_sig(
            verify_key,
            head.signature,
            _head_message(run_id, head.seq, head.head_hash, head.key_id),
        ):
            problem(
                "signature",
                "the head signature does not verify with key "
                f"{kid[:16] if kid else None} (re-signed with another key, or "
                "edited)",
            )
    return LedgerReport(
        run_id=run_id,
        entries=len(entries),
        head_seq=None if head is None else head.seq,
        key_id=kid,
        signed=signed,
        problems=problems,
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


# -------------------------------------------------------------------- export
EXPORT_FORMATS = ("csv", "json")


def export_rows(entries: Sequence[StoredEntry]) -> list[dict[str, Any]]:
    """One flat dict per entry: chain fields plus the decoded content."""
    rows = []
    for e in entries:
        try:
            payload = json.loads(e.payload_json)
        except ValueError:
            payload = {}
        rows.append(
            {
                "seq": e.seq,
                "round": e.round_number,
                "client_id": e.client_id,
                "attempt": payload.get("attempt"),
                "scores": payload.get("scores", {}),
                "credit": payload.get("credit"),
                "flags": payload.get("flags", []),
                "suspect": payload.get("suspect"),
                "cumulative": payload.get("cumulative"),
                "reward_share": payload.get("reward_share"),
                "reward": payload.get("reward"),
                "entry_hash": e.entry_hash,
                "prev_hash": e.prev_hash,
                "signature": e.signature,
            }
        )
    return rows


def export_ledger(
    run_id: str,
    entries: Sequence[StoredEntry],
    head: StoredHead | None,
    fmt: str,
    report: LedgerReport | None = None,
) -> str:
    """Render a ledger as CSV (one row per entry, ``score.<name>`` columns) or
    JSON (run, head, verification report and entries)."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {list(EXPORT_FORMATS)}")
    rows = export_rows(entries)
    if fmt == "json":
        doc: dict[str, Any] = {
            "run_id": run_id,
            "head": None
            if head is None
            else {
                "seq": head.seq,
                "head_hash": head.head_hash,
                "signature": head.signature,
                "key_id": head.key_id,
                "public_key_pem": head.public_key_pem,
            },
            "entries": rows,
        }
        if report is not None:
            doc["verification"] = {
                "ok": report.ok,
                "problems": [
                    {"kind": p.kind, "seq": p.seq, "message": p.message}
                    for p in report.problems
                ],
            }
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    names = sorted({k for r in rows for k in r["scores"]})
    buf = io.StringIO()
    columns = [
        "seq",
        "round",
        "client_id",
        "attempt",
        *(f"score.{n}" for n in names),
        "credit",
        "flags",
        "suspect",
        "cumulative",
        "reward_share",
        "reward",
        "entry_hash",
        "prev_hash",
        "signature",
    ]
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        flat = {k: v for k, v in r.items() if k not in ("scores", "flags")}
        flat.update({f"score.{n}": r["scores"].get(n) for n in names})
        flat["flags"] = ";".join(r["flags"])
        writer.writerow(flat)
    return buf.getvalue()
