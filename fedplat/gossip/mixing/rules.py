"""The mixing rules by name: one :class:`~fedplat.registry.Registry` for the
simulation and the real peers alike.

A rule says *how models are exchanged* (:attr:`MixingRule.exchange`) and, for
the rules that average what neighbours send, *with which weights*, in two forms
that agree (a test checks it): the ``[n, n]`` matrix the simulation applies to
all stacked models at once, and the ``[k + 1]`` row one peer computes from what
its ``k`` neighbours declared. Nothing outside this module branches on a rule's
name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from fedplat.gossip.mixing.pushsum import push_sum_matrix
from fedplat.gossip.mixing.weights import (
    data_weighted,
    data_weighted_row,
    metropolis_hastings,
    metropolis_hastings_row,
    uniform,
    uniform_row,
)
from fedplat.registry import Registry

__all__ = [
    "MIXING_RULES",
    "Exchange",
    "MixingRule",
    "get_mixing_rule",
    "register_mixing_rule",
]

#: ``average``: every node sends its model to every neighbour and replaces its
#: own by a weighted average (``X <- W X``). ``push_sum``: every node splits its
#: numerator and weight among itself and its out-neighbours (column-stochastic
#: ``P``; the estimate is ``x / w``). ``pairs``: each node averages with one
#: random neighbour (a matching; a real peer pulls its partner's model).
Exchange = Literal["average", "push_sum", "pairs"]

#: ``(adj [n, n] bool, sizes [n]) -> W [n, n]`` (float64).
MatrixFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: ``(own_degree, own_size, neighbour_degrees [k], neighbour_sizes [k]) -> [k + 1]``
#: float64 weights, entry 0 for the peer's own model.
RowFn = Callable[[int, float, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MixingRule:
    """One mixing rule.

    Attributes
    ----------
    name : str
    exchange : {"average", "push_sum", "pairs"}
        How models travel and combine (see :data:`Exchange`).
    matrix : callable, optional
        ``W`` ``[n, n]`` for one step over the whole graph (``average`` and
        ``push_sum`` rules).
    row : callable, optional
        One peer's row of ``W`` from local knowledge (``average`` rules).
    """

    name: str
    exchange: Exchange
    matrix: MatrixFn | None = None
    row: RowFn | None = None

    @property
    def debiased(self) -> bool:
        """Whether the model is ``x / w`` (push-sum) rather than ``x`` itself."""
        return self.exchange == "push_sum"

    def weights(self, adj: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """``[n, n]`` weights of one step on the graph ``adj`` ``[n, n]``."""
        if self.matrix is None:
            raise ValueError(f"mixing rule {self.name!r} has no weight matrix")
        return self.matrix(adj, sizes)

    def row_weights(
        self,
        own_degree: int,
        own_size: float,
        neighbour_degrees: torch.Tensor,
        neighbour_sizes: torch.Tensor,
    ) -> torch.Tensor:
        """``[k + 1]`` weights of one peer (entry 0: its own model)."""
        if self.row is None:
            raise ValueError(f"mixing rule {self.name!r} has no per-peer weights")
        return self.row(own_degree, own_size, neighbour_degrees, neighbour_sizes)


MIXING_RULES: Registry[MixingRule] = Registry("mixing rule")


def register_mixing_rule(rule: MixingRule) -> None:
    """Add ``rule`` under its name (a second rule of the same name is an error)."""
    MIXING_RULES.register(rule.name, lambda: rule)


def get_mixing_rule(name: str) -> MixingRule:
    """The rule registered as ``name``; an unknown name lists the valid ones."""
    return MIXING_RULES.create(name)


register_mixing_rule(
    MixingRule(
        "metropolis_hastings",
        "average",
        matrix=lambda adj, sizes: metropolis_hastings(adj),
        row=lambda deg, size, nb_deg, nb_size: metropolis_hastings_row(deg, nb_deg),
    )
)
register_mixing_rule(
    MixingRule(
        "decavg",
        "average",
        matrix=data_weighted,
        row=lambda deg, size, nb_deg, nb_size: data_weighted_row(size, nb_size),
    )
)
register_mixing_rule(
    MixingRule(
        "uniform",
        "average",
        matrix=lambda adj, sizes: uniform(adj),
        row=lambda deg, size, nb_deg, nb_size: uniform_row(int(nb_deg.numel())),
    )
)
register_mixing_rule(
    MixingRule("push_sum", "push_sum", matrix=lambda adj, sizes: push_sum_matrix(adj))
)
register_mixing_rule(MixingRule("noloco", "pairs"))
