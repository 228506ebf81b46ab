"""Storing an accounted round the way the coordinator does (server/closing.py).

The contribution accountant writes nothing: :meth:`ContributionAccountant.on_round`
returns a pending ledger record, the coordinator stores it with the round in one
transaction and then calls ``committed`` (``discard`` if the write failed). These
helpers do the same against a real :class:`fedplat.store.Store`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fedplat.contribution import ContributionAccountant, RoundContribution
from fedplat.store import ContributionRow, ParticipationRow, RoundClose, Store


def commit_ledger(
    store: Any, acc: ContributionAccountant, rc: RoundContribution
) -> None:
    """Append the round's pending ledger entries and head, then commit them."""
    p = rc.pending
    if p.head is not None:
        store.append_ledger(acc.run_id, p.entries, p.head)
    acc.committed(p)


def contribution_rows(rc: RoundContribution) -> tuple[ContributionRow, ...]:
    """One contributions row per client, as the coordinator's closer writes it."""
    return tuple(
        ContributionRow(c.client_id, c.credit, dict(c.scores), c.suspect, c.flags)
        for c in rc.clients
    )


def close_accounted_round(
    store: Store, acc: ContributionAccountant, rc: RoundContribution
) -> None:
    """Open and close ``rc``'s round in ``store`` with its participations,
    contribution rows, metrics and ledger in one transaction, then commit.

    Raises whatever the store raises, without committing (the caller decides
    whether to ``discard``)."""
    number = rc.round_number
    store.open_round(
        acc.run_id,
        number,
        num_selected=max(1, len(rc.clients)),
        deadline_at=datetime.now(UTC) + timedelta(minutes=5),
        model_version=number - 1,
    )
    p = rc.pending
    store.close_round(
        acc.run_id,
        number,
        RoundClose(
            status="completed",
            participations=tuple(
                ParticipationRow(c.client_id, "succeeded") for c in rc.clients
            ),
            metrics=dict(p.metrics),
            contributions=contribution_rows(rc),
            ledger=None if p.head is None else (p.entries, p.head),
        ),
    )
    acc.committed(p)


__all__ = ["close_accounted_round", "commit_ledger", "contribution_rows"]
