"""Attacks that send a negative multiple of the honest mean.

Both are bounded by construction: they shrink (or reverse) the mean step rather
than move the aggregate arbitrarily far.
"""

from __future__ import annotations

import torch
from fedplat.aggregators.attacks.base import (
    Attack,
    check_float,
    check_honest,
    tile,
)


class SignFlipping(Attack):
    """Send ``-scale`` times the honest mean (ByzFL ``SignFlipping``, Allen-Zhu et
    al. 2020); ``scale = 1`` by default.

    Examples
    --------
    >>> honest = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> SignFlipping()(honest, 2)
    tensor([[-2., -3.],
            [-2., -3.]])
    """

    name = "sign_flip"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = check_float("scale", scale, minimum=0.0)

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = check_honest(honest, f)
        return tile(-self.scale * honest.mean(dim=0), f)


class InnerProductManipulation(Attack):
    """IPM: ``-epsilon`` times the honest mean (Xie, Koyejo & Gupta, UAI 2020,
    "Fall of empires"); ``epsilon = 0.1`` as in Karimireddy et al. 2022.

    Examples
    --------
    >>> honest = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> InnerProductManipulation(epsilon=0.5)(honest, 1)
    tensor([[-1.0000, -1.5000]])
    """

    name = "ipm"

    def __init__(self, epsilon: float = 0.1) -> None:
        self.epsilon = check_float("epsilon", epsilon, minimum=0.0)

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = check_honest(honest, f)
        return tile(-self.epsilon * honest.mean(dim=0), f)
