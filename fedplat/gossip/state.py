"""A peer's model vectors and what its neighbours sent, behind one lock.

The round loop (:mod:`fedplat.gossip.node`) trains and mixes, the handlers
(:mod:`fedplat.gossip.inbound`) deposit received models: both go through
:class:`PeerState`, whose condition variable wakes a round waiting for
neighbours' models.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

__all__ = ["NeighbourModel", "PeerState"]


#: Models kept per neighbour, newest rounds first: the one the next mix is for
#: and one round ahead (a neighbour that mixed first may push its next round
#: before this peer mixes; its model must not replace the one it pushed for
#: the round being mixed).
ROUNDS_KEPT = 2


@dataclass
class NeighbourModel:
    """A model a neighbour pushed for one round (its ``x_hat`` for this link)."""

    round: int
    x: torch.Tensor
    num_examples: int
    degree: int


class PeerState:
    """Model ``x`` ``[d]`` and the mixing inputs of one peer.

    Parameters
    ----------
    x : torch.Tensor
        ``[d]`` starting model.
    debiased : bool
        Push-sum: the model is ``x / push_weight`` and neighbours send mass.

    Attributes
    ----------
    lock : threading.RLock
        Guards every attribute.
    arrived : threading.Condition
        Notified when a model arrives or a neighbour changes state.
    published : torch.Tensor
        ``[d]`` the model others pull (set after training, see :meth:`publish`).
    published_version : int
        Counts :meth:`publish` calls (an encoding cache key).
    """

    def __init__(self, x: torch.Tensor, debiased: bool) -> None:
        dim = x.numel()
        self.debiased = debiased
        self.lock = threading.RLock()
        self.arrived = threading.Condition(self.lock)
        self.x = x
        # Push-sum: weight and the mass received since the last mix.
        self.push_weight = 1.0
        self.ps_x = torch.zeros(dim)
        self.ps_w = 0.0
        self.ps_round: dict[str, int] = {}
        # Per neighbour, its models by round (at most ROUNDS_KEPT).
        self.inbox: dict[str, dict[int, NeighbourModel]] = {}
        # NoLoCo outer state.
        self.phi = x.clone()
        self.momentum = torch.zeros(dim)
        self.published = x.clone()
        self.published_version = 0
        self.round = 0
        self.finished = False
        self.accuracy: float | None = None
        self.consensus_gap: float | None = None
        self.rejected = 0
        self.last_rejection = ""
        self.bytes_sent = 0
        self.bytes_received = 0

    def estimate(self) -> torch.Tensor:
        """``[d]`` the model (``x / w`` under push-sum)."""
        with self.lock:
            return self.x / self.push_weight if self.debiased else self.x

    def publish(self) -> None:
        """Make the current estimate the model others pull."""
        with self.lock:
            self.published = self.estimate().clone()
            self.published_version += 1

    def deposit(
        self,
        sender: str,
        round: int,
        x_hat: torch.Tensor,
        num_examples: int,
        degree: int,
        push_weight: float,
    ) -> None:
        """Keep a neighbour's accepted model for the next mix; wake the round."""
        with self.arrived:
            if self.debiased:
                self.ps_x = self.ps_x + x_hat
                self.ps_w += push_weight
                self.ps_round[sender] = max(self.ps_round.get(sender, -1), round)
            else:
                held = self.inbox.setdefault(sender, {})
                held[round] = NeighbourModel(round, x_hat, num_examples, degree)
                for old in sorted(held)[:-ROUNDS_KEPT]:
                    del held[old]
            self.arrived.notify_all()

    def round_of(self, sender: str) -> int:
        """The last round ``sender``'s model arrived for (-1: none)."""
        with self.lock:
            if self.debiased:
                return self.ps_round.get(sender, -1)
            held = self.inbox.get(sender)
            return max(held) if held else -1

    def latest(self, sender: str) -> NeighbourModel | None:
        """The newest model ``sender`` pushed (``None``: none)."""
        with self.lock:
            held = self.inbox.get(sender)
            return held[max(held)] if held else None

    def models_for(
        self, r: int, senders: set[str], staleness: int
    ) -> list[NeighbourModel]:
        """What round ``r`` mixes, one model per sender in ``senders`` (by id):
        the one pushed for round ``r``, else the newest older one no more than
        ``staleness`` rounds old, else the oldest newer one. Synchronous gossip
        mixes the neighbours' round-``r`` models; which one arrived first must
        not change the result."""
        out = []
        with self.lock:
            for j in sorted(senders & self.inbox.keys()):
                rounds = [k for k in self.inbox[j] if k >= r - staleness]
                if not rounds:
                    continue
                older = [k for k in rounds if k <= r]
                out.append(self.inbox[j][max(older) if older else min(rounds)])
        return out

    def wake(self) -> None:
        with self.arrived:
            self.arrived.notify_all()

    def count_bytes(self, sent: int = 0, received: int = 0) -> None:
        with self.lock:
            self.bytes_sent += sent
            self.bytes_received += received

    def count_rejection(self, reason: str) -> None:
        with self.lock:
            self.rejected += 1
            self.last_rejection = reason
