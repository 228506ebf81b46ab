"""The round driver: the coordinator's only loop.

Select clients among the live ones (a fixed number, or Poisson sampling: each
live client independently with probability ``selection.rate``), publish their
tasks, wait for updates until everyone answered or the deadline passed, then
close: with quorum (under central DP: always), aggregate
(:mod:`fedplat.server.aggregation`), evaluate, account contributions, checkpoint
and write the round once (:class:`fedplat.server.recorder.Recorder`); without it,
retry the round with a fresh selection (the round stays open in the store) up to
``deadlines.max_round_attempts``, then fail the run with the reason stored.

A round's norm bound and weight cap (:mod:`fedplat.server.bounds`) are fixed when
it opens, from the last checkpoint's reference norms and the selected clients'
enrolment counts. Round ``r`` trains on model version ``r - 1``; completing it
produces version ``r``.
The same driver runs under the gRPC server (its own thread, :meth:`RoundDriver.run`)
and in the simulator (step by step, on a virtual clock).
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fedplat.server.accumulator import (
    Accumulator,
    MaskedSum,
    RowStack,
    RunningSum,
    SketchSum,
)
from fedplat.server.aggregation import StepResult, aggregate_round, needs_rows
from fedplat.server.board import TaskBoard
from fedplat.server.bounds import RoundBounds, reference_from, round_weight_cap
from fedplat.server.closing import RoundCloser
from fedplat.server.context import RunContext
from fedplat.server.intake import Intake
from fedplat.server.registry import ClientRegistry, ClientState
from fedplat.server.round import Assignment, Round
from fedplat.server.secagg_round import SecAggRound, settle_secagg

from fedplat.compression import derive_seed
from fedplat.privacy import PrivacyError, poisson_sample, secure_seed
from fedplat.protocol.outcomes import IllegalTransition
from fedplat.secagg import SecAggConfig, SecAggError

log = logging.getLogger("fedplat.server")


@dataclass(frozen=True)
class RoundOutcome:
    """What :meth:`RoundDriver.close_round` did."""

    number: int
    completed: bool
    num_selected: int
    num_succeeded: int
    accuracy: float | None = None
    loss: float | None = None
    reason: str | None = None


class RoundDriver:
    """Drives the rounds of one run (see the module docstring)."""

    def __init__(
        self,
        parts: RunContext,
        registry: ClientRegistry,
        board: TaskBoard,
        intake: Intake,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.p = parts
        self.cfg = parts.cfg
        self.registry = registry
        self.board = board
        self.intake = intake
        self.clock = clock
        self.closer = RoundCloser(parts, clock)
        self.attempt = 1
        self.phase = "starting"
        # Poisson coins: secret under central DP (whoever knows the key knows who
        # was sampled), else reproducible from the run's seed.
        self._sampling_key = (
            secure_seed()
            if parts.plan.central is not None
            else derive_seed(self.cfg.run.seed % (1 << 64), 0, "poisson")
        )

    @property
    def finished(self) -> bool:
        return self.board.finished

    # ---------------------------------------------------------------- waiting
    def wait_for_clients(self, stop: threading.Event, timeout: float | None) -> bool:
        """Block until ``min_available`` clients are live; False on stop/timeout."""
        need = self.cfg.selection.min_available
        end = None if timeout is None else time.monotonic() + timeout
        logged = False
        self.phase = "waiting_for_clients"
        while not stop.is_set():
            self.revocations()
            live = len(self.registry.live())
            if live >= need:
                return True
            if not logged:
                log.info("waiting for clients: %d/%d live", live, need)
                logged = True
            if end is not None and time.monotonic() >= end:
                return False
            self.board.signal.wait(0.5)
        return False

    def revocations(self) -> None:
        for cid in self.registry.refresh_revocations():
            self.p.recorder.event(
                "client_revoked",
                "client revoked by the operator",
                level="warning",
                client_id=cid,
            )

    # ---------------------------------------------------------------- open
    def open_round(self) -> int | None:
        """Select clients and publish their tasks; returns the round number, or
        None when the run ended instead (the privacy budget allows no more
        rounds, or central DP cannot start)."""
        if self.finished:
            raise RuntimeError("run is finished")
        number = self.p.state.model_version + 1
        if not self._budget_allows(number):
            return None
        live = self.registry.live()
        if not live:
            raise RuntimeError("no live clients to select")
        try:
            chosen = self._select(live, number)
        except PrivacyError as exc:
            self.closer.give_up(f"privacy: {exc}")
            self.board.finish()
            return None
        if not chosen and self.cfg.selection.sampling == "fixed":
            raise RuntimeError("no live clients to select")
        secagg_config = self._secagg_config(chosen, number)
        if secagg_config is None and self.p.plan.secure:
            chosen = []  # too few for secure aggregation: the round releases noise
        assignments = self._assignments(chosen, number)
        acc = self._accumulator(len(chosen), self._bounds(chosen))
        now = self.clock()
        deadline = now + self.cfg.deadlines.round_seconds
        state = Round(
            number,
            self.attempt,
            now,
            deadline,
            self.p.state.model_version,
            assignments,
            acc,
            len(live),
        )
        if secagg_config is not None:
            s = self.cfg.privacy.secure_aggregation
            assert s is not None
            state.secagg = SecAggRound(
                secagg_config,
                {c.client_id: c.seq for c in chosen},
                train_deadline=deadline,
                phase_seconds=s.phase_seconds,
            )
        self._mark_running()
        self.p.recorder.open_round(
            number,
            num_selected=len(chosen),
            deadline_at=datetime.fromtimestamp(deadline, UTC),
            model_version=self.p.state.model_version,
        )
        self.p.model.prepare(self.p.state)
        self.board.publish(state)
        self.phase = "training"
        self.p.recorder.event(
            "round_opened",
            f"round {number} (attempt {self.attempt}): {len(chosen)} of {len(live)} "
            "live clients selected",
            round_number=number,
        )
        log.info("round %d opened: %d clients selected", number, len(chosen))
        return number

    def _assignments(
        self, chosen: list[ClientState], number: int
    ) -> dict[str, Assignment]:
        """Each selected client's task: fresh task id and nonce, its row, and
        its training seed (derived from the run's seed, the round and its name)."""
        return {
            c.client_id: Assignment(
                c.client_id,
                c.name,
                secrets.token_hex(8),
                secrets.token_bytes(16),
                row,
                derive_seed(self.cfg.run.seed % (1 << 64), number, "train", c.name)
                % (1 << 63),
            )
            for row, c in enumerate(chosen)
        }

    def _bounds(self, chosen: list[ClientState]) -> RoundBounds:
        """The round's norm bound and weight cap (:mod:`fedplat.server.bounds`):
        no norm bound under central DP (its clip is the bound) or secure
        aggregation (no row is seen); the cap from the selected clients'
        enrolment counts, each capped by its token and the run."""
        spec = self.cfg.aggregator
        plan = self.p.plan
        norm = None if plan.central is not None or plan.secure else spec.norm_bounding
        declared = [self.registry.weight(c, c.declared_examples) for c in chosen]
        return RoundBounds(
            norm,
            reference_from(self.p.state.extra),
            round_weight_cap(declared, spec.weight_bounding),
        )

    def _accumulator(self, n: int, bounds: RoundBounds) -> Accumulator:
        """Where the round's uploads go: masked sums under secure aggregation,
        rows for rules that need them, else a running (sketch) sum."""
        d = self.p.layout.numel
        plan = self.p.plan
        weighted = self.cfg.aggregator.is_weighted
        if plan.secure:
            sk = plan.sketcher is not None
            return MaskedSum(plan.sketch_size() if sk else d, sketch_space=sk)
        if needs_rows(
            self.p.aggregator,
            bool(self.cfg.aggregator.pre),
            self.p.contribution is not None,
        ):
            return RowStack(n, d, bounds)
        size = plan.sketch_size() if plan.sketcher is not None else d
        kind = SketchSum if plan.sketcher is not None else RunningSum
        return kind(size, weighted=weighted, bounds=bounds, selected=n)

    def _select(self, live: list[ClientState], number: int) -> list[ClientState]:
        """This attempt's clients, in enrolment order."""
        sel = self.cfg.selection
        if sel.sampling == "poisson":
            assert sel.rate is not None
            central = self.p.plan.central
            if central is not None:
                central.fix_population(self.registry.population())
            by_seq = {c.seq: c for c in live}
            seed = derive_seed(self._sampling_key, self.attempt, "poisson")
            picked = poisson_sample(by_seq, sel.rate, seed=seed, round=number)
            return [by_seq[s] for s in picked]
        k = self.cfg.clients_this_round(len(live))
        rng = random.Random(f"{self.cfg.run.seed}:{number}:{self.attempt}")
        return sorted(rng.sample(live, k), key=lambda c: c.seq) if k else []

    def _secagg_config(
        self, chosen: list[ClientState], number: int
    ) -> SecAggConfig | None:
        """The round's secure-aggregation parameters (None: not used, or too few
        clients for the protocol, which needs three)."""
        if not self.p.plan.secure or not chosen:
            return None
        try:
            return self.p.plan.secagg_config(len(chosen))
        except SecAggError as exc:
            self.p.recorder.event(
                "secagg_skipped",
                f"round {number}: {len(chosen)} clients sampled, too few for secure "
                f"aggregation ({exc}); the round releases noise only",
                level="warning",
                round_number=number,
            )
            return None

    def _budget_allows(self, number: int) -> bool:
        """False (and the run completed, reason stored) when round ``number``'s
        release would pass the privacy budget."""
        plan = self.p.plan
        ceiling = plan.ceiling
        nxt = plan.preview() if ceiling is not None else None
        if nxt is None or ceiling is None or nxt.epsilon <= ceiling:
            return True
        self.closer.budget_spent(
            f"privacy budget reached: round {number} would bring epsilon to "
            f"{nxt.epsilon:.4g}, above the maximum {ceiling:g} (delta "
            f"{nxt.delta:g}); the run stops after round {number - 1}"
        )
        self.board.finished = True
        self.board.finish()
        return False

    def _mark_running(self) -> None:
        rec = self.p.state.record
        if rec.status in ("pending", "completed") or rec.started_at is None:
            self.p.state.record = self.p.recorder.mark_running(
                rec.started_at or datetime.now(UTC)
            )
        elif rec.status != "running":
            self.p.state.record = self.p.recorder.mark_running()

    # ---------------------------------------------------------------- wait
    def round_done(self, r: Round) -> bool:
        now = self.clock()
        if r.secagg is not None:
            # Its phases have their own deadlines (SecAggRound).
            with self.board.lock:
                changed = r.secagg.tick(now)
            if changed:
                self.board.signal.notify()
            return bool(r.secagg.finished)
        answered, ok = r.num_answered(), r.num_succeeded()
        if now >= r.deadline or answered >= len(r.assignments):
            return True
        extra = self.cfg.deadlines.close_after_quorum_seconds
        return (
            extra is not None
            and ok >= self.cfg.selection.quorum
            and now - r.opened_at >= extra
        )

    def wait_round(self, stop: threading.Event | None = None) -> None:
        """Block until every selected client answered, or the deadline passed."""
        r = self.board.round
        if r is None:
            return
        while True:
            woken = self.board.signal.wakeup()
            if self.round_done(r) or (stop is not None and stop.is_set()):
                return
            left = r.deadline - self.clock()
            # Secure-aggregation phases run past the training deadline.
            woken.wait(0.5 if r.secagg else max(0.01, min(0.5, left)))

    # ---------------------------------------------------------------- close
    def close_round(self) -> RoundOutcome:
        """Take the round off the board, aggregate if quorum, record it once."""
        r = self.board.close()  # sealed: no writer touches the rows from here on
        self.phase = "aggregating"
        try:
            outcome = self._close(r)
        finally:
            r.accumulator.free()
        if self.finished:
            self.board.finish()
        return outcome

    def _close(self, r: Round) -> RoundOutcome:
        try:
            if r.secagg is not None:
                settle_secagg(r, self.p.plan, self.p.recorder)
            r.close()  # every outcome final from here on
        except IllegalTransition as exc:
            # A bug in the outcome bookkeeping: it costs this attempt, never
            # the run (a caller's timing must not be able to stop it).
            log.exception("round %d: closing its outcomes failed", r.number)
            return self._fail(r, f"internal error closing the round: {exc}")
        ok = r.succeeded()
        quorum = self.cfg.selection.quorum
        # Under central DP every round releases, whatever arrived (docs/privacy.md).
        if self.p.plan.central is None and len(ok) < quorum:
            return self._fail(
                r, f"quorum not reached: {len(ok)} updates, {quorum} needed"
            )
        clipped = {cid for cid, o in r.outcomes.items() if o.clipped}
        saved = self.p.save_mutable_state()
        try:
            step = aggregate_round(
                r.accumulator,
                aggregator=self.p.aggregator,
                weighted=self.cfg.aggregator.is_weighted,
                plan=self.p.plan,
                optimizer=self.p.optimizer,
                global_weights=self.p.state.weights,
                round_number=r.number,
                clipped=clipped,
            )
        except Exception as exc:  # AggregationError and rule bugs alike
            self.p.restore_mutable_state(saved)
            log.warning("round %d: aggregation failed: %s", r.number, exc)
            return self._fail(r, f"aggregation failed: {exc}")
        return self._complete(r, step, saved)

    def _complete(
        self, r: Round, step: StepResult, saved: dict[str, object]
    ) -> RoundOutcome:
        try:
            done = self.closer.complete(r, step, saved)
        except Exception:
            # Nothing of the round reached the store: restore and stop the run.
            self.p.restore_mutable_state(saved)
            raise
        self.attempt = 1
        if done.run_finished:
            self.board.finished = True
        self.phase = "training"
        return RoundOutcome(
            r.number,
            True,
            len(r.assignments),
            len(step.accepted),
            done.accuracy,
            done.loss,
        )

    def _fail(self, r: Round, reason: str) -> RoundOutcome:
        final = self.attempt >= self.cfg.deadlines.max_round_attempts
        self.closer.fail(r, reason, final=final)
        if final:
            self.board.finished = True
        else:
            self.attempt += 1
        return RoundOutcome(
            r.number, False, len(r.assignments), r.num_succeeded(), reason=reason
        )

    # ---------------------------------------------------------------- loop
    def gather_clients(self, stop: threading.Event) -> bool:
        """Wait for ``min_available`` live clients; False when stopped, or (the
        run failed) when ``wait_for_clients_seconds`` passed without them."""
        wait = self.cfg.deadlines.wait_for_clients_seconds
        if self.wait_for_clients(stop, wait):
            return True
        if not stop.is_set():
            self.closer.give_up(
                f"fewer than {self.cfg.selection.min_available} clients live "
                f"for {wait:.0f} s"
            )
            self.board.finish()
        return False

    def run(self, stop: threading.Event) -> None:
        """Drive rounds until the run finishes or ``stop`` is set."""
        while not stop.is_set() and not self.finished:
            if not self.gather_clients(stop):
                break
            if self.open_round() is None:
                break
            self.wait_round(stop)
            if stop.is_set():
                # Shutting down mid-round: it stays open in the store; a restart
                # re-runs it from the last checkpoint.
                self.board.close()
                break
            self.close_round()
        self.phase = "stopped"
        self.board.signal.notify()


__all__ = ["RoundDriver", "RoundOutcome"]
