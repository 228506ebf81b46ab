"""The one name -> factory registry used for every pluggable component.

Aggregators, pre-aggregators, attacks, compressors, models, datasets,
partitioners, contribution scorers, evaluation metrics, mixing rules and payload
decoders are each a :class:`Registry`: a plain dict filled by explicit
``register`` calls (no lookup by reflection on a module). Registering a name twice
is an error; an unknown name lists the valid ones; an unknown parameter names
itself and the accepted ones instead of being dropped silently. Registries that
accept user code also resolve ``"package.module:attribute"`` import paths.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def accepted_params(factory: Callable[..., Any]) -> list[str] | None:
    """Keyword names ``factory`` accepts; ``None`` when it takes ``**kwargs`` or
    has no inspectable signature (then any keyword is passed through)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [
        p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def import_path(spec: str, error: type[Exception] = ValueError) -> Any:
    """The attribute named by ``"package.module:attribute"`` (dots allowed after
    the colon). Import errors become ``error`` with the path in the message."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{spec!r} is not an import path of the form 'package.module:name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"cannot import {module_name!r} (from {spec!r}): {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise error(f"{module_name!r} has no attribute {attr!r}") from None
    return obj


class Registry(Generic[T]):
    """Name -> factory map for one kind of component.

    Parameters
    ----------
    kind : str
        What the registry holds (``"aggregator"``), used in error messages.
    error : type of Exception
        Raised for duplicate names, unknown names and bad parameters.
    imports : bool
        Whether :meth:`get` also resolves ``"package.module:name"`` import paths
        (for components users write themselves: models, metrics, datasets).
    """

    def __init__(
        self, kind: str, error: type[Exception] = ValueError, *, imports: bool = False
    ) -> None:
        self.kind = kind
        self.error = error
        self.imports = imports
        self._factories: dict[str, Callable[..., T]] = {}

    @staticmethod
    def key(name: str) -> str:
        return name.strip().lower()

    def register(self, name: str, factory: Callable[..., T]) -> None:
        """Add ``factory`` under ``name`` (case-insensitive); duplicates are errors."""
        key = self.key(name)
        if not key:
            raise self.error(f"{self.kind} name must be non-empty")
        if ":" in key:
            raise self.error(f"{self.kind} name {name!r} must not contain ':'")
        if key in self._factories:
            raise self.error(f"{self.kind} {key!r} is already registered")
        self._factories[key] = factory

    def available(self) -> list[str]:
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.key(name) in self._factories

    def get(self, name: str) -> Callable[..., T]:
        """The factory registered as ``name`` (or imported from a path)."""
        if self.imports and ":" in name:
            obj = import_path(name.strip(), self.error)
            if not callable(obj):
                raise self.error(f"{self.kind} {name!r} is not callable")
            return obj
        key = self.key(name)
        if key not in self._factories:
            valid = ", ".join(self.available()) or "none"
            hint = " or a 'package.module:name' path" if self.imports else ""
            raise self.error(f"unknown {self.kind} {name!r}; available: {valid}{hint}")
        return self._factories[key]

    def create(self, name: str, /, **params: Any) -> T:
        """Build ``name`` with ``params``; unknown names and parameters are errors."""
        factory = self.get(name)
        accepted = accepted_params(factory)
        unknown = sorted(set(params) - set(accepted)) if accepted is not None else []
        if unknown:
            raise self.error(
                f"unknown parameter(s) {', '.join(map(repr, unknown))} for "
                f"{self.kind} {self.key(name)!r}; accepted: "
                f"{', '.join(accepted or []) or 'none'}"
            )
        try:
            return factory(**params)
        except TypeError as exc:
            raise self.error(
                f"bad parameters for {self.kind} {self.key(name)!r}: {exc}"
            ) from exc


__all__ = ["Registry", "accepted_params", "import_path"]
