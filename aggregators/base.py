"""The aggregator interface: pure callables over an ``[n, d]`` stack of client updates.

An aggregator receives the round's decoded updates as one float tensor ``updates`` of
shape ``[n, d]`` (row ``i`` is client ``i``'s update, typically ``new - global``) and
optional non-negative per-client ``weights`` of shape ``[n]`` (e.g. example counts).
It returns an :class:`AggregationResult`: the aggregate ``[d]`` and one
:class:`ClientDecision` per row saying what the rule did with that client, so the
coordinator can store per-client flags for contribution accounting and the monitor.

Stateful rules (centered clipping's reference point, ...) keep tensors in
``state_dict()`` so the coordinator checkpoints them with the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


class AggregationError(ValueError):
    """Invalid settings or inputs for an aggregation rule (e.g. ``2f >= n``)."""


@dataclass(frozen=True)
class ClientDecision:
    """What a rule did with one client's row.

    ``weight`` is the effective weight of the row in the output (0 when excluded),
    ``selected`` whether the row contributed at all, ``score`` a rule-specific
    number (distance, Krum score, ...) or ``None``, ``flags`` short labels such as
    ``"excluded"``, ``"clipped"``, ``"down-weighted"``.
    """

    index: int
    weight: float
    selected: bool = True
    score: float | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class AggregationResult:
    aggregate: torch.Tensor  # [d]
    decisions: list[ClientDecision] = field(default_factory=list)


@runtime_checkable
class Aggregator(Protocol):
    """A rule ``(updates [n, d], weights [n] | None) -> AggregationResult``."""

    name: str

    def __call__(
        self, updates: torch.Tensor, weights: torch.Tensor | None = None
    ) -> AggregationResult: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


class StatelessAggregator:
    """Base class for rules without cross-round state."""

    name = "stateless"

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise AggregationError(
                f"{self.name} has no state; got keys {sorted(state)}"
            )


def check_updates(
    updates: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Validate the ``[n, d]`` stack; return weights ``[n]`` normalised to sum 1."""
    if updates.dim() != 2:
        raise AggregationError(
            f"updates must be [n, d], got shape {list(updates.shape)}"
        )
    n = updates.shape[0]
    if n == 0:
        raise AggregationError("no updates to aggregate")
    if not torch.is_floating_point(updates):
        raise AggregationError(f"updates must be floating point, got {updates.dtype}")
    if weights is None:
        return torch.full((n,), 1.0 / n, dtype=torch.float64)
    if weights.shape != (n,):
        raise AggregationError(
            f"weights must be [{n}], got shape {list(weights.shape)}"
        )
    w = weights.to(torch.float64)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise AggregationError("weights must be finite and non-negative")
    total = float(w.sum())
    if total <= 0:
        raise AggregationError("weights sum to zero")
    return w / total
