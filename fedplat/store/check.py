"""``fedplat store check``: the invariants a store must hold, checked from outside.

Per run: rounds ``1..current_round`` are completed and contiguous (gossip runs
keep no round rows, only ``current_round``); a completed round has a checkpoint,
its counters equal what its participations say (selected == rows, aggregated ==
succeeded, failed == the rest, byte totals == sums), and no participation or
contribution belongs to an open round or to a client that was not selected; the
contribution ledger's hash chain and signature verify.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedplat.contribution.ledger_verify import verify_run_ledger
from fedplat.store.records import RoundRecord, RunRecord
from fedplat.store.repository import Store


@dataclass(frozen=True)
class Problem:
    run: str
    round: int | None
    message: str

    def __str__(self) -> str:
        where = f"run {self.run!r}" + (f" round {self.round}" if self.round else "")
        return f"{where}: {self.message}"


def _check_round(store: Store, run: RunRecord, r: RoundRecord) -> list[Problem]:
    out: list[Problem] = []

    def bad(msg: str) -> None:
        out.append(Problem(run.name, r.number, msg))

    parts = store.list_participations(run.id, r.number)
    contribs = store.list_contributions(run.id, r.number)
    if r.status == "open":
        if parts or contribs:
            bad(
                f"open round holds {len(parts)} participations and "
                f"{len(contribs)} contributions"
            )
        return out
    ok = sum(p.status == "succeeded" for p in parts)
    if len(parts) != r.num_selected:
        bad(f"{len(parts)} participations for {r.num_selected} selected clients")
    if r.num_succeeded != ok or r.num_failed != len(parts) - ok:
        bad(f"counters {r.num_succeeded}/{r.num_failed} but {ok} succeeded rows")
    if r.status == "completed" and r.num_aggregated != ok:
        bad(f"{r.num_aggregated} aggregated updates but {ok} succeeded")
    if r.bytes_up != sum(p.bytes_up for p in parts):
        bad("bytes_up differs from the sum over participations")
    if r.bytes_down != sum(p.bytes_down for p in parts):
        bad("bytes_down differs from the sum over participations")
    federated = run.config.get("mode") != "gossip"
    if federated and r.status == "completed" and not r.checkpoint_sha256:
        bad("completed without a recorded checkpoint")
    aggregated = [p for p in parts if p.verdict.selected is not None]
    if any(p.status != "succeeded" for p in aggregated):
        bad("a verdict is recorded for an update that did not succeed")
    selected = {p.client_id for p in parts}
    stray = sorted(c.client_id for c in contribs if c.client_id not in selected)
    if stray:
        bad(f"contributions for clients not in the round: {stray[:5]}")
    return out


def check_run(store: Store, run: RunRecord) -> list[Problem]:
    """Every invariant of one run (an empty list when it holds)."""
    problems: list[Problem] = []
    rounds = store.list_rounds(run.id)
    completed = [r.number for r in rounds if r.status == "completed"]
    if completed != list(range(1, len(completed) + 1)):
        problems.append(Problem(run.name, None, f"completed rounds {completed}"))
    # A gossip run has no round rows: its current_round is advanced directly
    # (fedplat.gossip.recorder), so there is nothing to compare it with.
    federated = run.config.get("mode") != "gossip"
    if federated and run.current_round != (completed[-1] if completed else 0):
        problems.append(
            Problem(
                run.name,
                None,
                f"current_round {run.current_round} differs "
                f"from the last completed round",
            )
        )
    if run.current_round > run.total_rounds:
        problems.append(Problem(run.name, None, "current_round > total_rounds"))
    for r in rounds:
        problems += _check_round(store, run, r)
    if store.get_ledger_head(run.id) is not None:
        report = verify_run_ledger(store, run.id, None, require_signature=False)
        problems += [
            Problem(run.name, None, f"ledger: {p.message}") for p in report.problems
        ]
    return problems


def check_store(store: Store, run_name: str | None = None) -> list[Problem]:
    """Problems of one run (by name or id) or of every run in the store."""
    if run_name is not None:
        run = store.get_run_by_name(run_name) or store.get_run(run_name)
        runs = [] if run is None else [run]
        if run is None:
            return [Problem(run_name, None, "no such run")]
    else:
        runs = store.list_runs()
    out: list[Problem] = []
    for run in runs:
        out += check_run(store, run)
    return out


__all__ = ["Problem", "check_run", "check_store"]
