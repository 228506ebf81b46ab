"""The mixing rules by name: one :class:`~fedplat.registry.Registry` for the
simulation and the real peers alike.

A rule says *how models are exchanged* (:attr:`MixingRule.exchange`) and, for
the rules that average what neighbours send, *with which weights* and *how they
combine*, in two forms that agree (a test checks it): the ``[n, n]`` matrix the
simulation applies to all stacked models at once, and the ``[k + 1]`` row one
peer computes for its ``k`` neighbours. Nothing outside this module branches on
a rule's name.

The default, :data:`DEFAULT_RULE` (``clipped_gossip``), is the only one that
bounds what a compromised member can do: it clips each neighbour's difference
(:mod:`fedplat.gossip.mixing.clipped`) and weighs neighbours by this peer's own
degree alone. The other rules average without clipping and, for
``metropolis_hastings`` and ``decavg``, weigh by what neighbours declare about
themselves; they stay selectable by name for honest networks and comparisons.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from fedplat.gossip.mixing.clipped import (
    clipped_gossip,
    clipped_gossip_row,
    own_degree_row,
)
from fedplat.gossip.mixing.pushsum import push_sum_matrix
from fedplat.gossip.mixing.weights import (
    data_weighted,
    data_weighted_row,
    metropolis_hastings,
    metropolis_hastings_row,
    mix_public,
    uniform,
    uniform_row,
)
from fedplat.gossip.mixing.weights import mix_row as linear_mix_row
from fedplat.registry import Registry

__all__ = [
    "DEFAULT_RULE",
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
#: ``(W [n, n], x [n, d], public [n, d]) -> [n, d]``: every node's own model is
#: exact, its neighbours' are what they sent.
CombineFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
#: ``(weights [k + 1], own [d], neighbours [k, d]) -> [d]``.
CombineRowFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: The rule of a peer, a scenario or ``fedplat gossip node`` that names none.
DEFAULT_RULE = "clipped_gossip"


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
    combine : callable
        How the whole graph mixes with ``W`` (default: the linear step
        :func:`~fedplat.gossip.mixing.weights.mix_public`).
    combine_row : callable
        How one peer mixes with its row (default: the linear
        :func:`~fedplat.gossip.mixing.weights.mix_row`).
    """

    name: str
    exchange: Exchange
    matrix: MatrixFn | None = None
    row: RowFn | None = None
    combine: CombineFn = mix_public
    combine_row: CombineRowFn = linear_mix_row

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

    def mix(
        self, w: torch.Tensor, x: torch.Tensor, public: torch.Tensor
    ) -> torch.Tensor:
        """One step of the whole graph: ``[n, n], [n, d], [n, d] -> [n, d]``."""
        return self.combine(w, x, public)

    def mix_row(
        self, weights: torch.Tensor, own: torch.Tensor, neighbours: torch.Tensor
    ) -> torch.Tensor:
        """One peer's step: ``[k + 1], [d], [k, d] -> [d]``."""
        return self.combine_row(weights, own, neighbours)


MIXING_RULES: Registry[MixingRule] = Registry("mixing rule")


def register_mixing_rule(rule: MixingRule) -> None:
    """Add ``rule`` under its name (a second rule of the same name is an error)."""
    MIXING_RULES.register(rule.name, lambda: rule)


def get_mixing_rule(name: str) -> MixingRule:
    """The rule registered as ``name``; an unknown name lists the valid ones."""
    return MIXING_RULES.create(name)


register_mixing_rule(
    MixingRule(
        DEFAULT_RULE,
        "average",
        # The simulation knows every degree, so 1 / (deg_i + 1) is uniform(adj);
        # a peer uses its own live degree (own_degree_row): nothing declared.
        matrix=lambda adj, sizes: uniform(adj),
        row=lambda deg, size, nb_deg, nb_size: own_degree_row(deg, nb_deg.numel()),
        combine=clipped_gossip,
        combine_row=clipped_gossip_row,
    )
)
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
