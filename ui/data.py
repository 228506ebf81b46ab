"""Read-only queries of the store, shaped as pandas frames for the monitor's pages.

Nothing here imports Streamlit: every function takes a :class:`~fedplat.store.Store`
(or an engine, for schema introspection) and returns plain data, so the shaping
logic is unit-tested without a browser and cached by the pages as they see fit.

The monitor reads what other components write, some of which may not exist yet in
a given database (privacy, compression, contribution, gossip). Every function
returns an empty frame rather than failing when its source is absent; the pages
turn emptiness into a message saying what is missing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from fedplat.store import (
    ClientRecord,
    ContributionRecord,
    EventRecord,
    MetricRecord,
    ParticipationRecord,
    RoundRecord,
    RunRecord,
    Store,
    Verdict,
)

# Metric names written by other components (see their modules); the monitor only
# reads them, so they are spelled out once here.
METRIC_EPSILON = "privacy.epsilon"
#: Recorded instead of ``privacy.epsilon`` in a round whose ε the accountant could
#: not bound (the store keeps finite numbers only): shown as "unbounded".
METRIC_EPSILON_UNBOUNDED = "privacy.epsilon_unbounded"
METRIC_MAX_EPSILON = "privacy.max_epsilon"
METRIC_COMPRESSION = "compression.ratio"
METRIC_SCORE = "contribution.score"
METRIC_REWARD = "contribution.reward_share"

# --------------------------------------------------------------------------- #
# Participation outcomes and aggregator verdicts                               #
# --------------------------------------------------------------------------- #

#: What happened to a selected client in a round, from its participation status.
#: Participations are written when the round closes, so a client still
#: ``selected`` or ``downloaded`` then never delivered an update; like ``late``
#: and ``dropped`` it is a straggler: the round went on without it.
OUTCOME_OF_STATUS: dict[str, str] = {
    "succeeded": "succeeded",
    "rejected": "rejected",
    "late": "straggler",
    "dropped": "straggler",
    "failed": "failed",
    "selected": "straggler",
    "downloaded": "straggler",
}
OUTCOMES = ("succeeded", "straggler", "rejected", "failed")
# Same colour for the same meaning in every chart: rejected is purple here and in
# the verdict heat map, where red means "excluded by the aggregator".
OUTCOME_COLORS = ("#2e7d32", "#90a4ae", "#6a1b9a", "#424242")

#: The aggregator's verdict on one client in one round (the heat map's colours).
VERDICTS = (
    "accepted",
    "flagged",
    "excluded",
    "suspect",
    "not aggregated",
    "rejected",
    "straggler",
    "failed",
)
VERDICT_COLORS = (
    "#2e7d32",
    "#fb8c00",
    "#c62828",
    "#d81b60",
    "#e0e0e0",
    "#6a1b9a",
    "#90a4ae",
    "#424242",
)


def verdict(
    status: str, v: Verdict, contribution: ContributionRecord | None = None
) -> str:
    """The heat map's label for one participation.

    A succeeded update carries the aggregator's typed verdict (``selected``,
    ``score``, ``flags``) and, when contribution accounting ran, a contribution
    row (``suspect``, ``flags``); an update without a verdict was received but
    never aggregated (its round failed). Other statuses say why there was no
    update to judge. "suspect" (free-riding or an outlier score)
    outranks the aggregator's verdicts, which robust rules also give honest
    clients with unusual data.
    """
    if status != "succeeded":
        return OUTCOME_OF_STATUS.get(status, status)
    if v.selected is None:
        return "not aggregated"
    if contribution is not None and contribution.suspect:
        return "suspect"
    if v.selected is False:
        return "excluded"
    if v.flags:
        return "flagged"
    return "accepted"


def flag_labels(
    v: Verdict, contribution: ContributionRecord | None = None
) -> list[str]:
    """The aggregator's flags plus contribution accounting's own (its ``agg:*``
    labels repeat the aggregator's and are left out)."""
    labels = [str(x) for x in v.flags]
    for x in contribution.flags if contribution is not None else ():
        if not str(x).startswith("agg:") and str(x) not in labels:
            labels.append(str(x))
    return labels


# --------------------------------------------------------------------------- #
# Small helpers                                                                #
# --------------------------------------------------------------------------- #


def _now() -> datetime:
    return datetime.now(UTC)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return ((end or _now()) - start).total_seconds()


def run_mode(run: RunRecord) -> str:
    """``"gossip"`` for decentralized runs, ``"federated"`` otherwise."""
    mode = run.config.get("mode")
    return mode if isinstance(mode, str) and mode else "federated"


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; ``None`` -> ``"-"``."""
    if n is None or not math.isfinite(n):
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - loop always returns


def format_duration(seconds: float | None) -> str:
    """``3725`` -> ``"1h 2m"``; ``None`` -> ``"-"``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {(s % 3600) // 60}m"


# --------------------------------------------------------------------------- #
# Runs                                                                         #
# --------------------------------------------------------------------------- #

RUN_COLUMNS = [
    "run_id",
    "name",
    "status",
    "mode",
    "progress",
    "current_round",
    "total_rounds",
    "clients",
    "participants",
    "best_accuracy",
    "created_at",
    "started_at",
    "finished_at",
    "duration",
    "last_activity",
]


def runs_frame(store: Store) -> pd.DataFrame:
    """One row per run, newest first (see ``RUN_COLUMNS``).

    ``participants`` is "succeeded/selected" in the latest closed round (an open
    round's updates are recorded when it closes), ``last_activity`` the time of
    the newest event.
    """
    rows = []
    for run in store.list_runs():
        closed = [r for r in store.list_rounds(run.id) if r.status != "open"]
        participants = "-"
        if closed:
            last = closed[-1]
            parts = store.list_participations(run.id, round_number=last.number)
            ok = sum(p.status == "succeeded" for p in parts)
            participants = f"{ok}/{last.num_selected}"
        events = store.list_events(run.id, limit=1)
        rows.append(
            {
                "run_id": run.id,
                "name": run.name,
                "status": run.status,
                "mode": run_mode(run),
                "progress": f"{run.current_round}/{run.total_rounds}",
                "current_round": run.current_round,
                "total_rounds": run.total_rounds,
                "clients": len(store.list_clients(run.id)),
                "participants": participants,
                "best_accuracy": run.best_accuracy,
                "created_at": run.created_at,
                "started_at": run.started_at,
                "finished_at": run.finished_at,
                "duration": format_duration(_seconds(run.started_at, run.finished_at)),
                "last_activity": events[0].created_at if events else None,
            }
        )
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


# --------------------------------------------------------------------------- #
# Rounds and participations                                                    #
# --------------------------------------------------------------------------- #

ROUND_COLUMNS = [
    "round",
    "status",
    "accuracy",
    "loss",
    "selected",
    "succeeded",
    "failed",
    "bytes_up",
    "bytes_down",
    "started_at",
    "finished_at",
    "duration_s",
    "reason",
]


def rounds_frame(
    rounds: Sequence[RoundRecord], parts: Sequence[ParticipationRecord]
) -> pd.DataFrame:
    """One row per round, with counts and bytes taken from its participations.

    A round's participations and totals are written together when it closes, so
    they agree; the participations, which the charts draw, are still preferred,
    because a store written before schema 0003 could total a round before its
    last accepted update was recorded. The row's totals stand for a round
    without participations: an open one, of which nothing is recorded until it
    closes.
    """
    live: dict[int, list[ParticipationRecord]] = {}
    for p in parts:
        live.setdefault(p.round_number, []).append(p)
    rows = []
    for r in rounds:
        ok, failed, up, down = r.num_succeeded, r.num_failed, r.bytes_up, r.bytes_down
        ps = live.get(r.number, [])
        if ps:
            ok = sum(p.status == "succeeded" for p in ps)
            failed = sum(
                OUTCOME_OF_STATUS.get(p.status) in ("rejected", "failed", "straggler")
                for p in ps
            )
            up = sum(p.bytes_up for p in ps)
            down = sum(p.bytes_down for p in ps)
        rows.append(
            {
                "round": r.number,
                "status": r.status,
                "accuracy": r.accuracy,
                "loss": r.loss,
                "selected": r.num_selected,
                "succeeded": ok,
                "failed": failed,
                "bytes_up": up,
                "bytes_down": down,
                "started_at": r.started_at,
                "finished_at": r.finished_at,
                "duration_s": _seconds(r.started_at, r.finished_at),
                "reason": r.reason,
            }
        )
    return pd.DataFrame(rows, columns=ROUND_COLUMNS)


PARTICIPATION_COLUMNS = [
    "round",
    "client_id",
    "client",
    "status",
    "outcome",
    "verdict",
    "score",
    "weight",
    "flags",
    "bytes_up",
    "bytes_down",
    "num_examples",
    "duration_s",
    "train_loss",
    "reason",
]


def participations_frame(
    parts: Sequence[ParticipationRecord],
    clients: Sequence[ClientRecord],
    contributions: Sequence[ContributionRecord] = (),
) -> pd.DataFrame:
    """One row per (round, client) with the outcome and the aggregator's verdict."""
    names = {c.id: c.name for c in clients}
    contrib = {(c.round_number, c.client_id): c for c in contributions}
    rows = []
    for p in parts:
        c = contrib.get((p.round_number, p.client_id))
        score = p.verdict.score
        labels = flag_labels(p.verdict, c)
        rows.append(
            {
                "round": p.round_number,
                "client_id": p.client_id,
                "client": names.get(p.client_id, p.client_id),
                "status": p.status,
                "outcome": OUTCOME_OF_STATUS.get(p.status, p.status),
                "verdict": verdict(p.status, p.verdict, c),
                "score": float(score) if isinstance(score, int | float) else None,
                "weight": p.weight,
                "flags": ", ".join(str(x) for x in labels),
                "bytes_up": p.bytes_up,
                "bytes_down": p.bytes_down,
                "num_examples": p.num_examples,
                "duration_s": p.duration_s,
                "train_loss": p.train_loss,
                "reason": p.reason,
            }
        )
    return pd.DataFrame(rows, columns=PARTICIPATION_COLUMNS)


def outcome_counts(parts: pd.DataFrame) -> pd.DataFrame:
    """Long frame ``round, outcome, clients``: how many clients per outcome."""
    if parts.empty:
        return pd.DataFrame(columns=["round", "outcome", "clients"])
    counts = parts.groupby(["round", "outcome"]).size().reset_index(name="clients")
    return counts.sort_values(["round", "outcome"]).reset_index(drop=True)


def traffic_frame(parts: pd.DataFrame) -> pd.DataFrame:
    """Long frame ``round, direction, bytes``: bytes up and down per round."""
    if parts.empty:
        return pd.DataFrame(columns=["round", "direction", "bytes"])
    per_round = parts.groupby("round")[["bytes_up", "bytes_down"]].sum().reset_index()
    long = per_round.melt(id_vars="round", var_name="direction", value_name="bytes")
    long["direction"] = long["direction"].map({"bytes_up": "up", "bytes_down": "down"})
    return long.sort_values(["round", "direction"]).reset_index(drop=True)


# --------------------------------------------------------------------------- #
# Metrics                                                                      #
# --------------------------------------------------------------------------- #


def round_series(metrics: Iterable[MetricRecord], name: str) -> pd.DataFrame:
    """Frame ``round, value`` of one metric per round.

    Run-level values (no ``client_id``) win; the last one written for a round is
    kept (a recomputed value supersedes the earlier one). A metric recorded only
    per client (e.g. a compression ratio measured by each client) is averaged over
    the clients of the round.
    """
    run_level: dict[int, float] = {}
    per_client: dict[int, list[float]] = {}
    for m in metrics:
        if m.name != name or m.round_number is None:
            continue
        if m.client_id is None:
            run_level[m.round_number] = m.value
        else:
            per_client.setdefault(m.round_number, []).append(m.value)
    data = run_level or {r: float(np.mean(v)) for r, v in per_client.items()}
    rows = sorted(data.items())
    return pd.DataFrame(rows, columns=["round", "value"])


def latest_per_client(metrics: Iterable[MetricRecord], name: str) -> dict[str, float]:
    """The newest value of a per-client metric for each client."""
    out: dict[str, tuple[int, float]] = {}
    for m in metrics:
        if m.name != name or m.client_id is None:
            continue
        key = (m.round_number if m.round_number is not None else -1, m.id)
        prev = out.get(m.client_id)
        if prev is None or key[0] >= prev[0]:
            out[m.client_id] = (key[0], m.value)
    return {c: v for c, (_, v) in out.items()}


# --------------------------------------------------------------------------- #
# Clients                                                                      #
# --------------------------------------------------------------------------- #

CLIENT_COLUMNS = [
    "client_id",
    "name",
    "status",
    "last_seen",
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
) -> pd.DataFrame:
    """One row per enrolled client with its history summed over the run.

    ``rounds_joined`` counts succeeded updates; ``flagged_rounds`` rounds where
    the aggregator excluded or flagged the update (or contribution accounting
    marked it suspect); ``contribution_score`` and ``reward_share`` come from
    the :func:`contributions` leaderboard ``board`` (empty without one).
    """
    scores: dict[str, float] = {}
    shares: dict[str, float] = {}
    if board is not None and not board.empty:
        for row in board.itertuples(index=False):
            if pd.notna(row.cumulative_score):
                scores[str(row.client_id)] = float(row.cumulative_score)
            if pd.notna(row.reward_share):
                shares[str(row.client_id)] = float(row.reward_share)
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
                "status": c.status,
                "last_seen": c.last_seen,
                "enrolled_at": c.enrolled_at,
                "num_examples": c.num_examples,
                "rounds_selected": len(mine),
                "rounds_joined": int((mine["outcome"] == "succeeded").sum()),
                "rounds_rejected": int((mine["outcome"] == "rejected").sum()),
                "rounds_straggled": int((mine["outcome"] == "straggler").sum()),
                "flagged_rounds": int(
                    mine["verdict"].isin(["flagged", "excluded", "suspect"]).sum()
                ),
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
    """The clients page's filters; empty fields filter nothing."""

    statuses: tuple[str, ...] = ()
    name_contains: str = ""
    min_rounds_joined: int = 0
    flagged_only: bool = False


def filter_clients(frame: pd.DataFrame, f: ClientFilter) -> pd.DataFrame:
    """Rows of ``clients_frame`` that pass every filter."""
    keep = pd.Series(True, index=frame.index)
    if f.statuses:
        keep &= frame["status"].isin(f.statuses)
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


# --------------------------------------------------------------------------- #
# Events                                                                       #
# --------------------------------------------------------------------------- #


def events_frame(events: Sequence[EventRecord]) -> pd.DataFrame:
    """Events as shown in the run page's log (newest first, as listed)."""
    return pd.DataFrame(
        [
            {
                "time": e.created_at,
                "level": e.level,
                "kind": e.kind,
                "round": e.round_number,
                "client_id": e.client_id,
                "message": e.message,
            }
            for e in events
        ],
        columns=["time", "level", "kind", "round", "client_id", "message"],
    )


def failure_reason(run: RunRecord, events: Sequence[EventRecord]) -> str | None:
    """Why a failed run failed, from its newest error event (``None`` if none)."""
    if run.status != "failed":
        return None
    for e in events:  # newest first
        if e.level == "error":
            return e.message
    for e in events:
        if e.kind == "round_failed":
            return e.message
    return "the run is marked failed; no error event was recorded"


__all__ = [
    "CLIENT_COLUMNS",
    "METRIC_COMPRESSION",
    "METRIC_EPSILON",
    "METRIC_EPSILON_UNBOUNDED",
    "METRIC_MAX_EPSILON",
    "METRIC_REWARD",
    "METRIC_SCORE",
    "OUTCOMES",
    "OUTCOME_COLORS",
    "OUTCOME_OF_STATUS",
    "PARTICIPATION_COLUMNS",
    "ROUND_COLUMNS",
    "RUN_COLUMNS",
    "VERDICTS",
    "VERDICT_COLORS",
    "ClientFilter",
    "clients_frame",
    "events_frame",
    "failure_reason",
    "filter_clients",
    "flag_labels",
    "format_bytes",
    "format_duration",
    "latest_per_client",
    "outcome_counts",
    "participations_frame",
    "round_series",
    "rounds_frame",
    "runs_frame",
    "traffic_frame",
    "verdict",
]
