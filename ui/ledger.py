"""Contribution accounting as the monitor shows it: leaderboard, reward shares and
the ledger's verification.

Read-only and free of Streamlit, like :mod:`fedplat.ui.data`. The ledger's
verification itself is :func:`fedplat.summary.ledger_check`, shared with the
end-of-run summary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from fedplat.ui.data import METRIC_REWARD, METRIC_SCORE, latest_per_client

from fedplat.store import ClientRecord, LedgerEntryRecord, MetricRecord
from fedplat.summary import LedgerCheck

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


def ledger_frame(
    entries: Sequence[LedgerEntryRecord],
    check: LedgerCheck | None = None,
    clients: Sequence[ClientRecord] = (),
) -> pd.DataFrame:
    """The run's ledger entries in chain order, their content decoded, with the
    verifier's problems (if any) on the entries they concern (the verifier is
    :func:`fedplat.summary.ledger_check`)."""
    names = {c.id: c.name for c in clients}
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
                "client": names.get(e.client_id, e.client_id),
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
            "client",
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
    "PER_ROUND_COLUMNS",
    "Contributions",
    "contributions",
    "ledger_frame",
]
