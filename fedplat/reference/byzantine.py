"""Byzantine clients for evaluating robust aggregation (never for production use).

:class:`AttackLayer` is a middleware layer that replaces the client's honest update
by an attack's output (attacks from :mod:`fedplat.aggregators.attacks`, which map
honest vectors ``[h, d]`` to Byzantine vectors ``[f, d]``). On its own a client only
knows its own honest update, so it attacks with ``h = 1`` (sign flipping, Gaussian,
random vectors work as intended; ALIE/IPM/mimic degrade to near-honest updates).
In simulation, a :class:`Coalition` lets colluding attackers see the honest updates
of the round, which is the omniscient threat model of those papers: honest clients
get an observing layer, and attackers must be stepped after the honest ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from fedplat.aggregators.attacks import Attack, create_attack
from fedplat.client.middleware import OutgoingUpdate, Send
from fedplat.protocol.messages import UploadAck


class Coalition:
    """Shared view of the honest updates of each round (simulation only)."""

    def __init__(self, num_byzantine: int) -> None:
        if num_byzantine < 1:
            raise ValueError("a coalition needs at least one Byzantine client")
        self.f = num_byzantine
        self._honest: dict[int, list[torch.Tensor]] = {}
        self._attack_out: dict[int, torch.Tensor] = {}
        self._taken: dict[int, int] = {}

    def observer(self) -> Observer:
        """The layer to add to every honest client's middleware."""
        return Observer(self)

    def record(self, round_number: int, vec: torch.Tensor) -> None:
        self._honest.setdefault(round_number, []).append(vec.detach().clone())
        for old in [r for r in self._honest if r < round_number - 1]:
            del self._honest[old]

    def byzantine_update(
        self, attack: Attack, round_number: int, own: torch.Tensor
    ) -> torch.Tensor:
        """One of the ``f`` coordinated Byzantine vectors of this round."""
        if round_number not in self._attack_out:
            honest = self._honest.get(round_number) or [own]
            self._attack_out[round_number] = attack(torch.stack(honest), self.f)
            self._taken[round_number] = 0
        i = self._taken[round_number]
        self._taken[round_number] = i + 1
        out = self._attack_out[round_number]
        return out[min(i, out.shape[0] - 1)]


class Observer:
    """Honest-client layer feeding a :class:`Coalition`; forwards unchanged."""

    def __init__(self, coalition: Coalition) -> None:
        self.coalition = coalition

    def __call__(self, update: OutgoingUpdate, send: Send) -> UploadAck:
        self.coalition.record(update.task.round, update.vector)
        return send(update)


class AttackLayer:
    """Replace the outgoing update with an attack's output."""

    def __init__(
        self,
        attack: str,
        params: dict[str, Any] | None = None,
        *,
        coalition: Coalition | None = None,
    ) -> None:
        self.attack = create_attack(attack, **(params or {}))
        self.coalition = coalition

    def __call__(self, update: OutgoingUpdate, send: Send) -> UploadAck:
        own = update.vector
        if self.coalition is not None:
            bad = self.coalition.byzantine_update(self.attack, update.task.round, own)
        else:
            bad = self.attack(own.unsqueeze(0), 1)[0]
        bad = bad.to(torch.float32)
        return send(
            replace(update, vector=bad, metrics={**update.metrics, "byzantine": 1.0})
        )
