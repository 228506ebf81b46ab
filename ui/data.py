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

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import pandas as pd
from sqlalchemy import Engine, inspect

from fedplat.store import (
    ClientRecord,
    EventRecord,
    LedgerEntryRecord,
    MetricRecord,
    ParticipationRecord,
    RoundRecord,
    RunRecord,
    Store,
)

# Metric names written by other components (see their modules); the monitor only
# reads them, so they are spelled out once here.
METRIC_EPSILON = "privacy.epsilon"
METRIC_COMPRESSION = "compression.ratio"
METRIC_SCORE = "contribution.score"
METRIC_REWARD = "contribution.reward_share"
METRIC_GOSSIP_NODE_ACC = "gossip.accuracy"
GOSSIP_RUN_METRICS = (
    "gossip.mean_accuracy",
    "gossip.min_accuracy",
    "gossip.consensus_distance",
    "gossip.components",
)

# --------------------------------------------------------------------------- #
# Participation outcomes and aggregator verdicts                               #
# --------------------------------------------------------------------------- #

#: What happened to a selected client in a round, from its participation status.
#: ``late`` and ``dropped`` are both stragglers: the round went on without them.
OUTCOME_OF_STATUS: dict[str, str] = {
    "succeeded": "succeeded",
    "rejected": "rejected",
    "late": "straggler",
    "dropped": "straggler",
    "failed": "failed",
    "selected": "in progress",
    "downloaded": "in progress",
}
OUTCOMES = ("succeeded", "straggler", "rejected", "failed", "in progress")
OUTCOME_COLORS = ("#2e7d32", "#f9a825", "#c62828", "#424242", "#64b5f6")

#: The aggregator's verdict on one client in one round (the heat map's colours).
VERDICTS = (
    "accepted",
    "flagged",
    "excluded",
    "not aggregated",
    "rejected",
    "straggler",
    "failed",
    "in progress",
)
VERDICT_COLORS = (
    "#2e7d32",
    "#fb8c00",
    "#c62828",
    "#bdbdbd",
    "#6a1b9a",
    "#f9a825",
    "#424242",
    "#64b5f6",
)


def verdict(status: str, flags: dict[str, Any]) -> str:
    """The heat map's label for one participation.

    A succeeded update carries the aggregator's decision in ``flags``
    (``{"selected": bool, "score": float | None, "flags": [str, ...]}``); one
    without it was received but never aggregated (the round failed, or it is still
    open). Other statuses say why there was no update to judge.
    """
    if status != "succeeded":
        return OUTCOME_OF_STATUS.get(status, status)
    if not flags:
        return "not aggregated"
    if flags.get("selected") is False:
        return "excluded"
    if flags.get("flags"):
        return "flagged"
    return "accepted"


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

    ``participants`` is "succeeded/selected" in the latest round (an open round
    counts its updates so far), ``last_activity`` the time of the newest event.
    """
    rows = []
    for run in store.list_runs():
        rounds = store.list_rounds(run.id)
        participants = "-"
        if rounds:
            last = rounds[-1]
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
    """One row per round. Counts and bytes of an *open* round come from its
    participations, because the round row is only totalled when it closes."""
    live: dict[int, list[ParticipationRecord]] = {}
    for p in parts:
        live.setdefault(p.round_number, []).append(p)
    rows = []
    for r in rounds:
        ok, failed, up, down = r.num_succeeded, r.num_failed, r.bytes_up, r.bytes_down
        if r.status == "open":
            ps = live.get(r.number, [])
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
    parts: Sequence[ParticipationRecord], clients: Sequence[ClientRecord]
) -> pd.DataFrame:
    """One row per (round, client) with the outcome and the aggregator's verdict."""
    names = {c.id: c.name for c in clients}
    rows = []
    for p in parts:
        score = p.flags.get("score")
        labels = p.flags.get("flags") or []
        rows.append(
            {
                "round": p.round_number,
                "client_id": p.client_id,
                "client": names.get(p.client_id, p.client_id),
                "status": p.status,
                "outcome": OUTCOME_OF_STATUS.get(p.status, p.status),
                "verdict": verdict(p.status, p.flags),
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
    metrics: Sequence[MetricRecord],
) -> pd.DataFrame:
    """One row per enrolled client with its history summed over the run.

    ``rounds_joined`` counts succeeded updates; ``flagged_rounds`` rounds where
    the aggregator excluded or flagged the update; ``contribution_score`` is the
    sum of the per-round ``contribution.score`` values, ``reward_share`` the
    latest ``contribution.reward_share`` (both empty until contribution
    accounting writes them).
    """
    scores: dict[str, float] = {}
    for m in metrics:
        if m.name == METRIC_SCORE and m.client_id is not None:
            scores[m.client_id] = scores.get(m.client_id, 0.0) + m.value
    shares = latest_per_client(metrics, METRIC_REWARD)
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
                    mine["verdict"].isin(["flagged", "excluded"]).sum()
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
# Contributions                                                                #
# --------------------------------------------------------------------------- #


def contribution_frames(
    metrics: Sequence[MetricRecord], clients: Sequence[ClientRecord]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(leaderboard, per_round)`` from the contribution metrics.

    The leaderboard ranks clients by cumulative score (sum over rounds of
    ``contribution.score``) and shows the latest reward share; ``per_round`` is
    ``round, client, score, cumulative`` for the score-over-time chart.
    """
    names = {c.id: c.name for c in clients}
    per_round_rows = [
        {
            "round": m.round_number if m.round_number is not None else 0,
            "client_id": m.client_id,
            "client": names.get(m.client_id, m.client_id),
            "score": m.value,
        }
        for m in metrics
        if m.name == METRIC_SCORE and m.client_id is not None
    ]
    per_round = pd.DataFrame(
        per_round_rows, columns=["round", "client_id", "client", "score"]
    )
    shares = latest_per_client(metrics, METRIC_REWARD)
    if per_round.empty and not shares:
        return (
            pd.DataFrame(
                columns=[
                    "rank",
                    "client",
                    "client_id",
                    "cumulative_score",
                    "last_score",
                    "rounds_scored",
                    "reward_share",
                ]
            ),
            per_round.assign(cumulative=pd.Series(dtype=float)),
        )
    per_round = per_round.sort_values(["client_id", "round"]).reset_index(drop=True)
    per_round["cumulative"] = per_round.groupby("client_id")["score"].cumsum()
    ids = sorted(set(per_round["client_id"]) | set(shares))
    rows = []
    for cid in ids:
        mine = per_round[per_round["client_id"] == cid]
        rows.append(
            {
                "client": names.get(cid, cid),
                "client_id": cid,
                "cumulative_score": float(mine["score"].sum()) if len(mine) else None,
                "last_score": float(mine["score"].iloc[-1]) if len(mine) else None,
                "rounds_scored": len(mine),
                "reward_share": shares.get(cid),
            }
        )
    board = pd.DataFrame(rows)
    board = board.sort_values(
        ["cumulative_score", "reward_share"], ascending=False, na_position="last"
    ).reset_index(drop=True)
    board.insert(0, "rank", range(1, len(board) + 1))
    return board, per_round


# Tables of store migration 0002 (contribution ledger). A database the
# coordinator last migrated to 0001 lacks them; the read-only monitor never
# migrates, so it checks for them instead of letting a query fail.
LEDGER_TABLES = ("ledger_entries", "ledger_heads")


def missing_ledger_tables(engine: Engine) -> list[str]:
    """Ledger tables absent from the database (empty when the ledger exists)."""
    present = set(inspect(engine).get_table_names())
    return [t for t in LEDGER_TABLES if t not in present]


LedgerState = Literal["verified", "broken", "empty", "missing", "unavailable", "error"]


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
    paint a sound ledger red or a forged one green. When the tables or the
    verifier are absent it says so plainly.
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
    try:
        from fedplat.contribution.ledger import verify_run_ledger
    except ImportError as exc:
        return LedgerCheck(
            "unavailable",
            f"The ledger has {len(entries)} entries, but its verifier "
            f"(fedplat.contribution.ledger) cannot be imported here: {exc}",
            entries=len(entries),
        )
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
            "signed, key " + (report.key_id or "?")[:16]
            if report.signed
            else ("unsigned")
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


# --------------------------------------------------------------------------- #
# Gossip                                                                       #
# --------------------------------------------------------------------------- #

#: Event kinds that change the gossip graph, and what each does.
NODE_DOWN = ("gossip_node_removed",)
NODE_UP = ("gossip_node_rejoined",)
LINK_DOWN = ("gossip_link_cut", "gossip_partition")
LINK_UP = ("gossip_link_healed", "gossip_heal")

Edge = tuple[str, str]


def _edge(u: object, v: object) -> Edge:
    a, b = str(u), str(v)
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class GossipTopology:
    """The base graph of a gossip run, with node ids as strings."""

    nodes: tuple[str, ...]
    edges: tuple[Edge, ...]
    positions: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: Nodes that forward models but hold no data (``topology.relay``).
    relay: frozenset[str] = frozenset()


def gossip_topology(run: RunRecord) -> GossipTopology | None:
    """The graph from the run config's ``topology`` (``None`` if absent)."""
    topo = run.config.get("topology")
    if not isinstance(topo, dict):
        return None
    raw_edges = topo.get("edges") or []
    edges = tuple(sorted({_edge(e[0], e[1]) for e in raw_edges if len(e) >= 2}))
    nodes = [str(n) for n in topo.get("nodes") or []]
    for u, v in edges:  # tolerate an edge list without a node list
        nodes.extend((u, v))
    ordered = tuple(dict.fromkeys(nodes))
    if not ordered:
        return None
    pos: dict[str, tuple[float, float]] = {}
    raw_pos = topo.get("positions") or topo.get("pos") or {}
    if isinstance(raw_pos, dict):
        for k, xy in raw_pos.items():
            if isinstance(xy, list | tuple) and len(xy) >= 2:
                pos[str(k)] = (float(xy[0]), float(xy[1]))
    if set(pos) != set(ordered):
        pos = spring_layout(ordered, edges)
    relay = frozenset(str(v) for v in topo.get("relay") or [])
    return GossipTopology(ordered, edges, pos, relay)


def spring_layout(
    nodes: Sequence[str], edges: Sequence[Edge], iterations: int = 150, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """Fruchterman-Reingold positions in ``[0, 1]^2``, deterministic for a graph.

    A few lines of numpy instead of networkx, which the monitor does not depend
    on; ``O(n^2)`` per iteration is instant for the few hundred nodes one can
    read on a screen.
    """
    n = len(nodes)
    if n == 0:
        return {}
    if n == 1:
        return {nodes[0]: (0.5, 0.5)}
    index = {v: i for i, v in enumerate(nodes)}
    rng = np.random.default_rng(seed)
    # Start on a circle (not at random) so rings and sparse graphs stay readable.
    angle = np.linspace(0, 2 * np.pi, n, endpoint=False)
    xy = np.stack([np.cos(angle), np.sin(angle)], axis=1) + rng.normal(0, 0.01, (n, 2))
    adj = np.zeros((n, n))
    for u, v in edges:
        if u in index and v in index:
            adj[index[u], index[v]] = adj[index[v], index[u]] = 1.0
    k = 1.0 / math.sqrt(n)  # ideal edge length for a unit area
    temp = 0.1
    for _ in range(iterations):
        delta = xy[:, None, :] - xy[None, :, :]  # [n, n, 2]
        dist = np.maximum(np.linalg.norm(delta, axis=-1), 1e-3)  # [n, n]
        force = k * k / dist - adj * dist * dist / k  # repulsion - attraction
        disp = np.einsum("ij,ijk->ik", force / dist, delta)  # [n, 2]
        length = np.maximum(np.linalg.norm(disp, axis=1, keepdims=True), 1e-9)
        xy += disp / length * np.minimum(length, temp)
        temp *= 0.97
    xy -= xy.min(axis=0)
    xy /= np.maximum(xy.max(axis=0), 1e-9)
    return {v: (float(xy[i, 0]), float(xy[i, 1])) for v, i in index.items()}


@dataclass(frozen=True)
class GraphState:
    """Which nodes are dead and which links are cut during one round."""

    round: int
    dead: frozenset[str]
    cut: frozenset[Edge]
    changes: tuple[str, ...]


def graph_state(events: Iterable[EventRecord], round_number: int) -> GraphState:
    """Replay ``gossip_*`` events up to the graph used *during* ``round_number``.

    A change recorded at round ``r`` is applied after round ``r``'s exchange and
    holds from round ``r + 1`` (changes at round 0 hold from the first round), so
    the graph during round ``R`` has every change with ``r < R``. Events carry the
    affected ``nodes`` and ``edges`` (``[u, v]`` pairs) in ``details``.
    """
    dead: set[str] = set()
    cut: set[Edge] = set()
    messages: list[str] = []
    ordered = sorted(
        (e for e in events if e.kind.startswith("gossip_")),
        key=lambda e: (e.round_number or 0, e.created_at, e.id),
    )
    for e in ordered:
        if (e.round_number or 0) >= round_number:
            continue
        nodes = {str(n) for n in e.details.get("nodes") or []}
        edges = {
            _edge(x[0], x[1])
            for x in e.details.get("edges") or []
            if isinstance(x, list | tuple) and len(x) >= 2
        }
        if e.kind in NODE_DOWN:
            dead |= nodes
        elif e.kind in NODE_UP:
            dead -= nodes
        elif e.kind in LINK_DOWN:
            cut |= edges
        elif e.kind in LINK_UP:
            cut -= edges
        else:
            continue
        messages.append(f"round {e.round_number or 0}: {e.message}")
    return GraphState(round_number, frozenset(dead), frozenset(cut), tuple(messages))


def node_accuracy_at(
    metrics: Iterable[MetricRecord], round_number: int
) -> dict[str, float]:
    """Each node's latest ``gossip.accuracy`` at or before ``round_number``
    (accuracy is measured on evaluation rounds only)."""
    best: dict[str, tuple[int, float]] = {}
    for m in metrics:
        if m.name != METRIC_GOSSIP_NODE_ACC or m.client_id is None:
            continue
        r = m.round_number or 0
        if r > round_number:
            continue
        prev = best.get(m.client_id)
        if prev is None or r >= prev[0]:
            best[m.client_id] = (r, m.value)
    return {c: v for c, (_, v) in best.items()}


def gossip_graph_frames(
    topo: GossipTopology, state: GraphState, accuracy: dict[str, float]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(nodes, edges)`` frames for the graph chart.

    ``nodes``: ``node, x, y, state ("alive"/"dead"), role ("data"/"relay"),
    accuracy, degree`` (live links);
    ``edges``: ``u, v, x, y, x2, y2, state ("up"/"cut"/"dead node")``. A link to a
    dead node is drawn as down even if it was never cut itself.
    """
    alive_degree = dict.fromkeys(topo.nodes, 0)
    edge_rows = []
    for u, v in topo.edges:
        if u in state.dead or v in state.dead:
            st = "dead node"
        elif (u, v) in state.cut:
            st = "cut"
        else:
            st = "up"
            alive_degree[u] += 1
            alive_degree[v] += 1
        (x, y), (x2, y2) = topo.positions[u], topo.positions[v]
        edge_rows.append(
            {"u": u, "v": v, "x": x, "y": y, "x2": x2, "y2": y2, "state": st}
        )
    node_rows = [
        {
            "node": n,
            "x": topo.positions[n][0],
            "y": topo.positions[n][1],
            "state": "dead" if n in state.dead else "alive",
            "role": "relay" if n in topo.relay else "data",
            "accuracy": accuracy.get(n),
            "degree": alive_degree[n],
        }
        for n in topo.nodes
    ]
    return (
        pd.DataFrame(
            node_rows,
            columns=["node", "x", "y", "state", "role", "accuracy", "degree"],
        ),
        pd.DataFrame(edge_rows, columns=["u", "v", "x", "y", "x2", "y2", "state"]),
    )


def live_components(topo: GossipTopology, state: GraphState) -> int:
    """Connected components among live nodes over links that are up."""
    parent = {n: n for n in topo.nodes if n not in state.dead}

    def find(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]  # path halving
            v = parent[v]
        return v

    for u, v in topo.edges:
        if u in parent and v in parent and (u, v) not in state.cut:
            parent[find(u)] = find(v)
    return len({find(v) for v in parent})


def gossip_series(metrics: Sequence[MetricRecord]) -> pd.DataFrame:
    """Long frame ``round, metric, value`` of the run-level gossip metrics."""
    frames = []
    for name in GOSSIP_RUN_METRICS:
        s = round_series(metrics, name)
        if not s.empty:
            frames.append(s.assign(metric=name.removeprefix("gossip.")))
    if not frames:
        return pd.DataFrame(columns=["round", "metric", "value"])
    return pd.concat(frames, ignore_index=True)[["round", "metric", "value"]]


def gossip_rounds(run: RunRecord, metrics: Sequence[MetricRecord]) -> int:
    """The last round a gossip run has data for (0 if none)."""
    seen = [m.round_number for m in metrics if m.round_number is not None]
    return max([run.current_round, *seen])


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
    "GOSSIP_RUN_METRICS",
    "LEDGER_TABLES",
    "METRIC_COMPRESSION",
    "METRIC_EPSILON",
    "METRIC_GOSSIP_NODE_ACC",
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
    "GossipTopology",
    "GraphState",
    "LedgerCheck",
    "LedgerProblemRow",
    "clients_frame",
    "contribution_frames",
    "events_frame",
    "failure_reason",
    "filter_clients",
    "format_bytes",
    "format_duration",
    "gossip_graph_frames",
    "gossip_rounds",
    "gossip_series",
    "gossip_topology",
    "graph_state",
    "latest_per_client",
    "ledger_frame",
    "live_components",
    "missing_ledger_tables",
    "node_accuracy_at",
    "outcome_counts",
    "participations_frame",
    "round_series",
    "rounds_frame",
    "runs_frame",
    "spring_layout",
    "traffic_frame",
    "verdict",
    "verify_ledger",
]
