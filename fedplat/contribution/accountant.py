"""The contribution accountant: the coordinator's hook after each aggregation.

The round engine calls :meth:`ContributionAccountant.on_round` once per completed
round with the round's update stack and the means to value coalitions. The
accountant runs the configured scorers (:mod:`fedplat.contribution.scorers`),
derives flags (:mod:`fedplat.contribution.flags`), updates cumulative scores and
reward shares (:mod:`fedplat.contribution.rewards`), appends one hash-chained,
signed ledger entry per client (:mod:`fedplat.contribution.ledger`), and writes
metrics, events and participation flags for the monitor. The maths stays in those
pure modules; this class holds the cross-round state.

This module never imports the store (algorithm packages stay free of SQLAlchemy):
it talks to any object with the methods of :class:`ContributionStore`, which
:class:`fedplat.store.Store` has.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedplat.aggregators.base import ClientDecision
from fedplat.contribution.config import ContributionSection
from fedplat.contribution.flags import (
    FREE_RIDER_FLAGS,
    LOW_SCORE_OUTLIER,
    NEGATIVE_SCORE,
    RANDOM_UPDATE,
    REPLAYED_UPDATE,
    SUSPECT_FLAGS,
    ZERO_UPDATE,
    CountSketch,
    aggregator_flags,
    low_score_outliers,
    random_updates,
    replayed_updates,
    zero_updates,
)
from fedplat.contribution.ledger import (
    GENESIS_HASH,
    LedgerEntry,
    LedgerHead,
    StoredEntry,
    StoredHead,
    chain_entries,
    sign_head,
)
from fedplat.contribution.rewards import reward_shares
from fedplat.contribution.scorers import RoundGame, get_scorer
from fedplat.contribution.similarity import (
    coordinate_median,
    max_abs_cosine_to_others,
)
from fedplat.contribution.utility import (
    AggregateFn,
    SubsetUtility,
    UtilityError,
    UtilityFn,
)
from fedplat.metrics import LOWER_IS_BETTER
from fedplat.security.keys import key_id

log = logging.getLogger("fedplat.contribution")


class ContributionError(ValueError):
    """Inputs to the accountant are inconsistent (shapes, ids, keys)."""


class ContributionStore(Protocol):
    """What the accountant reads from the store (:class:`fedplat.store.Store`):
    the run's ledger, to continue it. It writes nothing itself: each round's
    entries, head and metrics come back in :class:`PendingRecord`, and the
    coordinator writes them in the round's closing transaction."""

    def list_ledger_entries(self, run_id: str) -> Sequence[StoredEntry]: ...

    def get_ledger_head(self, run_id: str) -> StoredHead | None: ...


# ----------------------------------------------------------------- results
@dataclass(frozen=True)
class ContributionCost:
    """What valuing a round cost.

    Attributes
    ----------
    utility_evaluations
        Calls of the utility function (held-out evaluations).
    seconds
        Wall time of :meth:`ContributionAccountant.on_round` (store writes too).
    utility_seconds
        Of which spent aggregating subsets and evaluating them.
    permutations
        GTG-Shapley permutations sampled (0 if it did not run or truncated).
    """

    utility_evaluations: int = 0
    seconds: float = 0.0
    utility_seconds: float = 0.0
    permutations: int = 0


@dataclass(frozen=True)
class ClientContribution:
    """One client's accounting for one round.

    Attributes
    ----------
    client_id
        The client.
    scores
        Scorer name -> this round's score (only scorers that ran).
    credit
        What this round adds to ``cumulative``: the primary score (0 if it did
        not run), capped at 0 in a round flagged as free-riding.
    flags
        Labels (:mod:`fedplat.contribution.flags`).
    suspect
        Some flag brands the client for this round.
    cumulative
        Cumulative primary score after this round.
    reward_share
        Share of the budget after this round (0 if disqualified).
    reward
        ``budget * reward_share``.
    """

    client_id: str
    scores: dict[str, float]
    credit: float
    flags: tuple[str, ...]
    suspect: bool
    cumulative: float
    reward_share: float
    reward: float


@dataclass(frozen=True)
class PendingRecord:
    """A round's ledger entries, new head and metrics, not yet stored.

    The coordinator writes them with the round (one transaction) and then calls
    :meth:`ContributionAccountant.committed`, or :meth:`~ContributionAccountant.
    discard` if the write failed (the accountant then re-reads the ledger).
    """

    entries: tuple[LedgerEntry, ...]
    head: LedgerHead | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class RoundContribution:
    """What :meth:`ContributionAccountant.on_round` computed and recorded.

    Attributes
    ----------
    round_number, attempt
        The round; ``attempt`` > 1 when the round was accounted before (a retry
        after a coordinator restart): the latest attempt replaces earlier ones.
    clients
        One :class:`ClientContribution` per update, in input order.
    utility_before, utility_after
        ``U(∅)`` and ``U(N)`` if utilities were evaluated this round.
    valued
        Utility-based scorers ran this round.
    truncated
        GTG-Shapley's between-round truncation zeroed the round.
    cost
        Utility evaluations, seconds, permutations.
    pending
        The ledger entries, head and metrics to store with the round.
    errors
        Scorer or store failures that were contained (the round went on).
    """

    round_number: int
    attempt: int
    clients: tuple[ClientContribution, ...]
    utility_before: float | None
    utility_after: float | None
    valued: bool
    truncated: bool
    cost: ContributionCost
    pending: PendingRecord
    errors: tuple[str, ...] = ()

    @property
    def suspects(self) -> tuple[ClientContribution, ...]:
        return tuple(c for c in self.clients if c.suspect)

    def by_client(self) -> dict[str, ClientContribution]:
        return {c.client_id: c for c in self.clients}


@dataclass(frozen=True)
class ClientStanding:
    """A client's totals over the run so far (see ``standings``)."""

    client_id: str
    cumulative: float
    reward_share: float
    reward: float
    rounds: int
    suspect_rounds: int
    free_rider_rounds: int
    disqualified: bool


@dataclass
class _RoundRecord:
    """The accounted facts of one round that feed cumulative totals."""

    attempt: int
    primary: dict[str, float] = field(default_factory=dict)
    suspect: set[str] = field(default_factory=set)
    free_rider: set[str] = field(default_factory=set)


# ---------------------------------------------------------------- accountant
class ContributionAccountant:
    """Scores, flags, rewards and the ledger of one run (see module docstring).

    Parameters
    ----------
    cfg
        The run's ``contribution`` section.
    store
        Where the ledger, metrics, events and flags go (a :class:`fedplat.store.Store`).
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
        self._thresholds = cfg.flags.thresholds()
        self._gtg = cfg.gtg.settings()
        self._rounds: dict[int, _RoundRecord] = {}
        self._cumulative: dict[str, float] = {}
        self._participated: dict[str, int] = {}
        self._suspect: dict[str, int] = {}
        self._free_rider: dict[str, int] = {}
        self._seq = 0
        self._head = GENESIS_HASH
        self._sketch: CountSketch | None = None
        # client -> (round, sketch of its update in that round)
        self._prev_update_sketch: dict[str, tuple[int, torch.Tensor]] = {}
        self._prev_global_sketch: torch.Tensor | None = None
        self._prev_global_round: int | None = None
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
        self._rounds.clear()
        self._seq, self._head = 0, GENESIS_HASH
        for e in self.store.list_ledger_entries(self.run_id):
            self._seq, self._head = e.seq, e.entry_hash
            payload = _payload(e)
            attempt = int(payload.get("attempt", 1))
            rec = self._rounds.get(e.round_number)
            if rec is None or attempt > rec.attempt:
                rec = self._rounds[e.round_number] = _RoundRecord(attempt)
            elif attempt < rec.attempt:
                continue
            credit = payload.get("credit")
            rec.primary[e.client_id] = float(credit) if credit is not None else 0.0
            flags = set(payload.get("flags", []))
            if flags & SUSPECT_FLAGS:
                rec.suspect.add(e.client_id)
            if flags & FREE_RIDER_FLAGS:
                rec.free_rider.add(e.client_id)
        self._recount()

    def _recount(self) -> None:
        self._cumulative.clear()
        self._participated.clear()
        self._suspect.clear()
        self._free_rider.clear()
        for rec in self._rounds.values():
            for cid, score in rec.primary.items():
                self._cumulative[cid] = self._cumulative.get(cid, 0.0) + score
                self._participated[cid] = self._participated.get(cid, 0) + 1
            for cid in rec.suspect:
                self._suspect[cid] = self._suspect.get(cid, 0) + 1
            for cid in rec.free_rider:
                self._free_rider[cid] = self._free_rider.get(cid, 0) + 1

    def _disqualified(self) -> set[str]:
        strikes = self.cfg.flags.strikes
        return {cid for cid, k in self._free_rider.items() if k >= strikes}

    def shares(self) -> dict[str, float]:
        """Client id -> current share of the budget."""
        return reward_shares(self._cumulative, self._disqualified())

    def standings(self) -> list[ClientStanding]:
        """Every client's totals so far, ordered by client id."""
        shares = self.shares()
        out = []
        disqualified = self._disqualified()
        for cid in sorted(self._cumulative):
            out.append(
                ClientStanding(
                    client_id=cid,
                    cumulative=self._cumulative[cid],
                    reward_share=shares[cid],
                    reward=self.cfg.budget * shares[cid],
                    rounds=self._participated.get(cid, 0),
                    suspect_rounds=self._suspect.get(cid, 0),
                    free_rider_rounds=self._free_rider.get(cid, 0),
                    disqualified=cid in disqualified,
                )
            )
        return out

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
        """Account one completed round.

        Parameters
        ----------
        round_number
            The round, ``>= 1``.
        client_ids
            ``n`` distinct client ids, row order of ``updates``.
        updates
            ``[n, d]`` decoded updates (``new - global`` per client).
        weights
            ``[n]`` aggregation weights (example counts) or ``None``.
        global_before
            ``[d]`` global weights the round trained from.
        aggregate_fn
            ``(updates [k, d], weights [k] | None) -> new global [d]`` for a
            subset; must leave server state (optimizer, aggregator) untouched.
        utility
            ``global [d] -> float``, e.g. held-out accuracy.
        decisions
            The aggregator's per-row decisions (may be empty).
        utility_before
            ``U(∅) = utility(global_before)`` if the caller has it from the same
            utility function; otherwise ``None`` (reused from the previous round
            when possible, else evaluated).
        utility_after
            ``U(N) = utility(aggregate_fn(updates, weights))`` if known, else
            ``None`` (evaluated).
        aggregate
            ``[d]`` the robust aggregate of the round, the reference of the
            ``cosine`` scorer; the coordinate-wise median of ``updates`` when
            ``None``.

        Returns
        -------
        RoundContribution
        """
        t0 = time.perf_counter()
        n, d = self._check(round_number, client_ids, updates, weights, global_before)
        if self._resync:  # a failed write last time: the store is the truth
            self._load()
            self._resync = False
        errors: list[str] = []
        prev = self._rounds.get(round_number)
        attempt = 1 if prev is None else prev.attempt + 1

        # ---- coalition utilities (shared by every utility-based scorer)
        valued_round = (round_number - 1) % self.cfg.every == 0
        value: SubsetUtility | None = None
        full_value: float | None = None
        extra_evals, extra_seconds = 0, 0.0
        if self.cfg.uses_utility and valued_round and n > 0:
            try:
                empty = utility_before
                if empty is None:
                    empty = self._reuse_before(round_number, global_before)
                if empty is None:
                    t1 = time.perf_counter()
                    empty = float(utility(global_before))
                    extra_evals, extra_seconds = 1, time.perf_counter() - t1
                value = SubsetUtility(updates, weights, aggregate_fn, utility, empty)
                everyone = range(n)
                if utility_after is not None:
                    value.remember(everyone, utility_after)
                full_value = value(everyone)
            except Exception as exc:  # the caller's evaluator: never crash
                errors.append(f"utility: {exc}")
                log.warning(
                    "round %d: no contribution valuation: %s", round_number, exc
                )
                value, full_value = None, None

        reference = (
            aggregate.to(updates.dtype)
            if aggregate is not None and aggregate.shape == (d,)
            else coordinate_median(updates)
        )
        game = RoundGame(
            updates=updates,
            reference=reference,
            value=value,
            full_value=full_value,
            gtg=self._gtg,
            rng=np.random.default_rng([self.cfg.seed, round_number, attempt]),
        )

        # ---- scorers
        scores: dict[str, torch.Tensor] = {}
        permutations, truncated = 0, False
        for name in self.cfg.scorers:
            spec = get_scorer(name)
            if spec.uses_utility and value is None:
                continue
            if name == "exact_shapley" and n > self.cfg.exact_max_clients:
                errors.append(
                    f"exact_shapley skipped: {n} clients > exact_max_clients "
                    f"{self.cfg.exact_max_clients}"
                )
                continue
            try:
                out = spec.fn(game)
            except Exception as exc:  # a scorer must never crash the round
                log.exception("round %d: scorer %s failed", round_number, name)
                errors.append(f"{name}: {exc}")
                continue
            if out.values.shape != (n,) or not bool(torch.isfinite(out.values).all()):
                errors.append(f"{name}: returned invalid scores")
                continue
            scores[name] = out.values.double()
            if name == "gtg_shapley":
                permutations = int(out.info.get("permutations", 0))
                truncated = bool(out.info.get("round_truncated", 0))

        # ---- flags
        labels, suspect = self._flags(
            round_number, client_ids, updates, global_before,
            scores.get(self.cfg.primary), truncated, decisions,
        )  # fmt: skip

        # ---- totals (a retried round replaces its earlier attempt)
        primary = scores.get(self.cfg.primary)
        rec = _RoundRecord(attempt)
        credit: list[float] = []
        for i, cid in enumerate(client_ids):
            score = 0.0 if primary is None else float(primary[i])
            if set(labels[i]) & FREE_RIDER_FLAGS:
                rec.free_rider.add(cid)
                # No work, no credit: a zero or replayed update can still score
                # > 0 (it shrinks an overshooting aggregate step), which is not
                # the sender's doing. Its losses are kept.
                score = min(score, 0.0)
            if suspect[i]:
                rec.suspect.add(cid)
            rec.primary[cid] = score
            credit.append(score)
        self._rounds[round_number] = rec
        self._recount()
        shares = self.shares()
        budget = self.cfg.budget

        clients = tuple(
            ClientContribution(
                client_id=cid,
                scores={k: float(v[i]) for k, v in scores.items()},
                credit=credit[i],
                flags=tuple(labels[i]),
                suspect=bool(suspect[i]),
                cumulative=self._cumulative[cid],
                reward_share=shares[cid],
                reward=budget * shares[cid],
            )
            for i, cid in enumerate(client_ids)
        )

        # ---- remember what the next round needs
        if (
            value is not None
            and value.full_global is not None
            and full_value is not None
        ):
            self._prev_full = (round_number, value.full_global, full_value)
        else:
            self._prev_full = None

        evals = extra_evals + (0 if value is None else value.evaluations)
        util_seconds = extra_seconds + (0.0 if value is None else value.seconds)
        pending = self._record(
            round_number,
            attempt,
            clients,
            decisions,
            empty_value=None if value is None else value.empty_value,
            full_value=full_value,
            truncated=truncated,
            evaluations=evals,
            permutations=permutations,
            seconds=time.perf_counter() - t0,
            errors=errors,
        )
        seconds = time.perf_counter() - t0
        self.total_evaluations += evals
        self.total_seconds += seconds
        return RoundContribution(
            round_number=round_number,
            attempt=attempt,
            clients=clients,
            utility_before=None if value is None else value.empty_value,
            utility_after=full_value,
            valued=value is not None,
            truncated=truncated,
            cost=ContributionCost(evals, seconds, util_seconds, permutations),
            pending=pending,
            errors=tuple(errors),
        )

    # ------------------------------------------------------------ helpers
    def _check(
        self,
        round_number: int,
        client_ids: list[str],
        updates: torch.Tensor,
        weights: torch.Tensor | None,
        global_before: torch.Tensor,
    ) -> tuple[int, int]:
        if isinstance(round_number, bool) or round_number < 1:
            raise ContributionError(f"round_number must be >= 1, got {round_number}")
        if updates.dim() != 2 or not torch.is_floating_point(updates):
            raise ContributionError(
                f"updates must be a float [n, d] tensor, got {updates.dtype} "
                f"{list(updates.shape)}"
            )
        n, d = int(updates.shape[0]), int(updates.shape[1])
        if len(client_ids) != n or len(set(client_ids)) != n:
            raise ContributionError(
                f"need {n} distinct client ids for {n} updates, got {len(client_ids)}"
            )
        if weights is not None and weights.shape != (n,):
            raise ContributionError(f"weights must be [{n}], got {list(weights.shape)}")
        if global_before.shape != (d,):
            raise ContributionError(
                f"global_before must be [{d}], got {list(global_before.shape)}"
            )
        if n and not bool(torch.isfinite(updates).all()):
            raise ContributionError("updates must be finite")
        return n, d

    def _reuse_before(
        self, round_number: int, global_before: torch.Tensor
    ) -> float | None:
        """``U(∅)`` of this round is ``U(N)`` of the previous round when the
        engine's new global was exactly ``aggregate_fn`` of all updates."""
        if self._prev_full is None:
            return None
        rnd, weights, value = self._prev_full
        if rnd == round_number - 1 and torch.equal(weights, global_before):
            return value
        return None

    def _flags(
        self,
        round_number: int,
        client_ids: list[str],
        updates: torch.Tensor,
        global_before: torch.Tensor,
        primary: torch.Tensor | None,
        truncated: bool,
        decisions: Sequence[ClientDecision],
    ) -> tuple[list[list[str]], list[bool]]:
        n, d = updates.shape
        th = self._thresholds
        labels = aggregator_flags(decisions, n) if n else []
        if n == 0:
            return labels, []
        norms = torch.linalg.vector_norm(updates.double(), dim=1)
        zero = zero_updates(norms, th.zero_norm)
        rand = (
            random_updates(max_abs_cosine_to_others(updates), int(d), th.random_sigmas)
            & ~zero
        )
        if self._sketch is None or self._sketch.dim != d:
            self._sketch = CountSketch(
                int(d), self.cfg.flags.sketch_width, self.cfg.seed
            )
            self._prev_update_sketch.clear()
            self._prev_global_sketch = None
        sketches = self._sketch(updates)
        global_sketch = self._sketch(global_before)
        step = None
        if (
            self._prev_global_sketch is not None
            and self._prev_global_round == round_number - 1
        ):
            step = global_sketch - self._prev_global_sketch
        earlier = []
        for cid in client_ids:
            seen = self._prev_update_sketch.get(cid)
            # Only earlier rounds: a retried round is not a replay of itself.
            earlier.append(seen[1] if seen and seen[0] < round_number else None)
        replay = replayed_updates(sketches, earlier, step, th.replay_cosine) & ~zero
        outlier = torch.zeros(n, dtype=torch.bool)
        negative = torch.zeros(n, dtype=torch.bool)
        if primary is not None and not truncated:
            outlier = low_score_outliers(primary, th.outlier_z, th.min_clients)
            negative = primary < 0
        suspect: list[bool] = []
        for i, cid in enumerate(client_ids):
            for flag, hit in (
                (ZERO_UPDATE, zero[i]),
                (REPLAYED_UPDATE, replay[i]),
                (RANDOM_UPDATE, rand[i]),
                (LOW_SCORE_OUTLIER, outlier[i]),
                (NEGATIVE_SCORE, negative[i]),
            ):
                if bool(hit):
                    labels[i].append(flag)
            suspect.append(bool(set(labels[i]) & SUSPECT_FLAGS))
            self._prev_update_sketch[cid] = (round_number, sketches[i])
        self._prev_global_sketch = global_sketch
        self._prev_global_round = round_number
        return labels, suspect

    def _record(
        self,
        round_number: int,
        attempt: int,
        clients: Sequence[ClientContribution],
        decisions: Sequence[ClientDecision],
        *,
        empty_value: float | None,
        full_value: float | None,
        truncated: bool,
        evaluations: int,
        permutations: int,
        seconds: float,
        errors: list[str],
    ) -> PendingRecord:
        """The round's ledger entries (chained after the stored tail), the new
        signed head and the cost metrics; nothing is written here."""
        metrics = {
            "contribution.utility_evaluations": float(evaluations),
            "contribution.seconds": seconds,
            "contribution.permutations": float(permutations),
            "contribution.truncated": float(truncated),
            "contribution.suspects": float(sum(c.suspect for c in clients)),
        }
        if empty_value is not None and full_value is not None:
            metrics["contribution.utility_before"] = empty_value
            metrics["contribution.utility_after"] = full_value
        if not clients:
            return PendingRecord((), None, metrics)
        weight = {d.index: d.weight for d in decisions}
        contents = [
            {
                "round": round_number,
                "attempt": attempt,
                "client_id": c.client_id,
                "scores": c.scores,
                "credit": c.credit,
                "flags": list(c.flags),
                "suspect": c.suspect,
                "weight": weight.get(i),
                "cumulative": c.cumulative,
                "reward_share": c.reward_share,
                "reward": c.reward,
            }
            for i, c in enumerate(clients)
        ]
        entries = chain_entries(
            self.run_id,
            contents,
            start_seq=self._seq + 1,
            prev_hash=self._head,
            signing_key=self.signing_key,
        )
        head = sign_head(
            self.run_id, entries[-1].seq, entries[-1].entry_hash, self.signing_key
        )
        return PendingRecord(tuple(entries), head, metrics)

    def committed(self, pending: PendingRecord) -> None:
        """The round's ledger entries are stored: continue the chain after them."""
        if pending.head is not None:
            self._seq, self._head = pending.head.seq, pending.head.head_hash

    def discard(self) -> None:
        """The round was not stored: re-read the ledger before the next round."""
        self._resync = True


def _payload(e: StoredEntry) -> dict[str, Any]:
    try:
        data = json.loads(e.payload_json)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def make_utility_from_metric(
    evaluate: Callable[[torch.Tensor], Any], metric: str = "accuracy"
) -> UtilityFn:
    """Adapt an evaluator to a utility function: the named value of its result.

    ``evaluate(weights)`` returns an object with ``value(name) -> float`` (the
    coordinator's ``Evaluator`` does). Values where lower is better
    (:data:`fedplat.metrics.LOWER_IS_BETTER`: loss, MAE, ...) are negated, so a
    larger utility is always a better model. NaN becomes an error.
    """
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0

    def utility(weights: torch.Tensor) -> float:
        value = float(evaluate(weights).value(metric))
        if math.isnan(value):
            raise UtilityError(f"utility {metric!r} is NaN (empty held-out set?)")
        return sign * value

    return utility
