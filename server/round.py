"""The open round's only owner: who was selected, what each of them did, and
when the round's rows may no longer change.

Every change of a round's state goes through a :class:`Round` method, under the
round's own lock, and every change of a client's outcome is checked against
:data:`fedplat.protocol.outcomes.TRANSITIONS` (an illegal one raises
:class:`~fedplat.protocol.outcomes.IllegalTransition`: a bug, never a silent
overwrite). The parts that drive a round (intake, downloads, secure aggregation,
the driver, closing) ask the round; none writes its state.

An upload reserves its client's answer (:meth:`Round.reserve`), writes its row,
and settles the reservation (:meth:`Round.succeed` or :meth:`Round.unreserve`);
while reservations or row writes (:meth:`Round.writing`) are open,
:meth:`Round.seal` waits, so a sealed round's accumulator and outcomes agree: an
update is in the aggregate exactly when its client ``succeeded``.
:meth:`Round.close` then ends every outcome still open as ``dropped``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fedplat.server.accumulator import Accumulator

from fedplat.protocol.errors import DuplicateUpdate, StaleUpdate
from fedplat.protocol.outcomes import FINAL_STATUSES, OutcomeStatus, check_transition

#: The reason every client that never answered gets when its round closes.
NO_UPDATE = "no update before the round closed"


@dataclass(frozen=True)
class Assignment:
    """One selected client's task in a round."""

    client_id: str
    name: str
    task_id: str
    nonce: bytes
    row: int  # place among the round's selected clients (enrolment order)
    seed: int  # the client's training seed this round


@dataclass
class Outcome:
    """What one selected client did in the round (changed only by its
    :class:`Round`; read by closing when the round is written)."""

    status: OutcomeStatus = OutcomeStatus.SELECTED
    bytes_up: int = 0
    bytes_down: int = 0
    num_examples: int = 0
    weight: float = 0.0
    duration_s: float | None = None
    train_loss: float | None = None
    reason: str | None = None
    downloaded_at: float | None = None
    clipped: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Delivery:
    """What an accepted update leaves in its client's outcome."""

    bytes_up: int
    num_examples: int
    weight: float
    train_loss: float | None
    metrics: Mapping[str, float]
    clipped: bool


class Round:
    """One open round (see the module docstring)."""

    def __init__(
        self,
        number: int,
        attempt: int,
        opened_at: float,
        deadline: float,
        model_version: int,
        assignments: Mapping[str, Assignment],
        accumulator: Accumulator,
        num_live: int,
        secagg: Any = None,
    ) -> None:
        self.number = number
        self.attempt = attempt
        self.opened_at = opened_at
        self.deadline = deadline
        self.model_version = model_version
        self.assignments: Mapping[str, Assignment] = MappingProxyType(dict(assignments))
        self.by_task: Mapping[str, Assignment] = MappingProxyType(
            {a.task_id: a for a in assignments.values()}
        )
        self.accumulator = accumulator
        self.num_live = num_live
        # Secure aggregation's state (fedplat.server.secagg_round.SecAggRound).
        self.secagg = secagg
        self._cond = threading.Condition(threading.RLock())
        self._outcomes = {cid: Outcome() for cid in assignments}
        self._answered: set[str] = set()
        self._writers = 0
        self._sealed = False
        self._closed = False

    # ---------------------------------------------------------------- reads
    @property
    def outcomes(self) -> Mapping[str, Outcome]:
        """Each selected client's outcome (read-only; change it through the
        round's methods)."""
        return MappingProxyType(self._outcomes)

    @property
    def sealed(self) -> bool:
        return self._sealed

    @property
    def closed(self) -> bool:
        return self._closed

    def answered(self, client_id: str) -> bool:
        with self._cond:
            return client_id in self._answered

    def num_answered(self) -> int:
        with self._cond:
            return len(self._answered)

    def num_succeeded(self) -> int:
        with self._cond:
            return sum(
                o.status is OutcomeStatus.SUCCEEDED for o in self._outcomes.values()
            )

    def succeeded(self) -> list[str]:
        """Clients whose update was accepted, in selection (row) order."""
        with self._cond:
            return [
                a.client_id
                for a in sorted(self.assignments.values(), key=lambda a: a.row)
                if self._outcomes[a.client_id].status is OutcomeStatus.SUCCEEDED
            ]

    def open_task(self, client_id: str) -> Assignment | None:
        """The client's task if it may still answer it."""
        with self._cond:
            if self._sealed or client_id in self._answered:
                return None
            return self.assignments.get(client_id)

    # ---------------------------------------------------------------- changes
    def _move(self, client_id: str, status: OutcomeStatus) -> Outcome:
        """Change one outcome (lock held), checked against the transitions."""
        o = self._outcomes[client_id]
        o.status = check_transition(o.status, status)
        return o

    def downloaded(self, client_id: str, now: float) -> None:
        """The client fetches the model (again: only its first time counts)."""
        with self._cond:
            if self._sealed:
                return
            o = self._outcomes[client_id]
            if o.status is OutcomeStatus.SELECTED:
                self._move(client_id, OutcomeStatus.DOWNLOADED)
            if o.downloaded_at is None:
                o.downloaded_at = now

    def count(self, client_id: str, *, up: int = 0, down: int = 0) -> None:
        """Bytes the transport moved for this client while the round is open."""
        with self._cond:
            if self._closed:
                return
            o = self._outcomes[client_id]
            o.bytes_up += up
            o.bytes_down += down

    def settle(
        self, client_id: str, status: OutcomeStatus, reason: str, bytes_up: int = 0
    ) -> bool:
        """End the client's round without an update (``rejected``, ``late``,
        ``failed``); False if it had already answered or the round is sealed."""
        if status not in FINAL_STATUSES or status is OutcomeStatus.SUCCEEDED:
            raise ValueError(f"{status!r} is not a failure")
        with self._cond:
            if self._sealed or client_id in self._answered:
                return False
            o = self._move(client_id, status)
            o.reason = reason
            o.bytes_up += bytes_up
            self._answered.add(client_id)
            return True

    def reserve(self, client_id: str) -> None:
        """Claim the client's one answer before its row is committed; the round
        cannot seal until :meth:`succeed` or :meth:`unreserve`."""
        with self._cond:
            if self._sealed:
                raise StaleUpdate(
                    f"round {self.number} closed while the update was decoded"
                )
            if client_id in self._answered:
                raise DuplicateUpdate(
                    f"an update for round {self.number} was already received"
                )
            self._answered.add(client_id)
            self._writers += 1

    def succeed(self, client_id: str, accepted: Delivery, now: float) -> None:
        """The reserved update is in the accumulator: the client succeeded."""
        with self._cond:
            o = self._move(client_id, OutcomeStatus.SUCCEEDED)
            o.bytes_up += accepted.bytes_up
            o.num_examples = accepted.num_examples
            o.weight = accepted.weight
            o.duration_s = max(0.0, now - (o.downloaded_at or self.opened_at))
            o.train_loss = accepted.train_loss
            o.metrics = dict(accepted.metrics)
            o.clipped = accepted.clipped
            self._release()

    def unreserve(self, client_id: str, reason: str, bytes_up: int = 0) -> None:
        """A reserved update could not be committed: the client failed."""
        with self._cond:
            o = self._move(client_id, OutcomeStatus.FAILED)
            o.reason = reason
            o.bytes_up += bytes_up
            self._release()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the round open while a row is being written (decoding into a
        row of the accumulator); StaleUpdate once the round is sealed."""
        with self._cond:
            if self._sealed:
                raise StaleUpdate(f"round {self.number} closed during the upload")
            self._writers += 1
        try:
            yield
        finally:
            with self._cond:
                self._release()

    def _release(self) -> None:
        self._writers -= 1
        self._cond.notify_all()

    def secagg_succeeded(self, client_ids: list[str]) -> None:
        """Secure aggregation's survivors (their masked inputs are in the sum)."""
        with self._cond:
            for cid in client_ids:
                o = self._move(cid, OutcomeStatus.SUCCEEDED)
                o.weight = 1.0
                self._answered.add(cid)

    def secagg_rejected(self, client_id: str, reason: str) -> None:
        """A client secure aggregation refused or lost (any state but final)."""
        with self._cond:
            if self._outcomes[client_id].status in FINAL_STATUSES:
                return
            o = self._move(client_id, OutcomeStatus.REJECTED)
            o.reason = f"secure aggregation: {reason}"
            self._answered.add(client_id)

    def mark_answered(self, client_id: str) -> None:
        """Secure aggregation: the client has no task left (its outcome is
        decided when the protocol ends)."""
        with self._cond:
            self._answered.add(client_id)

    # ---------------------------------------------------------------- end
    def seal(self, timeout: float = 1.0) -> None:
        """No more answers or row writes; waits for those in progress."""
        with self._cond:
            self._sealed = True
            while self._writers:
                self._cond.wait(timeout)

    def close(self) -> None:
        """Seal (if not yet) and end every outcome still open as ``dropped``;
        the round's outcomes never change again."""
        self.seal()
        with self._cond:
            if self._closed:
                return
            for cid, o in self._outcomes.items():
                if o.status not in FINAL_STATUSES:
                    self._move(cid, OutcomeStatus.DROPPED)
                    o.reason = NO_UPDATE
            self._closed = True


__all__ = ["NO_UPDATE", "Assignment", "Delivery", "Outcome", "Round"]
