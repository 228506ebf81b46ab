"""The rule and pre-aggregator registries (:class:`fedplat.registry.Registry`).

``register_*`` adds a factory under a name (duplicates are errors), ``create_*``
builds one (unknown names and parameters are errors naming the valid ones),
``available_*`` lists the names.
"""

from __future__ import annotations

from fedplat.aggregators.base import AggregationError, Aggregator, PreAggregator

from fedplat.registry import Registry

_AGGREGATORS: Registry[Aggregator] = Registry("aggregator", AggregationError)
_PRE_AGGREGATORS: Registry[PreAggregator] = Registry("pre-aggregator", AggregationError)

register_aggregator = _AGGREGATORS.register
available_aggregators = _AGGREGATORS.available
create_aggregator = _AGGREGATORS.create

register_pre_aggregator = _PRE_AGGREGATORS.register
available_pre_aggregators = _PRE_AGGREGATORS.available
create_pre_aggregator = _PRE_AGGREGATORS.create
