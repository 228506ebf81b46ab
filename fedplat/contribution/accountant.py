"""The contribution accountant: the coordinator's hook after each aggregation.

The coordinator calls :meth:`ContributionAccountant.on_round` once per completed
round with the round's update stack and the means to value coalitions. The
accountant values the round (:mod:`fedplat.contribution.valuation`), labels it
(:mod:`fedplat.contribution.labelling`), previews the run's totals and reward
shares after it (:mod:`fedplat.contribution.standings`) and returns one
hash-chained, signed ledger entry per client with the round's metrics
(:mod:`fedplat.contribution.record`) in a :class:`PendingRecord`.

It writes nothing. The coordinator stores the pending record with the round, in
one transaction, then calls :meth:`~ContributionAccountant.committed`: only then
do the totals, the chain's tail and the replay memory advance. If the write
failed it calls :meth:`~ContributionAccountant.discard`, and the accountant
re-reads the stored ledger before the next round.

This module never imports the store (algorithm packages stay free of SQLAlchemy):
it reads any object with the methods of :class:`ContributionStore`, which
:class:`fedplat.store.Store` has.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedplat.aggregators.base import ClientDecision
from fedplat.contribution.config import ContributionSection
from fedplat.contribution.labelling import FlagMemory, Observation, RoundFlags
from fedplat.contribution.ledger import StoredEntry, StoredHead
from fedplat.contribution.record import (
    LedgerTail,
    RoundCostFacts,
    entry_contents,
    pending_record,
    round_metrics,
)
from fedplat.contribution.results import (
    ClientContribution,
    ClientStanding,
    ContributionCost,
    ContributionError,
    PendingRecord,
    RoundContribution,
)
from fedplat.contribution.standings import RoundRecord, Totals, round_record
from fedplat.contribution.utility import (
    AggregateFn,
    UtilityFn,
)
from fedplat.contribution.valuation import (
    Coalitions,
    Scoring,
    check_inputs,
    coalition_utility,
    round_game,
    run_scorers,
)
from fedplat.security.keys import key_id


class ContributionStore(Protocol):
    """What the accountant reads from the store (:class:`fedplat.store.Store`):
    the run's ledger, to continue it. It writes nothing itself: each round's
    entries, head and metrics come back in :class:`PendingRecord`, and the
    coordinator writes them in the round's closing transaction."""

    def list_ledger_entries(self, run_id: str) -> Sequence[StoredEntry]: ...

    def get_ledger_head(self, run_id: str) -> StoredHead | None: ...


@dataclass(frozen=True)
class _Staged:
    """A round accounted but not yet stored: what :meth:`committed` applies."""

    pending: PendingRecord | None
    totals: Totals
    observation: Observation | None
    # (round, global [d] aggregated from every update, U(N)) when valued
    full: tuple[int, torch.Tensor, float] | None


class ContributionAccountant:
    """Scores, flags, rewards and the ledger of one run (see module docstring).

    Parameters
    ----------
    cfg
        The run's ``contribution`` section.
    store
        Where the run's ledger is read from (a :class:`fedplat.store.Store`).
    run_id
        The run; its existing ledger (a resumed run) is loaded and continued.
    signing_key
        The coordinator's Ed25519 key
        (:func:`fedplat.security.keys.load_or_create_signing_key`), or
        ``None`` for an unsigned, hash-chained-only ledger.

    Raises
    ------
    ContributionError
        If the run's existing ledger was signed with another key.
    """

    def __init__(
        self,
        cfg: ContributionSection,
        store: ContributionStore,
        run_id: str,
        signing_key: Ed25519PrivateKey | None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.run_id = run_id
        self.signing_key = signing_key
        self._gtg = cfg.gtg.settings()
        self._flags = FlagMemory(
            cfg.flags.thresholds(), cfg.flags.sketch_width, cfg.seed
        )
        self._totals = Totals({}, cfg.flags.strikes)
        self._tail = LedgerTail()
        self._staged: _Staged | None = None
        self._prev_full: tuple[int, torch.Tensor, float] | None = None
        self._resync = False
        #: Totals over the accountant's lifetime (the bench reports them).
        self.total_evaluations = 0
        self.total_seconds = 0.0
        self._load()

    # ------------------------------------------------------------ state
    def _load(self) -> None:
        """Continue the stored ledger: its tail, and the totals it implies."""
        head = self.store.get_ledger_head(self.run_id)
        if head is not None and head.key_id is not None:
            mine = (
                None
                if self.signing_key is None
                else key_id(self.signing_key.public_key())
            )
            if mine != head.key_id:
                raise ContributionError(
                    f"the ledger of run {self.run_id!r} is signed with key "
                    f"{head.key_id[:16]}; the configured key is "
                    f"{mine[:16] if mine else 'none'}. Use the original key."
                )
        entries = list(self.store.list_ledger_entries(self.run_id))
        self._totals = Totals.from_ledger(entries, self.cfg.flags.strikes)
        self._tail = (
            LedgerTail(entries[-1].seq, entries[-1].entry_hash)
            if entries
            else LedgerTail()
        )
        self._resync = False

    def shares(self) -> dict[str, float]:
        """Client id -> current share of the budget (committed rounds)."""
        return self._totals.shares()

    def standings(self) -> list[ClientStanding]:
        """Every client's totals over the committed rounds, ordered by id."""
        return self._totals.standings(self.cfg.budget)

    # ------------------------------------------------------------ the hook
    def on_round(
        self,
        round_number: int,
        client_ids: list[str],
        updates: torch.Tensor,
        weights: torch.Tensor | None,
        global_before: torch.Tensor,
        aggregate_fn: AggregateFn,
        utility: UtilityFn,
        decisions: list[ClientDecision],
        utility_before: float | None,
        utility_after: float | None,
        *,
        aggregate: torch.Tensor | None = None,
    ) -> RoundContribution:
        """Account one completed round; nothing is stored or committed here.

        Parameters
        ----------
        round_number
            The round, ``>= 1``.
        client_ids, updates, weights
            ``n`` distinct client ids in the row order of the ``[n, d]`` decoded
            updates (``new - global`` per client) and their ``[n]`` aggregation
            weights (example counts) or ``None``.
        global_before
            ``[d]`` global weights the round trained from.
        aggregate_fn
            ``(updates [k, d], weights [k] | None) -> new global [d]`` for a
            subset; must leave server state (optimizer, aggregator) untouched.
        utility
            ``global [d] -> float``, e.g. held-out accuracy.
        decisions
            The aggregator's per-row decisions (may be empty).
        utility_before, utility_after
            ``U(∅) = utility(global_before)`` and ``U(N) = utility(aggregate_fn(
            updates, weights))`` if the caller has them from the same utility;
            else ``None``: ``U(∅)`` is reused from the previous round's ``U(N)``
            when possible, and what is missing is evaluated.
        aggregate
            ``[d]`` the robust aggregate of the round, the reference of the
            ``cosine`` scorer; the coordinate-wise median of ``updates`` if None.

        Returns
        -------
        RoundContribution
            Its ``pending`` record is to be stored with the round, then passed
            to :meth:`committed` (or :meth:`discard` if the write failed).
        """
        t0 = time.perf_counter()
        check_inputs(round_number, client_ids, updates, weights, global_before)
        if self._resync:  # a failed write last time: the store is the truth
            self._load()
        self._staged = None  # a round never committed is abandoned
        attempt = self._totals.next_attempt(round_number)
        coalitions = coalition_utility(
            self.cfg, round_number, updates, weights, global_before, aggregate_fn,
            utility, self._empty_value(round_number, global_before, utility_before),
            utility_after,
        )  # fmt: skip
        game = round_game(
            self.cfg, self._gtg, round_number, attempt, updates, aggregate, coalitions
        )
        scoring = run_scorers(self.cfg, game, round_number)
        primary = scoring.scores.get(self.cfg.primary)
        flags = self._flags.label(
            round_number, client_ids, updates, global_before, primary,
            scoring.truncated, decisions,
        )  # fmt: skip
        rec = round_record(
            attempt, client_ids, primary, flags.free_rider, flags.suspect
        )
        totals = self._totals.replace(round_number, rec)
        clients = self._clients(client_ids, scoring.scores, rec, flags, totals)
        return self._stage(
            round_number, attempt, clients, decisions, coalitions, scoring,
            _Staged(None, totals, flags.observation, coalitions.reusable(round_number)),
            t0,
        )  # fmt: skip

    def _stage(
        self,
        round_number: int,
        attempt: int,
        clients: tuple[ClientContribution, ...],
        decisions: Sequence[ClientDecision],
        coalitions: Coalitions,
        scoring: Scoring,
        staged: _Staged,
        t0: float,
    ) -> RoundContribution:
        """The round's ledger record, kept until :meth:`committed`."""
        value = coalitions.value
        facts = RoundCostFacts(
            evaluations=coalitions.evaluations,
            seconds=time.perf_counter() - t0,
            permutations=scoring.permutations,
            truncated=scoring.truncated,
            utility_before=None if value is None else value.empty_value,
            utility_after=coalitions.full_value,
        )
        pending = pending_record(
            self.run_id,
            self._tail,
            entry_contents(round_number, attempt, clients, decisions),
            round_metrics(facts, clients),
            self.signing_key,
        )
        self._staged = replace(staged, pending=pending)
        seconds = time.perf_counter() - t0
        self.total_evaluations += facts.evaluations
        self.total_seconds += seconds
        return RoundContribution(
            round_number=round_number,
            attempt=attempt,
            clients=clients,
            utility_before=facts.utility_before,
            utility_after=facts.utility_after,
            valued=value is not None,
            truncated=scoring.truncated,
            cost=ContributionCost(
                facts.evaluations, seconds, coalitions.seconds, scoring.permutations
            ),
            pending=pending,
            errors=coalitions.errors + scoring.errors,
        )

    def committed(self, pending: PendingRecord) -> None:
        """The round of ``pending`` is stored: its totals count, the chain
        continues after its entries, and its updates are remembered for the
        replay check.

        Raises
        ------
        ContributionError
            If ``pending`` is not the record of the last :meth:`on_round`.
        """
        staged = self._staged
        if staged is None or staged.pending is not pending:
            raise ContributionError(
                "committed() must name the pending record of the last on_round()"
            )
        self._staged = None
        self._totals = staged.totals
        if pending.head is not None:
            self._tail = LedgerTail(pending.head.seq, pending.head.head_hash)
        if staged.observation is not None:
            self._flags.remember(staged.observation)
        self._prev_full = staged.full

    def discard(self) -> None:
        """The round was not stored (or may not have been): forget it and
        re-read the ledger before the next round."""
        self._staged = None
        self._resync = True

    # ------------------------------------------------------------ helpers
    def _empty_value(
        self, round_number: int, global_before: torch.Tensor, given: float | None
    ) -> float | None:
        """``U(∅)``: the caller's, else ``U(N)`` of the previous round when the
        coordinator's new global was exactly ``aggregate_fn`` of all updates."""
        if given is not None or self._prev_full is None:
            return given
        rnd, weights, value = self._prev_full
        if rnd == round_number - 1 and torch.equal(weights, global_before):
            return value
        return None

    def _clients(
        self,
        client_ids: Sequence[str],
        scores: dict[str, torch.Tensor],
        rec: RoundRecord,
        flags: RoundFlags,
        totals: Totals,
    ) -> tuple[ClientContribution, ...]:
        shares = totals.shares()
        budget = self.cfg.budget
        return tuple(
            ClientContribution(
                client_id=cid,
                scores={k: float(v[i]) for k, v in scores.items()},
                credit=rec.primary[cid],
                flags=flags.labels[i],
                suspect=flags.suspect[i],
                cumulative=totals.cumulative[cid],
                reward_share=shares[cid],
                reward=budget * shares[cid],
            )
            for i, cid in enumerate(client_ids)
        )


__all__ = ["ContributionAccountant", "ContributionStore"]
