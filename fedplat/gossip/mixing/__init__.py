"""Gossip mixing maths: pure functions over ``[n, n]`` weights and ``[n, d]`` models.

No network, no store, no protobuf: the simulation applies these to the whole
stacked model matrix, a real peer applies the ``*_row`` forms to its own model and
the ones it received. ``tests/test_packaging.py`` keeps this package pure.
"""

from fedplat.gossip.mixing.clipped import (
    DEFAULT_CLIP_FRACTION,
    clip,
    clipped_gossip,
    clipped_gossip_row,
    clipping_radius,
    own_degree_row,
)
from fedplat.gossip.mixing.consensus import consensus_distance
from fedplat.gossip.mixing.noloco import (
    NoLoCoState,
    noloco_local_step,
    noloco_outer_step,
    pair_average,
    random_pairs,
)
from fedplat.gossip.mixing.pushsum import (
    PushSumShare,
    PushSumState,
    push_sum_estimate,
    push_sum_matrix,
    push_sum_share,
    push_sum_step,
)
from fedplat.gossip.mixing.rules import (
    DEFAULT_RULE,
    MIXING_RULES,
    Exchange,
    MixingRule,
    get_mixing_rule,
    register_mixing_rule,
)
from fedplat.gossip.mixing.weights import (
    check_adjacency,
    data_weighted,
    data_weighted_row,
    metropolis_hastings,
    metropolis_hastings_row,
    mix,
    mix_public,
    mix_row,
    uniform,
    uniform_row,
)

#: Names accepted by ``mixing.rule`` in scenarios and by ``fedplat gossip node``.
RULES: tuple[str, ...] = tuple(MIXING_RULES.available())

__all__ = [
    "DEFAULT_CLIP_FRACTION",
    "DEFAULT_RULE",
    "MIXING_RULES",
    "RULES",
    "Exchange",
    "MixingRule",
    "NoLoCoState",
    "PushSumShare",
    "PushSumState",
    "check_adjacency",
    "clip",
    "clipped_gossip",
    "clipped_gossip_row",
    "clipping_radius",
    "consensus_distance",
    "data_weighted",
    "data_weighted_row",
    "get_mixing_rule",
    "metropolis_hastings",
    "metropolis_hastings_row",
    "mix",
    "mix_public",
    "mix_row",
    "noloco_local_step",
    "noloco_outer_step",
    "own_degree_row",
    "pair_average",
    "push_sum_estimate",
    "push_sum_matrix",
    "push_sum_share",
    "push_sum_step",
    "random_pairs",
    "register_mixing_rule",
    "uniform",
    "uniform_row",
]
