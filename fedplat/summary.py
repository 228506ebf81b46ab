"""What a run came to, read from the store: the end-of-run summary that ``fedplat
coordinator`` prints and the monitor's summary panel shows.

:func:`run_summary` gathers the data once (rounds, best and final accuracy,
bytes, privacy spent, flagged clients, the ledger's verification, where the
model is); :func:`summary_lines` and :func:`export_command` turn it into text.
The reading of per-client records that both need lives here too: the verdict of
one participation (:func:`verdict`) and the ledger's check (:func:`ledger_check`).

Imports neither torch nor pandas at module level (the monitor imports it); the
ledger verifier is imported when a ledger is there to verify.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fedplat.best import best_round
from fedplat.store import (
    ContributionRecord,
    MetricRecord,
    Store,
    StoreError,
    Verdict,
)

# Metric names written by central DP (fedplat.server.central_dp, which imports torch);
# readers spell them out once here.
METRIC_EPSILON = "privacy.epsilon"
#: Recorded instead of ``privacy.epsilon`` in a round whose ε the accountant could
#: not bound (the store keeps finite numbers only): "unbounded" from then on.
METRIC_EPSILON_UNBOUNDED = "privacy.epsilon_unbounded"
#: The budget a run's ε is spent against.
METRIC_MAX_EPSILON = "privacy.max_epsilon"

# --------------------------------------------------------------------------- #
# One participation: what happened, and what the aggregator made of it        #
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
#: Verdicts that single a client out (the summary's "flagged clients").
FLAGGED_VERDICTS = ("flagged", "excluded", "suspect")
#: Flags every update may get as a matter of course, not a judgement on the
#: client: central DP clips each update to the clipping norm; the weight cap
#: (k x the round's median declared count) binds honest clients with much more
#: data than the others. A norm-bounded update (k x the median norm) is unusual
#: and stays flagged.
ROUTINE_FLAGS = ("dp-clipped", "weight-capped")


def verdict(
    status: str, v: Verdict, contribution: ContributionRecord | None = None
) -> str:
    """The label of one participation (the monitor's heat map colours).

    A succeeded update carries the aggregator's typed verdict (``selected``,
    ``score``, ``flags``) and, when contribution accounting ran, a contribution
    row (``suspect``, ``flags``); an update without a verdict was received but
    never aggregated (its round failed). Other statuses say why there was no
    update to judge. "suspect" (free-riding or an outlier score) outranks the
    aggregator's verdicts, which robust rules also give honest clients with
    unusual data; routine flags (:data:`ROUTINE_FLAGS`) flag nobody.
    """
    if status != "succeeded":
        return OUTCOME_OF_STATUS.get(status, status)
    if v.selected is None:
        return "not aggregated"
    if contribution is not None and contribution.suspect:
        return "suspect"
    if v.selected is False:
        return "excluded"
    if any(f not in ROUTINE_FLAGS for f in v.flags):
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


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; ``None`` -> ``"-"``."""
    if n is None or not math.isfinite(n):
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


# --------------------------------------------------------------------------- #
# The ledger                                                                   #
# --------------------------------------------------------------------------- #

LedgerState = Literal["verified", "broken", "empty", "error"]


@dataclass(frozen=True)
class LedgerProblemRow:
    """One problem the verifier found, tied to an entry (``seq``) when it can be."""

    kind: str
    message: str
    seq: int | None


@dataclass(frozen=True)
class LedgerCheck:
    """Outcome of verifying a run's ledger (the monitor's green/red badge)."""

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


def ledger_check(store: Store, run_id: str) -> LedgerCheck:
    """Verify the run's hash chain and head signature.

    The hashing and signature scheme belong to :mod:`fedplat.contribution.ledger`;
    this calls its verifier rather than re-implementing it, which could paint a
    sound ledger red or a forged one green. Its policy applies too: an unsigned
    ledger is reported as a problem, as ``fedplat ledger verify`` does.
    """
    entries = store.list_ledger_entries(run_id)
    if not entries and store.get_ledger_head(run_id) is None:
        return LedgerCheck(
            "empty",
            "No ledger entries for this run: contribution accounting did not "
            "record any (it may be disabled for this run).",
        )
    # Imported here: fedplat.contribution imports torch (~4 s, ~300 MB), which a
    # reader needs only once there is a ledger to verify.
    from fedplat.contribution.ledger_verify import verify_run_ledger

    try:
        report = verify_run_ledger(store, run_id)
    except StoreError:
        raise
    except Exception as exc:  # a verifier crash must not take a reader down
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
        message = f"{report.entries} entries, chain intact ({how})"
    else:
        message = f"{len(problems)} problem(s) in {report.entries} entries"
    return LedgerCheck(
        "verified" if report.ok else "broken",
        message,
        entries=report.entries,
        signed=report.signed,
        key_id=report.key_id,
        problems=problems,
    )


# --------------------------------------------------------------------------- #
# The summary                                                                  #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class FlaggedClient:
    """A client singled out in ``rounds`` rounds (``verdicts``: which kinds)."""

    client_id: str
    name: str
    rounds: int
    verdicts: tuple[str, ...]


@dataclass(frozen=True)
class RunSummary:
    """What a run came to (see :func:`run_summary`).

    ``final_round`` is the last completed round (its checkpoint is
    ``model_path``), ``final_accuracy`` the accuracy of the newest evaluated
    round (``accuracy_round``), ``epsilon`` the privacy spent so far (``None``
    without differential privacy, ``inf`` when unbounded) at ``delta``.
    """

    run_id: str
    run_name: str
    status: str
    reason: str | None
    rounds_completed: int
    total_rounds: int
    final_round: int | None
    model_path: str | None
    final_accuracy: float | None
    accuracy_round: int | None
    best_accuracy: float | None
    best_round: int | None
    bytes_up: int
    bytes_down: int
    epsilon: float | None
    delta: float | None
    flagged: tuple[FlaggedClient, ...]
    ledger: LedgerCheck


def _epsilon(metrics: Sequence[MetricRecord]) -> float | None:
    spent = [
        m
        for m in metrics
        if m.name in (METRIC_EPSILON, METRIC_EPSILON_UNBOUNDED)
        and m.client_id is None
        and m.round_number
    ]
    if not spent:
        return None
    last = max(spent, key=lambda m: (m.round_number or 0, m.id))
    return math.inf if last.name == METRIC_EPSILON_UNBOUNDED else last.value


def _flagged(store: Store, run_id: str) -> tuple[FlaggedClient, ...]:
    names = {c.id: c.name for c in store.list_clients(run_id)}
    contrib = {
        (c.round_number, c.client_id): c for c in store.list_contributions(run_id)
    }
    judged: dict[str, list[str]] = {}
    for p in store.list_participations(run_id):
        v = verdict(p.status, p.verdict, contrib.get((p.round_number, p.client_id)))
        if v in FLAGGED_VERDICTS:
            judged.setdefault(p.client_id, []).append(v)
    found = [
        FlaggedClient(
            cid,
            names.get(cid, cid),
            len(vs),
            tuple(v for v in FLAGGED_VERDICTS if v in vs),
        )
        for cid, vs in judged.items()
    ]
    return tuple(sorted(found, key=lambda f: (-f.rounds, f.name)))


def run_summary(
    store: Store, run_id: str, *, ledger: LedgerCheck | None = None
) -> RunSummary:
    """Summarize the run ``run_id`` (``ledger``: a check the caller already made).

    Raises :class:`~fedplat.store.StoreError` for an unknown run.
    """
    run = store.get_run(run_id)
    if run is None:
        raise StoreError(f"unknown run {run_id!r}")
    rounds = store.list_rounds(run_id)
    closed = [r for r in rounds if r.status != "open"]
    done = [r for r in rounds if r.status == "completed"]
    evaluated = [r for r in done if r.accuracy is not None]
    best = best_round(done)
    epsilon = _epsilon(store.list_metrics(run_id))
    privacy = run.config.get("privacy")
    delta = privacy.get("delta") if isinstance(privacy, dict) else None
    return RunSummary(
        run_id=run.id,
        run_name=run.name,
        status=run.status,
        reason=run.reason,
        rounds_completed=run.current_round,
        total_rounds=run.total_rounds,
        final_round=done[-1].number if done else None,
        model_path=done[-1].checkpoint_path if done else None,
        final_accuracy=evaluated[-1].accuracy if evaluated else None,
        accuracy_round=evaluated[-1].number if evaluated else None,
        best_accuracy=best.accuracy if best is not None else None,
        best_round=best.number
        if best is not None and best.accuracy is not None
        else None,
        bytes_up=sum(r.bytes_up for r in closed),
        bytes_down=sum(r.bytes_down for r in closed),
        epsilon=epsilon,
        delta=float(delta)
        if epsilon is not None and isinstance(delta, int | float)
        else None,
        flagged=_flagged(store, run_id),
        ledger=ledger if ledger is not None else ledger_check(store, run_id),
    )


def _pct(x: float) -> str:
    return f"{x:.2%}"


def summary_lines(s: RunSummary) -> list[str]:
    """The summary as lines of text (``fedplat coordinator`` prints them)."""
    head = (
        f"run {s.run_name!r} {s.status}: {s.rounds_completed}/{s.total_rounds} rounds"
    )
    lines = [head + (f" ({s.reason})" if s.reason else "")]
    if s.final_accuracy is not None and s.accuracy_round is not None:
        acc = f"  accuracy: final {_pct(s.final_accuracy)} (round {s.accuracy_round})"
        if s.best_accuracy is not None and s.best_round is not None:
            acc += f", best {_pct(s.best_accuracy)} (round {s.best_round})"
        lines.append(acc)
    else:
        lines.append("  accuracy: not evaluated")
    lines.append(
        f"  traffic: {format_bytes(s.bytes_up)} up, {format_bytes(s.bytes_down)} down"
    )
    if s.epsilon is not None:
        eps = "unbounded" if math.isinf(s.epsilon) else f"{s.epsilon:.4g}"
        at = f" at delta {s.delta:g}" if s.delta is not None else ""
        lines.append(f"  privacy: epsilon {eps}{at}")
    if s.flagged:
        who = ", ".join(
            f"{f.name} ({'/'.join(f.verdicts)} in {f.rounds} round"
            f"{'s' if f.rounds != 1 else ''})"
            for f in s.flagged
        )
        lines.append(f"  flagged clients: {who}")
    else:
        lines.append("  flagged clients: none")
    lines.append(f"  ledger: {s.ledger.state}: {s.ledger.message}")
    if s.model_path is not None:
        lines.append(f"  model: {s.model_path} (round {s.final_round})")
    else:
        lines.append("  model: no completed round, nothing to export")
    return lines


def export_command(s: RunSummary, db: str, fmt: str = "safetensors") -> str | None:
    """The ``fedplat export`` command line writing the final model to the
    current folder (``None`` when no round completed). ``db`` is shown as given:
    pass a URL with its password masked."""
    if s.final_round is None:
        return None
    suffix = {"torch": "pt"}.get(fmt, fmt)
    return shlex.join(
        [
            "fedplat",
            "export",
            "--db",
            db,
            "--run",
            s.run_name,
            "--format",
            fmt,
            "--out",
            f"{re.sub(r'[^A-Za-z0-9._-]+', '_', s.run_name)}.{suffix}",
        ]
    )


__all__ = [
    "FLAGGED_VERDICTS",
    "METRIC_EPSILON",
    "METRIC_EPSILON_UNBOUNDED",
    "METRIC_MAX_EPSILON",
    "OUTCOME_OF_STATUS",
    "ROUTINE_FLAGS",
    "FlaggedClient",
    "LedgerCheck",
    "LedgerProblemRow",
    "LedgerState",
    "RunSummary",
    "export_command",
    "flag_labels",
    "format_bytes",
    "ledger_check",
    "run_summary",
    "summary_lines",
    "verdict",
]
