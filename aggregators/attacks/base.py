"""The attack interface and the checks every attack shares.

An attack is a callable ``attack(honest [h, d], f) -> byzantine [f, d]``: it sees
the honest updates of the round (the usual omniscient threat model) and returns
what the ``f`` Byzantine clients send. Attacks with randomness own a seeded
generator.
"""

from __future__ import annotations

from typing import Any

import torch
from fedplat.aggregators.base import check_float as _check_float
from fedplat.aggregators.base import check_int as _check_int


class AttackError(ValueError):
    """Invalid attack settings or inputs."""


def check_int(name: str, value: Any, *, minimum: int = 0) -> int:
    """An integer attack setting (:func:`fedplat.aggregators.base.check_int`)."""
    return _check_int(name, value, minimum=minimum, error=AttackError)


def check_float(name: str, value: Any, *, minimum: float | None = None) -> float:
    """A finite real attack setting (:func:`fedplat.aggregators.base.check_float`)."""
    return _check_float(name, value, minimum=minimum, error=AttackError)


def check_honest(honest: torch.Tensor, f: Any, need: int = 1) -> int:
    """Validate the honest stack ``[h, d]`` (at least ``need`` rows) and ``f``."""
    if honest.dim() != 2:
        raise AttackError(f"honest must be [h, d], got shape {list(honest.shape)}")
    if honest.shape[0] < need:
        raise AttackError(
            f"attack needs at least {need} honest vector(s), got {honest.shape[0]}"
        )
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        raise AttackError(f"f must be a non-negative int, got {f!r}")
    return f


def tile(vector: torch.Tensor, f: int) -> torch.Tensor:
    """``f`` copies of ``vector`` ``[d]`` as ``[f, d]``."""
    return vector.unsqueeze(0).expand(f, -1).clone()


class Attack:
    """Base class: ``__call__(honest [h, d], f) -> [f, d]``."""

    name = "attack"

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(
            f"{k}={v!r}" for k, v in sorted(vars(self).items()) if not k.startswith("_")
        )
        return f"{type(self).__name__}({params})"
