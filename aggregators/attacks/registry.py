"""The attack registry (:class:`fedplat.registry.Registry`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedplat.aggregators.attacks.base import Attack, AttackError

from fedplat.registry import Registry

_ATTACKS: Registry[Attack] = Registry("attack", error=AttackError)


def register_attack(name: str, factory: Callable[..., Attack]) -> None:
    """Add an attack under ``name``; duplicates are errors."""
    _ATTACKS.register(name, factory)


def available_attacks() -> list[str]:
    return _ATTACKS.available()


def create_attack(name: str, **params: Any) -> Attack:
    """Build a registered attack; unknown names and parameters are errors."""
    return _ATTACKS.create(name, **params)
