"""A little is enough (Baruch, Baruch & Goldberg, NeurIPS 2019): Byzantine rows
inside the spread of the honest ones, at ``mean - z * std`` per coordinate."""

from __future__ import annotations

import math

import torch
from fedplat.aggregators.attacks.base import (
    Attack,
    AttackError,
    check_float,
    check_honest,
    tile,
)


def alie_z(n: int, f: int, among_honest: bool = False) -> float:
    """``z_max`` of "A little is enough" (Baruch et al. 2019, Sec. 3).

    ``s = floor(n/2 + 1) - f`` supporters are needed, and ``z`` is the largest
    value with ``Phi(z) < (n - s) / n``, i.e. ``Phi^-1((n - s) / n)``. ``n``
    counts all clients (honest and Byzantine).

    ``among_honest=True`` uses ``(h - s) / h`` with ``h = n - f`` instead, as the
    code of Karimireddy et al. 2022 does (``attacks/alittle.py``); for n = 25,
    f = 5 that gives z = 0.25 instead of the paper's 0.47.

    Examples
    --------
    >>> round(alie_z(25, 5), 2), round(alie_z(25, 5, among_honest=True), 2)
    (0.47, 0.25)
    """
    s = math.floor(n / 2 + 1) - f
    p = (n - f - s) / (n - f) if among_honest else (n - s) / n
    if not 0.0 < p < 1.0:
        raise AttackError(f"ALIE z undefined for n={n}, f={f}")
    return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))


class ALittleIsEnough(Attack):
    """ALIE: ``mu - z * sigma`` per coordinate (Baruch et al. 2019).

    ``mu`` and ``sigma`` are the coordinate-wise mean and (Bessel-corrected)
    standard deviation of the honest vectors; the sign and the estimator follow
    the code of Karimireddy et al. 2022 (epfml/byzantine-robust-noniid-optimizer,
    ``attacks/alittle.py``). ``z`` defaults to the paper's formula
    (:func:`alie_z`) with ``n = h + f``; ``among_honest=True`` takes the authors'
    variant over the honest clients; pass ``z`` to fix it.

    Examples
    --------
    >>> honest = torch.tensor([[0.0, 1.0], [2.0, 1.0]])  # mean (1, 1), std (1.41, 0)
    >>> ALittleIsEnough(z=1.0)(honest, 1)
    tensor([[-0.4142,  1.0000]])
    """

    name = "alie"

    def __init__(self, z: float | None = None, among_honest: bool = False) -> None:
        self.z = None if z is None else check_float("z", z)
        if not isinstance(among_honest, bool):
            raise AttackError(f"among_honest must be a bool, got {among_honest!r}")
        self.among_honest = among_honest

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = check_honest(honest, f, need=2)
        n = honest.shape[0] + f
        z = alie_z(n, f, self.among_honest) if self.z is None else self.z
        mu = honest.mean(dim=0)
        sigma = honest.std(dim=0)
        return tile(mu - z * sigma, f)
