"""Helpers for tests that write runs and rounds through the Store API (and, where
a test must break an invariant on purpose, through raw SQL)."""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedplat.contribution.ledger import (
    GENESIS_HASH,
    LedgerEntry,
    LedgerHead,
    chain_entries,
    sign_head,
)
from fedplat.store import (
    ParticipationRow,
    RoundClose,
    RoundRecord,
    Store,
    StoreError,
    Verdict,
)
from fedplat.store.engine import make_engine

#: A well-formed checkpoint hash (a completed federated round records one).
SHA = "ab" * 32


def deadline(minutes: float = 5) -> datetime:
    return datetime.now(UTC) + timedelta(minutes=minutes)


def run_with_clients(
    store: Store, n: int = 3, *, rounds: int = 5, config: dict[str, Any] | None = None
) -> str:
    """A fresh run with clients ``c0 .. c<n-1>``; returns its id."""
    run = store.create_run(
        f"run-{uuid.uuid4().hex[:8]}", config or {"lr": 0.1}, {}, rounds
    )
    for i in range(n):
        store.upsert_client(run.id, f"c{i}", name=f"client {i}", num_examples=10 * i)
    return run.id


def ok(cid: str, *, up: int = 0, down: int = 0, **kw: Any) -> ParticipationRow:
    """A succeeded, aggregated update (weight 1 unless a verdict is given)."""
    kw.setdefault("verdict", Verdict(weight=1.0, selected=True))
    return ParticipationRow(cid, "succeeded", bytes_up=up, bytes_down=down, **kw)


def play_round(
    store: Store,
    run_id: str,
    number: int,
    parts: tuple[ParticipationRow, ...],
    **close: Any,
) -> RoundRecord:
    """Open round ``number`` for ``parts``' clients and close it (``completed``
    with a checkpoint hash unless ``close`` says otherwise)."""
    store.open_round(
        run_id,
        number,
        num_selected=len(parts),
        deadline_at=deadline(),
        model_version=number - 1,
    )
    close.setdefault("status", "completed")
    if close["status"] == "completed":
        close.setdefault("checkpoint_sha256", SHA)
    return store.close_round(run_id, number, RoundClose(participations=parts, **close))


def public_key() -> str:
    """Hex of a fresh raw 32-byte key, as the registry stores client keys."""
    return secrets.token_hex(32)


def ledger_append(
    run_id: str,
    key: Ed25519PrivateKey,
    rounds_clients: list[tuple[int, str]],
    *,
    start_seq: int = 1,
    prev_hash: str = GENESIS_HASH,
) -> tuple[tuple[LedgerEntry, ...], LedgerHead]:
    """Signed ledger entries (credit 1.0 each) and their head, for
    ``RoundClose.ledger`` or ``Store.append_ledger``."""
    contents = [{"round": r, "client_id": c, "credit": 1.0} for r, c in rounds_clients]
    entries = chain_entries(
        run_id, contents, start_seq=start_seq, prev_hash=prev_hash, signing_key=key
    )
    head = sign_head(run_id, entries[-1].seq, entries[-1].entry_hash, key)
    return tuple(entries), head


def race(
    n: int, call: Callable[[int], object]
) -> tuple[list[int], list[BaseException]]:
    """Run ``call(t)`` in ``n`` threads released at once; returns the ``t`` that
    succeeded and the StoreErrors of the others (anything else is re-raised)."""
    barrier = threading.Barrier(n)
    won: list[int] = []
    refused: list[BaseException] = []
    other: list[BaseException] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            call(t)
            won.append(t)
        except StoreError as exc:
            refused.append(exc)
        except BaseException as exc:  # re-raised in the main thread
            other.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread is still running"
    if other:
        raise other[0]
    return won, refused


def sql(url: str, statement: str, **params: Any) -> list[Any]:
    """Run one raw SQL statement in its own transaction; returns its rows."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


__all__ = [
    "SHA",
    "deadline",
    "ledger_append",
    "ok",
    "play_round",
    "public_key",
    "race",
    "run_with_clients",
    "sql",
]
