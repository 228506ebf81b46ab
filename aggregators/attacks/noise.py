"""Attacks that send random vectors, independent of the honest updates."""

from __future__ import annotations

import torch
from fedplat.aggregators.attacks.base import (
    Attack,
    AttackError,
    check_float,
    check_honest,
    check_int,
)


class GaussianNoise(Attack):
    """Independent ``N(mu, sigma^2)`` vectors (ByzFL ``GaussianAttack``).

    Examples
    --------
    >>> honest = torch.zeros(3, 2)
    >>> GaussianNoise(mu=5.0, sigma=0.0)(honest, 2)
    tensor([[5., 5.],
            [5., 5.]])
    """

    name = "gaussian"

    def __init__(self, mu: float = 0.0, sigma: float = 1.0, seed: int = 0) -> None:
        self.mu = check_float("mu", mu)
        self.sigma = check_float("sigma", sigma, minimum=0.0)
        self.seed = check_int("seed", seed)
        self._gen = torch.Generator()
        self._gen.manual_seed(seed)

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = check_honest(honest, f)
        noise = torch.randn(f, honest.shape[1], generator=self._gen, dtype=honest.dtype)
        return (self.mu + self.sigma * noise).to(honest.device)


class RandomVectors(Attack):
    """Entries uniform in ``[low, high)``; ``[0, 1)`` is the ``random`` attack of the
    Flag Aggregator paper (its code: ``torch.rand``).

    Examples
    --------
    >>> out = RandomVectors(low=2.0, high=3.0)(torch.zeros(4, 5), 3)
    >>> out.shape, bool(((out >= 2) & (out < 3)).all())
    (torch.Size([3, 5]), True)
    """

    name = "random"

    def __init__(self, low: float = 0.0, high: float = 1.0, seed: int = 0) -> None:
        self.low = check_float("low", low)
        self.high = check_float("high", high)
        if not self.high > self.low:
            raise AttackError(f"need low < high, got low={low}, high={high}")
        self.seed = check_int("seed", seed)
        self._gen = torch.Generator()
        self._gen.manual_seed(seed)

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = check_honest(honest, f)
        u = torch.rand(f, honest.shape[1], generator=self._gen, dtype=honest.dtype)
        return (self.low + (self.high - self.low) * u).to(honest.device)
