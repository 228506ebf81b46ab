"""Closing a round: evaluation, contributions, checkpoint, and the one write.

:meth:`RoundCloser.complete` turns an aggregation step into the next model
version: it evaluates the model when due, accounts contributions (row mode),
writes the checkpoint (atomic, SHA-256 recorded), and records the round, its
participations, verdicts, metrics, events and ledger entries in one transaction
through the recorder (:meth:`fedplat.server.recorder.Recorder.close_round`).
Only then does the in-memory model advance, so a crash at any point leaves the
store at the previous round. A run that ends without a round to close is marked
by the recorder too; the best checkpoint is found through the read port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from fedplat.aggregators import FedAvg
from fedplat.server.aggregation import StepResult
from fedplat.server.bounds import reference_extra
from fedplat.server.checkpoint import Checkpoint, prune_checkpoints, save_checkpoint
from fedplat.server.context import RunContext
from fedplat.server.optimizers import ServerOptimizer
from fedplat.server.recorder import (
    ContributionRow,
    EventRow,
    ParticipationRow,
    RoundClose,
    Verdict,
)
from fedplat.server.round import NO_UPDATE, Round

from fedplat.contribution import ContributionError, RoundContribution
from fedplat.protocol.outcomes import OutcomeStatus

log = logging.getLogger("fedplat.server")

#: Per-client metrics kept per round (names are already bounded by serde).
MAX_CLIENT_METRICS = 32
#: Clients named in one round's norm-bound or weight-cap event.
MAX_BOUND_EVENT_CLIENTS = 20


@dataclass(frozen=True)
class Completed:
    accuracy: float | None
    loss: float | None
    run_finished: bool


def participations(
    r: Round, verdicts: dict[str, Verdict]
) -> tuple[ParticipationRow, ...]:
    """One row per selected client, in row (enrolment) order."""
    rows = []
    for a in sorted(r.assignments.values(), key=lambda a: a.row):
        o = r.outcomes[a.client_id]  # final: the round is closed
        rows.append(
            ParticipationRow(
                client_id=a.client_id,
                status=o.status.value,
                bytes_up=o.bytes_up,
                bytes_down=o.bytes_down,
                num_examples=o.num_examples,
                duration_s=o.duration_s,
                train_loss=o.train_loss,
                verdict=verdicts.get(a.client_id, Verdict()),
                reason=o.reason,
            )
        )
    return tuple(rows)


def client_metrics(r: Round) -> dict[str, dict[str, float]]:
    return {
        cid: {f"client.{k}": v for k, v in list(o.metrics.items())[:MAX_CLIENT_METRICS]}
        for cid, o in r.outcomes.items()
        if o.status is OutcomeStatus.SUCCEEDED and o.metrics
    }


def _bound_event(
    r: Round, kind: str, what: str, rows: list[tuple[str, str, dict[str, Any]]]
) -> EventRow:
    """One round's event naming the clients a bound acted on: ``rows`` of
    (client id, text, details), the first :data:`MAX_BOUND_EVENT_CLIENTS`."""
    names = {a.client_id: a.name for a in r.assignments.values()}
    shown = rows[:MAX_BOUND_EVENT_CLIENTS]
    return EventRow(
        kind,
        f"round {r.number}: {len(rows)} {what}: "
        + ", ".join(f"{names[cid]!r} ({text})" for cid, text, _ in shown),
        "warning",
        r.number,
        details={
            "clients": [
                {"client_id": cid, "name": names[cid], **d} for cid, _, d in shown
            ]
        },
    )


def bound_events(r: Round, step: StepResult) -> list[EventRow]:
    """One event per bound that acted in the round (the verdicts carry the
    flags; these carry the numbers)."""
    events = []
    bounded = [
        (
            a.client_id,
            f"norm {a.norm:.3g}, bound {a.bound:.3g}",
            {"norm": a.norm, "bound": a.bound, "scale": a.scale},
        )
        for a in step.accepted
        if a.norm_bounded
    ]
    if bounded:
        what = "update(s) scaled down to the norm bound"
        events.append(_bound_event(r, "norm_bounded", what, bounded))
    capped = [
        (
            a.client_id,
            f"{r.outcomes[a.client_id].num_examples} -> {a.weight:g}",
            {"declared": r.outcomes[a.client_id].num_examples, "weight": a.weight},
        )
        for a in step.accepted
        if a.weight_capped
    ]
    if capped:
        what = "weight(s) capped below the declared example count"
        events.append(_bound_event(r, "weight_capped", what, capped))
    return events


def bound_metrics(r: Round, step: StepResult) -> dict[str, float]:
    """The round's bounds as metrics (only those that were on)."""
    bounds = r.accumulator.bounds
    m: dict[str, float] = {}
    if bounds.norm is not None:
        used = sorted(a.bound for a in step.accepted if a.bound is not None)
        m["norm_bound.bounded"] = float(sum(a.norm_bounded for a in step.accepted))
        if used:
            m["norm_bound.bound"] = used[(len(used) - 1) // 2]
    if bounds.weight_cap is not None:
        m["weight_bound.cap"] = bounds.weight_cap
        m["weight_bound.capped"] = float(sum(a.weight_capped for a in step.accepted))
    return m


def dropped_events(r: Round) -> list[EventRow]:
    return [
        EventRow(
            "client_dropped",
            f"client {r.assignments[cid].name!r} sent no update in round {r.number}",
            "warning",
            r.number,
            cid,
        )
        for cid, o in r.outcomes.items()
        if o.status is OutcomeStatus.DROPPED and o.reason == NO_UPDATE
    ]


class RoundCloser:
    def __init__(self, ctx: RunContext, clock: Callable[[], float]) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.clock = clock

    # ---------------------------------------------------------------- success
    def complete(
        self, r: Round, step: StepResult, saved: dict[str, object]
    ) -> Completed:
        ctx, cfg = self.ctx, self.cfg
        accuracy = loss = None
        evaluated: dict[str, float] = {}
        if r.number % cfg.data.eval_every == 0 or r.number == cfg.run.rounds:
            ev = ctx.evaluator(step.weights)
            accuracy, loss, evaluated = ev.accuracy, ev.loss, ev.as_metrics()
        contribution = self._contribution(r, step, saved)
        privacy = ctx.plan.account(step.release)
        extra = ctx.plan.state()
        if r.accumulator.bounds.norm is not None:
            # The next round's norm-bound reference (sorted: the median needs no
            # more, and no norm is tied to a client).
            extra.update(reference_extra(sorted(a.norm or 0.0 for a in step.accepted)))
        path, sha = save_checkpoint(
            cfg.checkpoints.dir,
            Checkpoint(
                run_id=ctx.run_id,
                round=r.number,
                model_version=r.number,
                layout=ctx.layout,
                weights=step.weights,
                optimizer_state=ctx.optimizer.state_dict(),
                aggregator_state=ctx.aggregator.state_dict(),
                extra=extra,
            ),
        )
        last = r.number >= cfg.run.rounds
        close = RoundClose(
            status="completed",
            participations=participations(r, step.verdicts),
            accuracy=accuracy,
            loss=loss,
            checkpoint_path=path,
            checkpoint_sha256=sha,
            metrics={**self._metrics(r, step, privacy, contribution), **evaluated},
            client_metrics=client_metrics(r),
            contributions=self._contribution_rows(contribution),
            events=tuple(self._events(r, step, accuracy, loss, contribution, last)),
            ledger=self._ledger(contribution),
            run_status="completed" if last else None,
        )
        try:
            ctx.recorder.close_round(r.number, close)
        except Exception:
            if ctx.contribution is not None:
                ctx.contribution.discard()
            raise
        if ctx.contribution is not None and contribution is not None:
            ctx.contribution.committed(contribution.pending)
        prune_checkpoints(
            cfg.checkpoints.dir, ctx.run_id, cfg.checkpoints.keep_last,
            protect={path, *self._best_checkpoint()},
        )  # fmt: skip
        ctx.state.weights = step.weights
        ctx.state.extra = extra
        ctx.state.model_version = r.number
        ctx.state.finished = last
        msg = f"round {r.number} completed with {len(step.accepted)} updates"
        if accuracy is not None:
            msg += f"; accuracy {accuracy:.4f}, loss {loss:.4f}"
        log.info(msg)
        return Completed(accuracy, loss, last)

    def _metrics(
        self,
        r: Round,
        step: StepResult,
        privacy: dict[str, float],
        contribution: RoundContribution | None,
    ) -> dict[str, float]:
        outcomes = [r.outcomes[a.client_id] for a in step.accepted]
        sent = sum(o.bytes_up for o in outcomes)
        m = {
            "round_seconds": self.clock() - r.opened_at,
            "num_updates": float(len(step.accepted)),
            "update_norm": float(step.aggregate.norm()),
            "server_lr": self.ctx.optimizer.lr_at(r.number),
            **privacy,
            **bound_metrics(r, step),
        }
        if sent > 0:
            # Dense float32 bytes of the same updates over every byte sent.
            m["compression.ratio"] = 4.0 * self.ctx.layout.numel * len(outcomes) / sent
            m["uplink_bytes"] = float(sent)
        losses = [o.train_loss for o in outcomes if o.train_loss is not None]
        if losses:
            m["train_loss"] = sum(losses) / len(losses)
        if contribution is not None:
            m.update(contribution.pending.metrics)
        # The rule's round-level diagnostics (e.g. the geometric median's
        # converged and iterations), as numbers: aggregator.converged = 0 or 1.
        diagnostics = step.result.diagnostics if step.result is not None else {}
        m.update({f"aggregator.{k}": float(v) for k, v in diagnostics.items()})
        return m

    def _events(
        self,
        r: Round,
        step: StepResult,
        accuracy: float | None,
        loss: float | None,
        contribution: RoundContribution | None,
        last: bool,
    ) -> list[EventRow]:
        msg = f"round {r.number} completed with {len(step.accepted)} updates"
        if accuracy is not None:
            msg += f"; accuracy {accuracy:.4f}, loss {loss:.4f}"
        events = dropped_events(r) + bound_events(r, step)
        if contribution is not None:
            names = {a.client_id: a.name for a in r.assignments.values()}
            events += [
                EventRow(
                    "contribution_flag",
                    f"client {names[c.client_id]!r} flagged in round "
                    f"{r.number}: {', '.join(c.flags)}",
                    "warning",
                    r.number,
                    c.client_id,
                    {"flags": list(c.flags), "scores": c.scores},
                )
                for c in contribution.suspects
            ]
        if (
            step.result is not None
            and step.result.diagnostics.get("converged") is False
        ):
            events.append(
                EventRow(
                    "aggregator_unconverged",
                    f"round {r.number}: the aggregator stopped before converging "
                    f"({dict(step.result.diagnostics)}); its result is the last "
                    "iterate",
                    "warning",
                    r.number,
                    None,
                    dict(step.result.diagnostics),
                )
            )
        events.append(EventRow("round_completed", msg, "info", r.number))
        if last:
            events.append(
                EventRow("run_completed", f"run {self.cfg.run.name!r} completed")
            )
        return events

    # ---------------------------------------------------------------- contribution
    def _contribution(
        self, r: Round, step: StepResult, saved: dict[str, object]
    ) -> RoundContribution | None:
        acc, utility, ctx = self.ctx.contribution, self.ctx.utility, self.ctx
        if acc is None or step.stack is None or utility is None:
            return None
        global_before = ctx.state.weights
        opt_before = saved["optimizer"]

        def subset_global(u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
            # The model a subset would have produced, from the pre-round
            # optimizer state: no side effects on the real optimizer.
            opt = ServerOptimizer(self.cfg.server_optimizer, self.cfg.run.rounds)
            opt.load_state_dict(opt_before)  # type: ignore[arg-type]
            agg = FedAvg()(u, w).aggregate.to(torch.float32)
            return opt.step(global_before, agg, r.number)

        decisions = step.result.decisions if step.result is not None else []
        try:
            return acc.on_round(
                r.number,
                [a.client_id for a in step.accepted],
                step.stack,
                step.row_weights,
                global_before,
                subset_global,
                utility,
                decisions,
                None,
                None,
                aggregate=step.aggregate,
            )
        except ContributionError as exc:
            log.warning("round %d: no contribution accounting: %s", r.number, exc)
            return None

    @staticmethod
    def _contribution_rows(c: RoundContribution | None) -> tuple[ContributionRow, ...]:
        if c is None:
            return ()
        return tuple(
            ContributionRow(x.client_id, x.credit, dict(x.scores), x.suspect, x.flags)
            for x in c.clients
        )

    @staticmethod
    def _ledger(c: RoundContribution | None):  # type: ignore[no-untyped-def]
        if c is None or c.pending.head is None:
            return None
        return (c.pending.entries, c.pending.head)

    def _best_checkpoint(self) -> list[str]:
        """The best-accuracy round's checkpoint, kept whatever ``keep_last``
        says (``fedplat export --best`` reads it)."""
        done = [
            r
            for r in self.ctx.reads.list_rounds(self.ctx.run_id)
            if r.status == "completed" and r.accuracy is not None
        ]
        best = max(done, key=lambda r: (r.accuracy, r.number), default=None)
        return [best.checkpoint_path] if best and best.checkpoint_path else []

    # ---------------------------------------------------------------- failure
    def fail(self, r: Round, reason: str, *, final: bool) -> None:
        """An attempt without quorum (or a failed aggregation)."""
        ctx = self.ctx
        if self.ctx.plan.mode == "local" and any(
            o.status is OutcomeStatus.SUCCEEDED for o in r.outcomes.values()
        ):
            # Under local DP every upload is a noised release whether or not the
            # round completes: the accountant counts it, and the spending is
            # written at once (the round itself may never be).
            released = ctx.plan.account()
            ctx.recorder.metrics(released, round_number=r.number)
            ctx.recorder.flush()
        statuses = {
            r.assignments[c].name: o.status.value for c, o in r.outcomes.items()
        }
        if not final:
            ctx.recorder.event(
                "round_attempt_failed",
                f"round {r.number} attempt {r.attempt} failed: {reason}; retrying "
                "with a fresh selection",
                level="warning",
                round_number=r.number,
                details={"statuses": dict(list(statuses.items())[:50])},
            )
            log.warning("round %d attempt %d failed: %s", r.number, r.attempt, reason)
            return
        msg = (
            f"round {r.number} failed {self.cfg.deadlines.max_round_attempts} "
            f"times: {reason}"
        )
        ctx.recorder.close_round(
            r.number,
            RoundClose(
                status="failed",
                participations=participations(r, {}),
                reason=msg,
                events=(
                    *dropped_events(r),
                    EventRow(
                        "round_failed",
                        f"round {r.number}: {reason}",
                        "warning",
                        r.number,
                    ),
                    EventRow("run_failed", msg, "error", r.number),
                ),
                run_status="failed",
            ),
        )
        log.error("run failed: %s", msg)

    def budget_spent(self, reason: str) -> None:
        """The privacy budget allows no further round: the run ends, completed,
        with ``reason`` stored (its model is as private as accounted so far)."""
        ctx = self.ctx
        ctx.recorder.event("privacy_budget_exhausted", reason, level="warning")
        ctx.recorder.event("run_completed", f"run {self.cfg.run.name!r} completed")
        ctx.state.record = ctx.recorder.finish_run("completed", reason)
        ctx.state.finished = True
        log.warning("run stopped: %s", reason)

    def give_up(self, reason: str) -> None:
        """The run fails without a round to close (e.g. no clients came)."""
        ctx = self.ctx
        ctx.recorder.event("run_failed", reason, level="error")
        ctx.state.record = ctx.recorder.finish_run("failed", reason)
        log.error("run failed: %s", reason)


__all__ = ["Completed", "RoundCloser", "participations"]
