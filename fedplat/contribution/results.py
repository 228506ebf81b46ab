"""What the contribution accountant returns: typed results of one round and of a run.

:class:`RoundContribution` is one round's accounting; its :class:`PendingRecord`
holds the ledger entries, signed head and metrics the coordinator writes with the
round (one transaction) before calling
:meth:`~fedplat.contribution.ContributionAccountant.committed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedplat.contribution.ledger import LedgerEntry, LedgerHead


class ContributionError(ValueError):
    """Inputs to the accountant are inconsistent (shapes, ids, keys)."""


@dataclass(frozen=True)
class ContributionCost:
    """What valuing a round cost.

    Attributes
    ----------
    utility_evaluations
        Calls of the utility function (held-out evaluations).
    seconds
        Wall time of :meth:`ContributionAccountant.on_round` (nothing is stored
        there: the store write is the coordinator's).
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

    Attributes
    ----------
    entries
        One chained entry per client, continuing the stored chain.
    head
        The new signed head (``None`` for a round without clients).
    metrics
        Round metrics (``contribution.utility_evaluations``, ``.seconds``, ...).
    """

    entries: tuple[LedgerEntry, ...]
    head: LedgerHead | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class RoundContribution:
    """What :meth:`ContributionAccountant.on_round` computed for one round.

    Attributes
    ----------
    round_number, attempt
        The round; ``attempt`` > 1 when the stored ledger already holds the
        round (accounted again after a restart): the latest attempt replaces
        earlier ones in the totals.
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
        Scorer or utility failures that were contained (the round went on).
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


__all__ = [
    "ClientContribution",
    "ClientStanding",
    "ContributionCost",
    "ContributionError",
    "PendingRecord",
    "RoundContribution",
]
