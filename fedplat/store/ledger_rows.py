"""The contribution ledger rows and head."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from fedplat.store.base import StoreBase
from fedplat.store.convert import (
    _ledger_entry_record,
    _ledger_head_record,
)
from fedplat.store.models import (
    LedgerEntry,
    LedgerHead,
)
from fedplat.store.records import (
    LedgerEntryLike,
    LedgerEntryRecord,
    LedgerHeadLike,
    LedgerHeadRecord,
)
from fedplat.store.validate import (
    _ID_MAX,
    _SHA256_HEX_LEN,
    StoreError,
    _count,
    _now,
    _opt_signature,
    _opt_text,
    _sha_hex,
    _text,
)


def append_ledger_rows(
    session: Session,
    run_id: str,
    entries: Sequence[LedgerEntryLike],
    head: LedgerHeadLike,
) -> LedgerHead:
    """Validate and append ledger entries and the new head inside ``session``
    (whose transaction must hold the run's row lock)."""
    rows: list[dict[str, Any]] = []
    for i, e in enumerate(entries):
        field = f"ledger entry {i}"
        _count(f"{field} seq", e.seq, minimum=1)
        _count(f"{field} round_number", e.round_number, minimum=1)
        _text(f"{field} client_id", e.client_id, _ID_MAX)
        _text(f"{field} payload_json", e.payload_json, 10**9)
        rows.append(
            {
                "run_id": run_id,
                "seq": e.seq,
                "round_number": e.round_number,
                "client_id": e.client_id,
                "payload_json": e.payload_json,
                "prev_hash": _sha_hex(f"{field} prev_hash", e.prev_hash),
                "entry_hash": _sha_hex(f"{field} entry_hash", e.entry_hash),
                "signature": _opt_signature(f"{field} signature", e.signature),
            }
        )
    for before, after in itertools.pairwise(rows):
        if after["seq"] != before["seq"] + 1:
            raise StoreError(
                f"ledger entries must have consecutive seq, got {before['seq']} "
                f"then {after['seq']}"
            )
        if after["prev_hash"] != before["entry_hash"]:
            raise StoreError(
                f"ledger entry seq {after['seq']} does not link to seq {before['seq']}"
            )
    _count("head seq", head.seq)
    head_hash = _sha_hex("head head_hash", head.head_hash)
    head_sig = _opt_signature("head signature", head.signature)
    pem = _opt_text("head public_key_pem", head.public_key_pem)
    key_id = _opt_text("head key_id", head.key_id)
    if key_id is not None:
        _text("head key_id", key_id, _SHA256_HEX_LEN)
    if rows and (head.seq != rows[-1]["seq"] or head_hash != rows[-1]["entry_hash"]):
        raise StoreError("ledger head must name the last appended entry")
    now = _now()
    last = session.scalar(
        select(LedgerEntry)
        .where(LedgerEntry.run_id == run_id)
        .order_by(LedgerEntry.seq.desc())
        .limit(1)
    )
    last_seq = 0 if last is None else last.seq
    if rows:
        if rows[0]["seq"] != last_seq + 1:
            raise StoreError(
                f"ledger of run {run_id!r} ends at seq {last_seq}; the "
                f"next entry must be seq {last_seq + 1}, got {rows[0]['seq']}"
            )
        if last is not None and rows[0]["prev_hash"] != last.entry_hash:
            raise StoreError(
                f"ledger entry seq {rows[0]['seq']} does not link to the "
                f"stored entry seq {last_seq}"
            )
        session.execute(insert(LedgerEntry), [{**r, "created_at": now} for r in rows])
    elif head.seq != last_seq or (last is not None and head_hash != last.entry_hash):
        raise StoreError("ledger head must name the stored last entry")
    row = session.get(LedgerHead, run_id, with_for_update=True)
    if row is None:
        row = LedgerHead(run_id=run_id)
        session.add(row)
    row.seq = head.seq
    row.head_hash = head_hash
    row.signature = head_sig
    row.public_key_pem = pem
    row.key_id = key_id
    row.updated_at = now
    session.flush()
    return row


class LedgerStore(StoreBase):
    """The contribution ledger rows and head."""

    # ------------------------------------------------------------------ #
    # Contribution ledger                                                  #
    # ------------------------------------------------------------------ #

    def append_ledger(
        self,
        run_id: str,
        entries: Sequence[LedgerEntryLike],
        head: LedgerHeadLike,
    ) -> LedgerHeadRecord:
        """Append entries to a run's ledger and replace its head, atomically.

        The store keeps the chain append-only and linked; hashing, signing and
        verification are :mod:`fedplat.contribution.ledger`'s. Entries must
        continue the stored chain: consecutive ``seq`` starting right after the
        stored last entry (at 1 for an empty ledger), each ``prev_hash`` equal to
        the previous entry's ``entry_hash``. The head must name the new last
        entry. A concurrent writer that appended first makes this call fail
        instead of forking the chain.

        Parameters
        ----------
        run_id
            The run.
        entries
            New entries in chain order (may be empty to re-sign the head).
        head
            The new head: ``seq`` and ``head_hash`` of the last entry, its
            signature and the public key to verify it with.

        Returns
        -------
        LedgerHeadRecord
            The stored head.
        """
        with self._write() as session:
            # Row lock on PostgreSQL (BEGIN IMMEDIATE on SQLite): appends to one
            # run's ledger are serialised, so two writers cannot both extend it.
            self._require_run(session, run_id, lock=True)
            row = append_ledger_rows(session, run_id, entries, head)
            return _ledger_head_record(row)

    def list_ledger_entries(
        self,
        run_id: str,
        *,
        round_number: int | None = None,
        client_id: str | None = None,
    ) -> list[LedgerEntryRecord]:
        """Return a run's ledger entries in chain order (ascending ``seq``),
        optionally of one round and/or client."""
        query = select(LedgerEntry).where(LedgerEntry.run_id == run_id)
        if round_number is not None:
            query = query.where(LedgerEntry.round_number == round_number)
        if client_id is not None:
            query = query.where(LedgerEntry.client_id == client_id)
        with self._read() as session:
            rows = session.scalars(query.order_by(LedgerEntry.seq))
            return [_ledger_entry_record(r) for r in rows]

    def get_ledger_head(self, run_id: str) -> LedgerHeadRecord | None:
        """Return the signed head of a run's ledger, or ``None`` if it has none."""
        with self._read() as session:
            row = session.get(LedgerHead, run_id)
            return None if row is None else _ledger_head_record(row)
