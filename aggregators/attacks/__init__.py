"""Byzantine attacks, for evaluation only (``fedplat.aggregators.attacks``).

An attack is a callable ``attack(honest [h, d], f) -> byzantine [f, d]``
(:class:`Attack`), so any attack can be pitted against any rule in a test or a
benchmark. One module per family: :mod:`.negation` (sign flipping, IPM),
:mod:`.noise` (Gaussian, uniform random), :mod:`.alie`, :mod:`.mimic`; the
data-level label flipping is :func:`flip_labels` (:mod:`.labels`). Build them by
name with :func:`create_attack`.
"""

from fedplat.aggregators.attacks.alie import ALittleIsEnough, alie_z
from fedplat.aggregators.attacks.base import Attack, AttackError
from fedplat.aggregators.attacks.labels import flip_labels
from fedplat.aggregators.attacks.mimic import Mimic
from fedplat.aggregators.attacks.negation import (
    InnerProductManipulation,
    SignFlipping,
)
from fedplat.aggregators.attacks.noise import GaussianNoise, RandomVectors
from fedplat.aggregators.attacks.registry import (
    available_attacks,
    create_attack,
    register_attack,
)

for _cls in (
    SignFlipping,
    GaussianNoise,
    RandomVectors,
    ALittleIsEnough,
    InnerProductManipulation,
    Mimic,
):
    register_attack(_cls.name, _cls)

__all__ = [
    "ALittleIsEnough",
    "Attack",
    "AttackError",
    "GaussianNoise",
    "InnerProductManipulation",
    "Mimic",
    "RandomVectors",
    "SignFlipping",
    "alie_z",
    "available_attacks",
    "create_attack",
    "flip_labels",
    "register_attack",
]
