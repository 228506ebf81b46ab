"""Contribution accounting as the monitor shows it: leaderboard, reward shares and
the ledger's verification.

Read-only and free of Streamlit, like :mod:`fedplat.ui.data`. The ledger tables
arrive with store migration 0002; a database last migrated before that lacks them,
and every function here treats that as "nothing recorded" instead of failing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
from fedplat.ui.data import METRIC_REWARD, METRIC_SCORE, latest_per_client
from sqlalchemy import Engine, inspect

from fedplat.store import (
    ClientRecord,
    LedgerEntryRecord,
    MetricRecord,
    Store,
)

BOARD_COLUMNS = [
    "rank",
    "client",
    "client_id",
    "cumulative_score",
    "last_score",
    "rounds_scored",
    "flagged_rounds",
    "reward_share",
]
PER_ROUND_COLUMNS = ["round", "client_id", "client", "score", "cumulative"]


@dataclass(frozen=True)
class Contributions:
    """The contributions page's data.

    ``board``: one row per client (``BOARD_COLUMNS``), best first;
    ``per_round``: ``PER_ROUND_COLUMNS`` for the score-over-rounds chart;
    ``source``: ``"ledger"``, ``"metrics"`` or ``None`` (nothing recorded).
    """

    board: pd.DataFrame
    per_round: pd.DataFrame
    source: str | None


def _ledger_payload(e: LedgerEntryRecord) -> dict[str, Any]:
    try:
        payload = json.loads(e.payload_json)
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _rank(rows: list[dict[str, Any]]) -> pd.DataFrame:
    board = pd.DataFrame(rows, columns=BOARD_COLUMNS[1:])
    board = board.sort_values(
        ["cumulative_score", "reward_share"], ascending=False, na_position="last"
    ).reset_index(drop=True)
    board.insert(0, "rank", range(1, len(board) + 1))
    return board


def _from_ledger(
    entries: Sequence[LedgerEntryRecord], names: dict[str, str]
) -> Contributions:
    # A retried round is accounted again; the later entry (higher seq) replaces
    # the earlier one for that round and client.
    latest: dict[tuple[int, str], tuple[int, dict[str, Any]]] = {}
    for e in entries:
        key = (e.round_number, e.client_id)
        if key not in latest or e.seq > latest[key][0]:
            latest[key] = (e.seq, _ledger_payload(e))
    per_round_rows = []
    for (rnd, cid), (_, payload) in sorted(latest.items()):
        per_round_rows.append(
            {
                "round": rnd,
                "client_id": cid,
                "client": names.get(cid, cid),
                "score": _num(payload.get("credit")),
                "cumulative": _num(payload.get("cumulative")),
                "reward_share": _num(payload.get("reward_share")),
                "suspect": bool(payload.get("suspect")),
            }
        )
    frame = pd.DataFrame(
        per_round_rows, columns=[*PER_ROUND_COLUMNS, "reward_share", "suspect"]
    )
    rows = []
    for cid, mine in frame.groupby("client_id", sort=True):
        last = mine.sort_values("round").iloc[-1]
        rows.append(
            {
                "client": names.get(str(cid), str(cid)),
                "client_id": str(cid),
                "cumulative_score": last["cumulative"],
                "last_score": last["score"],
                "rounds_scored": len(mine),
                "flagged_rounds": int(mine["suspect"].sum()),
                "reward_share": last["reward_share"],
            }
        )
    return Contributions(_rank(rows), frame[PER_ROUND_COLUMNS], "ledger")


def _from_metrics(
    metrics: Sequence[MetricRecord], names: dict[str, str]
) -> Contributions:
    per_round = pd.DataFrame(
        [
            {
                "round": m.round_number if m.round_number is not None else 0,
                "client_id": m.client_id,
                "client": names.get(m.client_id, m.client_id),
                "score": m.value,
            }
            for m in metrics
            if m.name == METRIC_SCORE and m.client_id is not None
        ],
        columns=["round", "client_id", "client", "score"],
    )
    per_round = per_round.sort_values(["client_id", "round"]).reset_index(drop=True)
    per_round["cumulative"] = per_round.groupby("client_id")["score"].cumsum()
    shares = latest_per_client(metrics, METRIC_REWARD)
    rows = []
    for cid in sorted(set(per_round["client_id"]) | set(shares)):
        mine = per_round[per_round["client_id"] == cid]
        rows.append(
            {
                "client": names.get(cid, cid),
                "client_id": cid,
                "cumulative_score": float(mine["score"].sum()) if len(mine) else None,
                "last_score": float(mine["score"].iloc[-1]) if len(mine) else None,
                "rounds_scored": len(mine),
                "flagged_rounds": None,
                "reward_share": shares.get(cid),
            }
        )
    return Contributions(_rank(rows), per_round[PER_ROUND_COLUMNS], "metrics")


def contributions(
    clients: Sequence[ClientRecord],
    entries: Sequence[LedgerEntryRecord] = (),
    metrics: Sequence[MetricRecord] = (),
) -> Contributions:
    """Leaderboard and per-round scores of a run.

    The ledger is the record of contribution accounting (per client and round:
    the credited score, the cumulative score, the reward share, whether it was
    suspect), so it is used when the run has one. Otherwise per-client metrics
    ``contribution.score`` (summed over rounds) and ``contribution.reward_share``
    (latest) are used, for stores written without a ledger.
    """
    names = {c.id: c.name for c in clients}
    if entries:
        return _from_ledger(entries, names)
    if any(
        m.name in (METRIC_SCORE, METRIC_REWARD) and m.client_id is not None
        for m in metrics
    ):
        return _from_metrics(metrics, names)
    return Contributions(
        pd.DataFrame(columns=BOARD_COLUMNS),
        pd.DataFrame(columns=PER_ROUND_COLUMNS),
        None,
    )


# Tables of store migration 0002 (contribution ledger). A database the
# coordinator last migrated to 0001 lacks them; the read-only monitor never
# migrates, so it checks for them instead of letting a query fail.
LEDGER_TABLES = ("ledger_entries", "ledger_heads")


def missing_ledger_tables(engine: Engine) -> list[str]:
    """Ledger tables absent from the database (empty when the ledger exists)."""
    present = set(inspect(engine).get_table_names())
    return [t for t in LEDGER_TABLES if t not in present]


LedgerState = Literal["verified", "broken", "empty", "missing", "error"]


@dataclass(frozen=True)
class LedgerProblemRow:
    """One problem the verifier found, tied to an entry (``seq``) when it can be."""

    kind: str
    message: str
    seq: int | None


@dataclass(frozen=True)
class LedgerCheck:
    """Outcome of verifying a run's ledger, for the green/red badge."""

    state: LedgerState
    message: str
    entries: int = 0
    signed: bool = False
    key_id: str | None = None
    problems: tuple[LedgerProblemRow, ...] = ()

    @property
    def first_bad_seq(self) -> int | None:
        """The lowest entry ``seq`` named by a problem (``None`` if none is)."""
        seqs = [p.seq for p in self.problems if p.seq is not None]
        return min(seqs) if seqs else None


def verify_ledger(store: Store, engine: Engine, run_id: str) -> LedgerCheck:
    """Verify the run's hash chain and head signature.

    The hashing and signature scheme belong to :mod:`fedplat.contribution.ledger`;
    the monitor calls its verifier rather than re-implementing it, which could
    paint a sound ledger red or a forged one green. Its policy applies too: an
    unsigned ledger is reported as a problem, as ``fedplat ledger verify`` does.
    """
    missing = missing_ledger_tables(engine)
    if missing:
        return LedgerCheck(
            "missing",
            f"This database has no contribution ledger (tables {missing} are "
            "absent): they come with store migration 0002, which the coordinator "
            "applies when it starts; this database was last migrated by an older "
            "version.",
        )
    entries = store.list_ledger_entries(run_id)
    head = store.get_ledger_head(run_id)
    if not entries and head is None:
        return LedgerCheck(
            "empty",
            "No ledger entries for this run: contribution accounting did not "
            "record any (it may be disabled for this run).",
        )
    # Imported here, not at the top: fedplat.contribution's package imports torch
    # (~4 s, ~300 MB), which the monitor needs only once a ledger is on screen.
    from fedplat.contribution.ledger_verify import verify_run_ledger

    try:
        report = verify_run_ledger(store, run_id)
    except Exception as exc:  # a verifier crash must not take the page down
        return LedgerCheck(
            "error",
            f"Verification raised {type(exc).__name__}: {exc}",
            entries=len(entries),
        )
    problems = tuple(
        LedgerProblemRow(p.kind, p.message, p.seq) for p in report.problems
    )
    if report.ok:
        how = (
            f"signed, key {(report.key_id or '?')[:16]}"
            if report.signed
            else "unsigned"
        )
        return LedgerCheck(
            "verified",
            f"{report.entries} entries, chain intact ({how})",
            entries=report.entries,
            signed=report.signed,
            key_id=report.key_id,
        )
    return LedgerCheck(
        "broken",
        f"{len(problems)} problem(s) in {report.entries} entries",
        entries=report.entries,
        signed=report.signed,
        key_id=report.key_id,
        problems=problems,
    )


def ledger_frame(
    entries: Sequence[LedgerEntryRecord], check: LedgerCheck | None = None
) -> pd.DataFrame:
    """The run's ledger entries in chain order, their content decoded, with the
    verifier's problems (if any) on the entries they concern."""
    by_seq: dict[int, list[str]] = {}
    for p in check.problems if check is not None else ():
        if p.seq is not None:
            by_seq.setdefault(p.seq, []).append(f"{p.kind}: {p.message}")
    rows = []
    for e in entries:
        try:
            payload = json.loads(e.payload_json)
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        scores = payload.get("scores") or {}
        rows.append(
            {
                "seq": e.seq,
                "round": e.round_number,
                "client_id": e.client_id,
                "scores": ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, int | float) else f"{k}={v}"
                    for k, v in sorted(scores.items())
                )
                if isinstance(scores, dict)
                else str(scores),
                "flags": ", ".join(str(f) for f in payload.get("flags") or []),
                "reward_share": payload.get("reward_share"),
                "entry_hash": e.entry_hash[:16],
                "signed": e.signature is not None,
                "problem": "; ".join(by_seq.get(e.seq, [])),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "seq",
            "round",
            "client_id",
            "scores",
            "flags",
            "reward_share",
            "entry_hash",
            "signed",
            "problem",
        ],
    )


__all__ = [
    "BOARD_COLUMNS",
    "LEDGER_TABLES",
    "PER_ROUND_COLUMNS",
    "Contributions",
    "LedgerCheck",
    "LedgerProblemRow",
    "contributions",
    "ledger_frame",
    "missing_ledger_tables",
    "verify_ledger",
]
