"""Byzantine attacks, for evaluation only.

An attack is a callable ``attack(honest [h, d], f) -> byzantine [f, d]``: it sees
the honest updates of the round (the usual omniscient threat model) and returns
what the ``f`` Byzantine clients send. Any attack can thus be pitted against any
rule in a test or benchmark. Attacks with randomness own a seeded generator.

The data-level label-flipping client is not a vector attack: its clients train
honestly on :func:`flip_labels` applied to their labels.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from fedplat.aggregators.base import check_float as _check_float
from fedplat.aggregators.base import check_int as _check_int

from fedplat.registry import Registry


class AttackError(ValueError):
    """Invalid attack settings or inputs."""


def check_int(name: str, value: Any, *, minimum: int = 0) -> int:
    return _check_int(name, value, minimum=minimum, error=AttackError)


def check_float(name: str, value: Any, *, minimum: float | None = None) -> float:
    return _check_float(name, value, minimum=minimum, error=AttackError)


def _check_honest(honest: torch.Tensor, f: Any, need: int = 1) -> int:
    if honest.dim() != 2:
        raise AttackError(f"honest must be [h, d], got shape {list(honest.shape)}")
    if honest.shape[0] < need:
        raise AttackError(
            f"attack needs at least {need} honest vector(s), got {honest.shape[0]}"
        )
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        raise AttackError(f"f must be a non-negative int, got {f!r}")
    return f


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


def _tile(vector: torch.Tensor, f: int) -> torch.Tensor:
    return vector.unsqueeze(0).expand(f, -1).clone()


class SignFlipping(Attack):
    """Send ``-scale`` times the honest mean (ByzFL ``SignFlipping``, Allen-Zhu et
    al. 2020); ``scale = 1`` by default."""

    name = "sign_flip"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = check_float("scale", scale, minimum=0.0)

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = _check_honest(honest, f)
        return _tile(-self.scale * honest.mean(dim=0), f)


class GaussianNoise(Attack):
    """Independent ``N(mu, sigma^2)`` vectors (ByzFL ``GaussianAttack``)."""

    name = "gaussian"

    def __init__(self, mu: float = 0.0, sigma: float = 1.0, seed: int = 0) -> None:
        self.mu = check_float("mu", mu)
        self.sigma = check_float("sigma", sigma, minimum=0.0)
        self.seed = check_int("seed", seed)
        self._gen = torch.Generator()
        self._gen.manual_seed(seed)

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = _check_honest(honest, f)
        noise = torch.randn(f, honest.shape[1], generator=self._gen, dtype=honest.dtype)
        return (self.mu + self.sigma * noise).to(honest.device)


class RandomVectors(Attack):
    """Entries uniform in ``[low, high)``; ``[0, 1)`` is the ``random`` attack of the
    Flag Aggregator paper (its code: ``torch.rand``)."""

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
        f = _check_honest(honest, f)
        u = torch.rand(f, honest.shape[1], generator=self._gen, dtype=honest.dtype)
        return (self.low + (self.high - self.low) * u).to(honest.device)


def alie_z(n: int, f: int, among_honest: bool = False) -> float:
    """``z_max`` of "A little is enough" (Baruch, Baruch & Goldberg, NeurIPS 2019,
    Sec. 3): ``s = floor(n/2 + 1) - f`` supporters are needed, and ``z`` is the
    largest value with ``Phi(z) < (n - s) / n``, i.e. ``Phi^-1((n - s) / n)``.
    ``n`` counts all clients (honest and Byzantine).

    ``among_honest=True`` uses ``(h - s) / h`` with ``h = n - f`` instead, as the
    code of Karimireddy et al. 2022 does (``attacks/alittle.py``); for n = 25,
    f = 5 that gives z = 0.25 instead of the paper's 0.47."""
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
    """

    name = "alie"

    def __init__(self, z: float | None = None, among_honest: bool = False) -> None:
        self.z = None if z is None else check_float("z", z)
        if not isinstance(among_honest, bool):
            raise AttackError(f"among_honest must be a bool, got {among_honest!r}")
        self.among_honest = among_honest

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = _check_honest(honest, f, need=2)
        n = honest.shape[0] + f
        z = alie_z(n, f, self.among_honest) if self.z is None else self.z
        mu = honest.mean(dim=0)
        sigma = honest.std(dim=0)
        return _tile(mu - z * sigma, f)


class InnerProductManipulation(Attack):
    """IPM: ``-epsilon`` times the honest mean (Xie, Koyejo & Gupta, UAI 2020,
    "Fall of empires"); ``epsilon = 0.1`` as in Karimireddy et al. 2022."""

    name = "ipm"

    def __init__(self, epsilon: float = 0.1) -> None:
        self.epsilon = check_float("epsilon", epsilon, minimum=0.0)

    def __call__(self, honest: torch.Tensor, f: int) -> torch.Tensor:
        f = _check_honest(honest, f)
        return _tile(-self.epsilon * honest.mean(dim=0), f)


class Mimic(Attack):
    """Mimic (Karimireddy, He & Jaggi, ICLR 2022, Sec. 3): every Byzantine client
    sends a copy of one honest client's update, over-representing it.

    With ``target`` set, that honest client (index into ``honest``) is copied.
    Otherwise the client is chosen as in the authors' ``MimicVariantAttacker``:
    during the first ``warmup`` calls a direction ``z`` of maximal variance of the
    honest updates is tracked (one power-iteration step per call from a seeded
    random start) and the honest update with the largest ``<x_i, z>`` is copied;
    after the warmup that client stays the target. Stateful, so one instance per
    simulated run.
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
        f = _check_honest(honest, f)
        h = honest.shape[0]
        if self.target is not None:
            if self.target >= h:
                raise AttackError(f"mimic target {self.target} out of range for h={h}")
            return _tile(honest[self.target], f)
        if self._t < self.warmup:
            self._chosen = self._track(honest)
        self._t += 1
        assert self._chosen is not None
        return _tile(honest[min(self._chosen, h - 1)], f)


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Label-flipping data attack: ``y -> num_classes - 1 - y`` (Karimireddy et al.
    2022, ``attacks/labelflipping.py``; Allen-Zhu et al. 2020).

    ``y`` is an integer tensor of labels in ``[0, num_classes)``.
    """
    check_int("num_classes", num_classes, minimum=1)
    if y.is_floating_point() or y.is_complex():
        raise AttackError(f"labels must be integers, got {y.dtype}")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise AttackError(f"labels must lie in [0, {num_classes})")
    return num_classes - 1 - y


_ATTACKS: Registry[Attack] = Registry("attack", error=AttackError)


def register_attack(name: str, factory: Any) -> None:
    """Add an attack under ``name``; duplicates are errors."""
    _ATTACKS.register(name, factory)


def available_attacks() -> list[str]:
    return _ATTACKS.available()


def create_attack(name: str, **params: Any) -> Attack:
    """Build a registered attack; unknown names and parameters are errors."""
    return _ATTACKS.create(name, **params)


for _cls in (
    SignFlipping,
    GaussianNoise,
    RandomVectors,
    ALittleIsEnough,
    InnerProductManipulation,
    Mimic,
):
    register_attack(_cls.name, _cls)
