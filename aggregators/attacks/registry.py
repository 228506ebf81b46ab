"""The attack registry (:class:`fedplat.registry.Registry`): ``register_attack``
(duplicates are errors), ``create_attack`` (unknown names and parameters are
errors naming the valid ones), ``available_attacks``."""

from __future__ import annotations

from fedplat.aggregators.attacks.base import Attack, AttackError

from fedplat.registry import Registry

_ATTACKS: Registry[Attack] = Registry("attack", error=AttackError)

register_attack = _ATTACKS.register
available_attacks = _ATTACKS.available
create_attack = _ATTACKS.create
