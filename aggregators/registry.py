"""Explicit registry of aggregation rules (``register_*`` / ``create_*``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedplat.aggregators.base import AggregationError, Aggregator

AggregatorFactory = Callable[..., Aggregator]

_REGISTRY: dict[str, AggregatorFactory] = {}


def register_aggregator(name: str, factory: AggregatorFactory) -> None:
    """Add a rule under ``name``; registering a name twice is an error."""
    key = name.strip().lower()
    if not key:
        raise AggregationError("aggregator name must be non-empty")
    if key in _REGISTRY:
        raise AggregationError(f"aggregator {key!r} is already registered")
    _REGISTRY[key] = factory


def available_aggregators() -> list[str]:
    return sorted(_REGISTRY)


def create_aggregator(name: str, **params: Any) -> Aggregator:
    """Build a registered rule; an unknown name lists the valid ones."""
    key = name.strip().lower()
    if key not in _REGISTRY:
        raise AggregationError(
            f"unknown aggregator {name!r}; "
            f"available: {', '.join(available_aggregators())}"
        )
    try:
        return _REGISTRY[key](**params)
    except TypeError as exc:
        raise AggregationError(f"bad parameters for aggregator {key!r}: {exc}") from exc
