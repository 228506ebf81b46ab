"""Cross-round state of the accountant: per-round facts and the totals they imply.

A run's totals are a pure function of its accounted rounds: each round keeps the
clients' credits and who was suspect or free-riding in it (:class:`RoundRecord`),
and :class:`Totals` sums them. A round accounted again (``attempt`` + 1) replaces
its earlier attempt, so the totals never count a round twice. The totals of a
resumed run are rebuilt from its ledger (:meth:`Totals.from_ledger`): every entry
carries the round, attempt, credit and flags it was written with.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedplat.contribution.flags import FREE_RIDER_FLAGS, SUSPECT_FLAGS
from fedplat.contribution.ledger import StoredEntry
from fedplat.contribution.results import ClientStanding
from fedplat.contribution.rewards import reward_shares


@dataclass
class RoundRecord:
    """The accounted facts of one round that feed cumulative totals.

    Attributes
    ----------
    attempt
        Which accounting of the round this is (1, 2, ...).
    primary
        Client id -> credit (primary score, capped at 0 when free-riding).
    suspect, free_rider
        Clients branded suspect / flagged as free-riding in the round.
    """

    attempt: int
    primary: dict[str, float] = field(default_factory=dict)
    suspect: set[str] = field(default_factory=set)
    free_rider: set[str] = field(default_factory=set)


def round_record(
    attempt: int,
    client_ids: Sequence[str],
    primary: torch.Tensor | None,
    free_rider: Sequence[bool],
    suspect: Sequence[bool],
) -> RoundRecord:
    """A round's credits from its ``[n]`` primary scores (0 each when the scorer
    did not run) and who was free-riding or suspect (row ``i`` is
    ``client_ids[i]``)."""
    rec = RoundRecord(attempt)
    for i, cid in enumerate(client_ids):
        score = 0.0 if primary is None else float(primary[i])
        if free_rider[i]:
            rec.free_rider.add(cid)
            # No work, no credit: a zero or replayed update can still score
            # > 0 (it shrinks an overshooting aggregate step), which is not
            # the sender's doing. Its losses are kept.
            score = min(score, 0.0)
        if suspect[i]:
            rec.suspect.add(cid)
        rec.primary[cid] = score
    return rec


def _count(counts: dict[str, int], ids: Iterable[str]) -> None:
    for cid in ids:
        counts[cid] = counts.get(cid, 0) + 1


class Totals:
    """Cumulative scores, participation and strikes over a run's rounds.

    Immutable once built: :meth:`replace` returns new totals, so a round can be
    previewed (its clients' standings after it) before it is committed.

    Parameters
    ----------
    rounds
        Round number -> its latest accounted attempt.
    strikes
        Rounds with free-rider flags after which a client is disqualified.
    """

    def __init__(self, rounds: Mapping[int, RoundRecord], strikes: int) -> None:
        self.rounds = dict(rounds)
        self.strikes = strikes
        self.cumulative: dict[str, float] = {}
        self.participated: dict[str, int] = {}
        self.suspect: dict[str, int] = {}
        self.free_rider: dict[str, int] = {}
        for rec in self.rounds.values():
            for cid, score in rec.primary.items():
                self.cumulative[cid] = self.cumulative.get(cid, 0.0) + score
            _count(self.participated, rec.primary)
            _count(self.suspect, rec.suspect)
            _count(self.free_rider, rec.free_rider)

    @classmethod
    def from_ledger(cls, entries: Iterable[StoredEntry], strikes: int) -> Totals:
        """The totals a stored ledger implies (latest attempt of each round)."""
        rounds: dict[int, RoundRecord] = {}
        for e in entries:
            payload = _payload(e)
            attempt = int(payload.get("attempt", 1))
            rec = rounds.get(e.round_number)
            if rec is None or attempt > rec.attempt:
                rec = rounds[e.round_number] = RoundRecord(attempt)
            elif attempt < rec.attempt:
                continue
            credit = payload.get("credit")
            rec.primary[e.client_id] = float(credit) if credit is not None else 0.0
            flags = set(payload.get("flags", []))
            if flags & SUSPECT_FLAGS:
                rec.suspect.add(e.client_id)
            if flags & FREE_RIDER_FLAGS:
                rec.free_rider.add(e.client_id)
        return cls(rounds, strikes)

    def next_attempt(self, round_number: int) -> int:
        """The attempt number of accounting ``round_number`` now."""
        prev = self.rounds.get(round_number)
        return 1 if prev is None else prev.attempt + 1

    def replace(self, round_number: int, rec: RoundRecord) -> Totals:
        """New totals with ``rec`` as round ``round_number`` (replacing any)."""
        return Totals({**self.rounds, round_number: rec}, self.strikes)

    def disqualified(self) -> set[str]:
        return {cid for cid, k in self.free_rider.items() if k >= self.strikes}

    def shares(self) -> dict[str, float]:
        """Client id -> current share of the budget."""
        return reward_shares(self.cumulative, self.disqualified())

    def standings(self, budget: float) -> list[ClientStanding]:
        """Every client's totals, ordered by client id."""
        shares = self.shares()
        disqualified = self.disqualified()
        return [
            ClientStanding(
                client_id=cid,
                cumulative=self.cumulative[cid],
                reward_share=shares[cid],
                reward=budget * shares[cid],
                rounds=self.participated.get(cid, 0),
                suspect_rounds=self.suspect.get(cid, 0),
                free_rider_rounds=self.free_rider.get(cid, 0),
                disqualified=cid in disqualified,
            )
            for cid in sorted(self.cumulative)
        ]


def _payload(e: StoredEntry) -> dict[str, Any]:
    try:
        data = json.loads(e.payload_json)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


__all__ = ["RoundRecord", "Totals", "round_record"]
