"""Errors of the secure aggregation protocol, each carrying its reason."""

from __future__ import annotations

__all__ = ["SecAggAborted", "SecAggError", "SecAggRejected"]


class SecAggError(ValueError):
    """Bad parameters, a malformed message, or a protocol violation."""


class SecAggRejected(SecAggError):
    """The server refused one participant's message; that participant is dropped.

    The round goes on without it (as if it had dropped out); the coordinator
    records the rejection as an event with :attr:`reason`.
    """

    def __init__(self, client_id: int, phase: str, reason: str) -> None:
        super().__init__(f"client {client_id} in {phase}: {reason}")
        self.client_id = client_id
        self.phase = phase
        self.reason = reason


class SecAggAborted(SecAggError):
    """The round cannot complete (too few participants or shares); nothing is
    revealed and the round has no result."""
