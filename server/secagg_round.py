"""One round's secure aggregation at the coordinator: the phases, their deadlines,
and what each client is owed.

Under ``privacy.secure_aggregation`` the selected clients do not upload their
updates: after training each runs SecAgg / SecAgg+ (:mod:`fedplat.secagg`)
through the ``SecAgg`` call, and the coordinator only learns the sum of the
survivors' clipped updates. :class:`SecAggRound` wraps the protocol's server
state machine (:class:`fedplat.secagg.SecAggServer`) with what the coordinator
adds:

- **who is who**: each selected client is one party (its enrolment number); a
  message whose party is not the caller's is refused (a client cannot speak for
  another), and the caller is already authenticated and its message signed;
- **deadlines**: the advertise phase waits for training, until the round's
  training deadline; every later phase closes when each client still in the
  protocol has answered or ``phase_seconds`` after it opened. A client that
  misses a deadline has dropped out; the protocol recovers from dropouts as
  long as ``min_clients`` remain (else the round's secure aggregation aborts and
  only noise is released);
- **mailboxes**: the coordinator's message for a client's next phase, handed out
  once when the client calls.

The driver calls :meth:`SecAggRound.tick` while it waits for the round; the round
is over when :attr:`SecAggRound.finished`. Nothing here touches the network or
the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from fedplat.server.accumulator import Accepted, MaskedSum
from fedplat.server.refusals import Rejection

from fedplat.protocol.messages import SecAggReply, SecAggReplyKind
from fedplat.secagg import (
    SecAggAborted,
    SecAggConfig,
    SecAggError,
    SecAggRejected,
    SecAggResult,
    SecAggServer,
    decode,
    encode,
)

if TYPE_CHECKING:
    from fedplat.server.recorder import Recorder
    from fedplat.server.round import Round
    from fedplat.server.uplink_plan import UplinkPlan

__all__ = ["SecAggRound", "settle_secagg"]


@dataclass
class _Party:
    client_id: str
    party: int
    expected: bool = True  # owes a message in the current phase
    answered: bool = False  # sent it
    out: bytes | None = None  # the coordinator's message, not yet fetched
    done: str | None = None  # why it has no part left (None: still in)


class SecAggRound:
    """The coordinator's side of one round's secure aggregation.

    Parameters
    ----------
    config : SecAggConfig
        The round's public parameters (sent in every selected client's task).
    parties : dict
        Selected client id -> its party number in the protocol.
    train_deadline : float
        When the advertise phase closes at the latest (clocks' seconds).
    phase_seconds : float
        Deadline of each later phase.
    """

    def __init__(
        self,
        config: SecAggConfig,
        parties: dict[str, int],
        *,
        train_deadline: float,
        phase_seconds: float,
    ) -> None:
        self.config = config
        self.server = SecAggServer(config, parties.values())
        self.parties = {cid: _Party(cid, p) for cid, p in parties.items()}
        self.phase_deadline = train_deadline
        self.phase_seconds = phase_seconds
        self.finished = False
        self.aborted: str | None = None
        self.result: SecAggResult | None = None
        self.rejected: dict[str, str] = {}  # client id -> reason

    @property
    def phase(self) -> str:
        return self.server.phase

    @property
    def max_message_bytes(self) -> int:
        """The largest message a client may send (its masked input and framing)."""
        return 4 * self.config.ring_dim + 64 * 1024

    # ------------------------------------------------------------ client calls
    def receive(self, client_id: str, data: bytes) -> None:
        """Take the caller's message of the current phase.

        Raises
        ------
        SecAggError
            The message is refused (the client is out of the protocol from then
            on); the reason is kept in :attr:`rejected`.
        """
        p = self.parties[client_id]
        try:
            if p.done is not None or self.finished:
                raise SecAggError(f"no part left in this round ({p.done or 'over'})")
            if not p.expected or p.answered:
                raise SecAggError(f"no message expected in phase {self.phase}")
            msg = decode(data, self.config)
            if getattr(msg, "client_id", None) != p.party:
                raise SecAggError("message speaks for another party")
            self.server.receive(msg)
        except SecAggRejected as exc:
            self._drop(p, exc.reason)
            raise SecAggError(exc.reason) from None
        except SecAggError as exc:
            self._drop(p, str(exc))
            raise
        p.answered = True
        if self.phase == "unmask":
            p.done = "unmask shares sent"

    def _drop(self, p: _Party, reason: str) -> None:
        self.rejected.setdefault(p.client_id, reason)
        p.done = p.done or f"refused: {reason}"
        p.expected = False

    def reply(self, client_id: str) -> SecAggReply:
        """What the caller gets now: its next message (once), DONE or WAIT."""
        p = self.parties[client_id]
        if p.out is not None:
            out, p.out = p.out, None
            return SecAggReply(SecAggReplyKind.MESSAGE, out)
        if p.done is not None or self.finished:
            return SecAggReply(SecAggReplyKind.DONE, reason=p.done or "round over")
        return SecAggReply(SecAggReplyKind.WAIT)

    # ------------------------------------------------------------ the driver
    def due(self, now: float) -> bool:
        """Whether the current phase should close now."""
        if self.finished:
            return False
        waiting = [p for p in self.parties.values() if p.expected and p.done is None]
        return now >= self.phase_deadline or all(p.answered for p in waiting)

    def tick(self, now: float) -> bool:
        """Close the current phase if it is due; True when something changed."""
        if not self.due(now):
            return False
        try:
            replies = self.server.close()
        except SecAggAborted as exc:
            self.finished, self.aborted = True, str(exc)
            return True
        if self.server.phase == "done":
            self.finished, self.result = True, self.server.result
            return True
        by_party = {p.party: p for p in self.parties.values()}
        for p in self.parties.values():
            msg = replies.get(p.party)
            p.expected, p.answered = msg is not None, False
            if msg is None:
                p.done = p.done or f"dropped before phase {self.phase}"
            else:
                p.out = encode(msg)
        assert set(replies) <= set(by_party)
        self.phase_deadline = now + self.phase_seconds
        return True

    def survivors(self) -> list[str]:
        """Client ids whose masked input is in the sum (after a finished round)."""
        if self.result is None:
            return []
        ids = set(self.result.survivors)
        return [p.client_id for p in self.parties.values() if p.party in ids]


def settle_secagg(r: Round, plan: UplinkPlan, recorder: Recorder) -> None:
    """At close: the survivors' outcomes, refusals as events, and the unmasked
    sum into the round's :class:`MaskedSum` (left empty when the protocol
    aborted: the round then releases noise only)."""
    sa: SecAggRound = r.secagg
    acc = r.accumulator
    assert isinstance(acc, MaskedSum)
    # A survivor's masked input is in the sum whatever it sent afterwards (a
    # resent message refused late): its outcome is decided by the sum, and a
    # later refusal is only an event.
    kept = set(sa.survivors()) if sa.result is not None else set()
    for cid, reason in sa.rejected.items():
        if cid not in kept:
            r.secagg_rejected(cid, reason)
        recorder.rejection(
            Rejection("secagg_refused", reason, cid, {"round": r.number})
        )
    if sa.result is None:
        recorder.event(
            "secagg_aborted",
            f"round {r.number}: secure aggregation did not complete "
            f"({sa.aborted or 'unfinished'}); the round releases noise only",
            level="warning",
            round_number=r.number,
        )
        return
    total = sa.result.total
    survivors = sorted(sa.survivors(), key=lambda c: r.assignments[c].row)
    unclipped = None
    if plan.adaptive:
        # Each client appended clip_norm * [not clipped]; rounding removes the
        # fixed-point error (far below clip_norm / 2).
        bits = round(float(total[acc.d]) / plan.clip_norm)
        unclipped = min(max(bits, 0), len(survivors))
    fp = sa.config.fixed_point
    acc.set_result(
        total[: acc.d].to(torch.float64),
        [Accepted(c, r.assignments[c].row, 1.0) for c in survivors],
        unclipped,
        rounding=fp.sensitivity - fp.clip_norm,
    )
    r.secagg_succeeded(survivors)
