"""Mimic (Karimireddy, He & Jaggi, ICLR 2022, Sec. 3): every Byzantine client
sends a copy of one honest client's update, over-representing it."""

from __future__ import annotations

import torch
from fedplat.aggregators.attacks.base import (
    Attack,
    AttackError,
    check_honest,
    check_int,
    tile,
)


class Mimic(Attack):
    """Copy one honest client's update ``f`` times.

    With ``target`` set, that honest client (index into ``honest``) is copied.
    Otherwise the client is chosen as in the authors' ``MimicVariantAttacker``:
    during the first ``warmup`` calls a direction ``z`` of maximal variance of the
    honest updates is tracked (one power-iteration step per call from a seeded
    random start) and the honest update with the largest ``<x_i, z>`` is copied;
    after the warmup that client stays the target. Stateful, so one instance per
    simulated run.

    Examples
    --------
    >>> honest = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    >>> Mimic(target=1)(honest, 2)
    tensor([[3., 4.],
            [3., 4.]])
    """

    name = "mimic"

    def __init__(
        self, target: int | None = None, warmup: int = 1, seed: int = 0
    ) -> None:
        self.target = None if target is None else check_int("target", target)
        self.warmup = check_int("warmup", warmup, minimum=1)
        self.seed = check_int("seed", seed)
        self._t = 0
        self._mu: torch.Tensor | None = None
        self._z: torch.Tensor | None = None
        self._chosen: int | None = None

    def _track(self, honest: torch.Tensor) -> int:
        x = honest.to(torch.float64)
        avg = x.mean(dim=0)
        t = self._t
        if self._mu is None or self._z is None:
            gen = torch.Generator()
            gen.manual_seed(self.seed)
            self._mu = avg
            z = torch.randn(x.shape[1], generator=gen, dtype=torch.float64)
        else:
            self._mu = t / (1 + t) * self._mu + avg / (1 + t)
            z = self._z
        centered = x - self._mu
        cumu = (centered @ z) @ centered  # one power-iteration step
        cumu = cumu / cumu.norm().clamp_min(1e-300)
        z = cumu if self._z is None else t / (1 + t) * self._z + cumu / (1 + t)
        self._z = z / z.norm().clamp_min(1e-300)
        return int(torch.argmax(x @ self._z))

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = check_honest(honest, f)
        h = honest.shape[0]
        if self.target is not None:
            if self.target >= h:
                raise AttackError(f"mimic target {self.target} out of range for h={h}")
            return tile(honest[self.target], f)
        if self._t < self.warmup:
            self._chosen = self._track(honest)
        self._t += 1
        assert self._chosen is not None
        return tile(honest[min(self._chosen, h - 1)], f)
