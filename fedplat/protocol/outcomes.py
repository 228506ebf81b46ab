"""What happened to a selected client in a round: its outcome states and their order.

A client selected for a round starts ``selected``; fetching the global model makes
it ``downloaded``; its round ends in one final state: ``succeeded`` (its update was
accepted), ``rejected`` (refused: bad signature, shape, size, non-finite values, a
secure-aggregation refusal), ``late`` (it answered after the deadline or for a
closed task), ``dropped`` (nothing arrived before the round closed) or ``failed``
(its round ended without an accepted update for another reason). A final state
never changes. The values are the store's participation statuses
(:data:`fedplat.store.statuses.ParticipationStatus`); when the recorder replaces a
closed round's record the store refuses with a ``failed`` one, that rewrites a
row, it is no transition.

:data:`TRANSITIONS` lists every allowed change; :func:`check_transition` refuses
any other, so whoever owns the open round can make every change through it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class OutcomeStatus(enum.StrEnum):
    """A selected client's state in one round (values as the store spells them)."""

    SELECTED = "selected"
    DOWNLOADED = "downloaded"
    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    DROPPED = "dropped"
    LATE = "late"
    FAILED = "failed"


_ENDINGS = frozenset(
    {
        OutcomeStatus.SUCCEEDED,
        OutcomeStatus.REJECTED,
        OutcomeStatus.DROPPED,
        OutcomeStatus.LATE,
        OutcomeStatus.FAILED,
    }
)

#: state -> the states it may change to. An upload may arrive without a recorded
#: download (``selected -> succeeded``); staying in a state is not a transition.
TRANSITIONS: Mapping[OutcomeStatus, frozenset[OutcomeStatus]] = MappingProxyType(
    {
        OutcomeStatus.SELECTED: _ENDINGS | {OutcomeStatus.DOWNLOADED},
        OutcomeStatus.DOWNLOADED: _ENDINGS,
        **{s: frozenset() for s in _ENDINGS},
    }
)

#: The states a round's outcome ends in (no transition leaves them).
FINAL_STATUSES: frozenset[OutcomeStatus] = frozenset(
    s for s, after in TRANSITIONS.items() if not after
)


class IllegalTransition(ValueError):
    """A change of a client's outcome that :data:`TRANSITIONS` does not allow."""

    def __init__(self, current: OutcomeStatus, new: OutcomeStatus) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "none: it is final"
        super().__init__(
            f"an outcome cannot go from {current.value!r} to {new.value!r} "
            f"(allowed: {allowed})"
        )
        self.current = current
        self.new = new


def check_transition(
    current: OutcomeStatus | str, new: OutcomeStatus | str
) -> OutcomeStatus:
    """Return ``new`` as an :class:`OutcomeStatus` if ``current -> new`` is allowed.

    Raises
    ------
    ValueError
        A name that is no outcome state.
    IllegalTransition
        A change :data:`TRANSITIONS` does not list (a final state left, a state
        re-entered, ``downloaded -> selected``).
    """
    cur, nxt = OutcomeStatus(current), OutcomeStatus(new)
    if nxt not in TRANSITIONS[cur]:
        raise IllegalTransition(cur, nxt)
    return nxt


__all__ = [
    "FINAL_STATUSES",
    "TRANSITIONS",
    "IllegalTransition",
    "OutcomeStatus",
    "check_transition",
]
