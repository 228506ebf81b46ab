"""The clients of a run as the monitor lists them: one row per client with its
displayed state (:mod:`fedplat.ui.status`), when it was last heard from and its
history summed over the run, and the clients page's filters.

Free of Streamlit, like :mod:`fedplat.ui.data`, whose participation frame it sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pandas as pd
from fedplat.ui import status

from fedplat.store import ClientRecord
from fedplat.summary import FLAGGED_VERDICTS

CLIENT_COLUMNS = [
    "client_id",
    "name",
    "state",
    "status",
    "last_seen",
    "seen",
    "enrolled_at",
    "num_examples",
    "rounds_selected",
    "rounds_joined",
    "rounds_rejected",
    "rounds_straggled",
    "flagged_rounds",
    "flags",
    "bytes_up",
    "bytes_down",
    "contribution_score",
    "reward_share",
]


def clients_frame(
    clients: Sequence[ClientRecord],
    parts: pd.DataFrame,
    board: pd.DataFrame | None = None,
    *,
    run: status.RunView,
    now: datetime | None = None,
) -> pd.DataFrame:
    """One row per enrolled client with its history summed over the run.

    ``state`` is the client's displayed state in the run ``run``
    (:func:`fedplat.ui.status.client_state`), ``status`` the stored one, ``seen``
    how long ago it was last heard from. ``rounds_joined`` counts succeeded
    updates; ``flagged_rounds`` rounds where the aggregator excluded or flagged
    the update (or contribution accounting marked it suspect);
    ``contribution_score`` and ``reward_share`` come from the leaderboard
    ``board`` (:func:`fedplat.ui.ledger.contributions`; empty without one).
    """
    scores: dict[str, float] = {}
    shares: dict[str, float] = {}
    if board is not None and not board.empty:
        for row in board.itertuples(index=False):
            if pd.notna(row.cumulative_score):
                scores[str(row.client_id)] = float(row.cumulative_score)
            if pd.notna(row.reward_share):
                shares[str(row.client_id)] = float(row.reward_share)
    now = now or datetime.now(UTC)
    rows = []
    for c in clients:
        mine = parts[parts["client_id"] == c.id] if not parts.empty else parts
        labels: set[str] = set()
        for text in mine["flags"] if not mine.empty else []:
            labels.update(x.strip() for x in str(text).split(",") if x.strip())
        rows.append(
            {
                "client_id": c.id,
                "name": c.name,
                "state": status.client_state(c, run),
                "status": c.status,
                "last_seen": c.last_seen,
                "seen": status.ago(c.last_seen, now),
                "enrolled_at": c.enrolled_at,
                "num_examples": c.num_examples,
                "rounds_selected": len(mine),
                "rounds_joined": int((mine["outcome"] == "succeeded").sum()),
                "rounds_rejected": int((mine["outcome"] == "rejected").sum()),
                "rounds_straggled": int((mine["outcome"] == "straggler").sum()),
                "flagged_rounds": int(mine["verdict"].isin(FLAGGED_VERDICTS).sum()),
                "flags": ", ".join(sorted(labels)),
                "bytes_up": int(mine["bytes_up"].sum()),
                "bytes_down": int(mine["bytes_down"].sum()),
                "contribution_score": scores.get(c.id),
                "reward_share": shares.get(c.id),
            }
        )
    return pd.DataFrame(rows, columns=CLIENT_COLUMNS)


@dataclass(frozen=True)
class ClientFilter:
    """The clients page's filters; empty fields filter nothing (``states``:
    displayed states, :data:`fedplat.ui.status.CLIENT_STATES`)."""

    states: tuple[str, ...] = ()
    name_contains: str = ""
    min_rounds_joined: int = 0
    flagged_only: bool = False


def filter_clients(frame: pd.DataFrame, f: ClientFilter) -> pd.DataFrame:
    """Rows of ``clients_frame`` that pass every filter."""
    keep = pd.Series(True, index=frame.index)
    if f.states:
        keep &= frame["state"].isin(f.states)
    if f.name_contains.strip():
        needle = f.name_contains.strip().lower()
        keep &= frame["name"].str.lower().str.contains(needle, regex=False) | frame[
            "client_id"
        ].str.lower().str.contains(needle, regex=False)
    if f.min_rounds_joined > 0:
        keep &= frame["rounds_joined"] >= f.min_rounds_joined
    if f.flagged_only:
        keep &= frame["flagged_rounds"] > 0
    return frame[keep].reset_index(drop=True)


__all__ = ["CLIENT_COLUMNS", "ClientFilter", "clients_frame", "filter_clients"]
