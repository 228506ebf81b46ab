"""The rule and pre-aggregator registries (:class:`fedplat.registry.Registry`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedplat.aggregators.base import AggregationError, Aggregator, PreAggregator

from fedplat.registry import Registry

AggregatorFactory = Callable[..., Aggregator]

_AGGREGATORS: Registry[Aggregator] = Registry("aggregator", AggregationError)
_PRE_AGGREGATORS: Registry[PreAggregator] = Registry("pre-aggregator", AggregationError)


def register_aggregator(name: str, factory: AggregatorFactory) -> None:
    """Add a rule under ``name``; registering a name twice is an error."""
    _AGGREGATORS.register(name, factory)


def available_aggregators() -> list[str]:
    return _AGGREGATORS.available()


def create_aggregator(name: str, **params: Any) -> Aggregator:
    """Build a registered rule; an unknown name lists the valid ones."""
    return _AGGREGATORS.create(name, **params)


def register_pre_aggregator(name: str, factory: Callable[..., PreAggregator]) -> None:
    """Add a pre-aggregator (clipping, NNM, bucketing, ...) under ``name``."""
    _PRE_AGGREGATORS.register(name, factory)


def available_pre_aggregators() -> list[str]:
    return _PRE_AGGREGATORS.available()


def create_pre_aggregator(name: str, **params: Any) -> PreAggregator:
    """Build a registered pre-aggregator; unknown names/parameters are errors."""
    return _PRE_AGGREGATORS.create(name, **params)
