"""Fixed vocabularies of the store: run, round, participation, client and event states.

Each vocabulary is a ``Literal`` type (for callers that want static checking) and a
tuple derived from it (for runtime validation and the database CHECK constraints),
so the two can never drift apart.
"""

from __future__ import annotations

from typing import Literal, get_args

RunStatus = Literal["pending", "running", "completed", "failed"]
RoundStatus = Literal["open", "completed", "failed"]
ParticipationStatus = Literal[
    "selected", "downloaded", "succeeded", "rejected", "dropped", "late", "failed"
]
ClientStatus = Literal[
    "enrolled", "active", "idle", "dropped", "banned", "revoked", "lost", "finished"
]
EventLevel = Literal["info", "warning", "error"]

RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
ROUND_STATUSES: tuple[RoundStatus, ...] = get_args(RoundStatus)
PARTICIPATION_STATUSES: tuple[ParticipationStatus, ...] = get_args(ParticipationStatus)
CLIENT_STATUSES: tuple[ClientStatus, ...] = get_args(ClientStatus)
EVENT_LEVELS: tuple[EventLevel, ...] = get_args(EventLevel)

#: States a round may be closed with by ``Store.finish_round``.
FINAL_ROUND_STATUSES: tuple[RoundStatus, ...] = ("completed", "failed")

#: Participation states that count as "did not contribute" in a round's totals.
#: ``selected`` and ``downloaded`` rows still present when the round closes are
#: counted as failures too: the client never delivered an accepted update.
UNSUCCESSFUL_PARTICIPATION_STATUSES: tuple[ParticipationStatus, ...] = tuple(
    s for s in PARTICIPATION_STATUSES if s != "succeeded"
)

__all__ = [
    "CLIENT_STATUSES",
    "EVENT_LEVELS",
    "FINAL_ROUND_STATUSES",
    "PARTICIPATION_STATUSES",
    "ROUND_STATUSES",
    "RUN_STATUSES",
    "UNSUCCESSFUL_PARTICIPATION_STATUSES",
    "ClientStatus",
    "EventLevel",
    "ParticipationStatus",
    "RoundStatus",
    "RunStatus",
]
