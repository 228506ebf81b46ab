"""Explicit registries: rules, pre-aggregators (and attacks, in ``attacks.py``).

Each registry is a plain dict filled by explicit ``register_*`` calls (no lookup by
reflection on a module). Registering a name twice is an error; creating an unknown
name lists the valid ones; an unknown parameter names itself and the accepted ones
instead of being dropped silently.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from fedplat.aggregators.base import AggregationError, Aggregator, PreAggregator

T = TypeVar("T")


def _accepted_params(factory: Callable[..., Any]) -> list[str]:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins without a signature
        return []
    return [
        p.name
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


class Registry(Generic[T]):
    """Name -> factory map for one kind of component.

    Parameters
    ----------
    kind : str
        What the registry holds (``"aggregator"``), used in error messages.
    error : type of Exception
        Raised for duplicate names, unknown names and bad parameters.
    """

    def __init__(self, kind: str, error: type[Exception] = AggregationError) -> None:
        self.kind = kind
        self.error = error
        self._factories: dict[str, Callable[..., T]] = {}

    @staticmethod
    def _key(name: str) -> str:
        return name.strip().lower()

    def register(self, name: str, factory: Callable[..., T]) -> None:
        """Add ``factory`` under ``name`` (case-insensitive); duplicates are errors."""
        key = self._key(name)
        if not key:
            raise self.error(f"{self.kind} name must be non-empty")
        if key in self._factories:
            raise self.error(f"{self.kind} {key!r} is already registered")
        self._factories[key] = factory

    def available(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, **params: Any) -> T:
        """Build ``name`` with ``params``; unknown names and parameters are errors."""
        key = self._key(name)
        if key not in self._factories:
            valid = ", ".join(self.available())
            raise self.error(f"unknown {self.kind} {name!r}; available: {valid}")
        factory = self._factories[key]
        accepted = _accepted_params(factory)
        unknown = sorted(set(params) - set(accepted)) if accepted else []
        if unknown:
            raise self.error(
                f"unknown parameter(s) {', '.join(map(repr, unknown))} for {self.kind} "
                f"{key!r}; accepted: {', '.join(accepted) or 'none'}"
            )
        try:
            return factory(**params)
        except TypeError as exc:
            raise self.error(f"bad parameters for {self.kind} {key!r}: {exc}") from exc


AggregatorFactory = Callable[..., Aggregator]

_AGGREGATORS: Registry[Aggregator] = Registry("aggregator")
_PRE_AGGREGATORS: Registry[PreAggregator] = Registry("pre-aggregator")


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
