"""User-level DP-FedAvg (McMahan, Ramage, Talwar & Zhang, ICLR 2018, Alg. 1).

Per round: clients are Poisson-sampled with rate ``q``
(:func:`fedplat.privacy.sampling.poisson_sample`); each sampled client's update
is clipped to L2 norm ``S``; the server sums the clipped updates, adds Gaussian
noise of std ``z S`` **once to the sum**, and divides by the *expected* number of
clients ``q N`` -- the paper's fixed-denominator estimator ``f_f``. With the
denominator fixed, adding or removing one user changes the released sum by at
most ``S``, so each round is one sampled Gaussian mechanism with noise
multiplier ``z`` and rate ``q`` for the accountant (dividing by the realised
count would make the denominator itself depend on who took part). The noise on
the average is ``z S / (q N)``: it shrinks with the number of clients per round,
which is why user-level DP needs many clients.

:class:`ClippedSum` is the intake's running sum (one row at a time, no ``[n, d]``
stack); under secure aggregation the clients clip and the server receives only
the sum and the count. :func:`dp_fedavg_release` turns a sum into the released
mean. Unweighted (every user's weight 1); the paper's capped weights
``w_k <= 1`` would bound the sensitivity the same way but are not offered here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedplat.privacy.clipping import Clipped, PrivacyError, clip_l2
from fedplat.privacy.gaussian import GaussianMechanism

__all__ = ["ClippedSum", "DPRelease", "dp_fedavg_release", "expected_clients"]


def expected_clients(num_clients: int, sample_rate: float) -> float:
    """``q N``: the fixed denominator of the estimator."""
    if num_clients < 1 or not 0.0 < sample_rate <= 1.0:
        raise PrivacyError("need num_clients >= 1 and sample_rate in (0, 1]")
    return sample_rate * num_clients


class ClippedSum:
    """Running sum of clipped updates ``[d]`` and the counts adaptive clipping needs.

    Parameters
    ----------
    d : int
        Update length.
    clip_norm : float
        ``S``; every added update is clipped to it.
    """

    def __init__(self, d: int, clip_norm: float) -> None:
        if d < 1:
            raise PrivacyError(f"d must be >= 1, got {d}")
        self.clip_norm = float(clip_norm)
        self.sum = torch.zeros(d, dtype=torch.float64)
        self.count = 0
        self.unclipped = 0  # updates with norm <= clip_norm (Andrew et al.'s b_i)

    def add(self, update: torch.Tensor) -> Clipped:
        """Clip ``update`` ``[d]`` to ``clip_norm`` and add it to the sum."""
        if update.shape != self.sum.shape:
            raise PrivacyError(
                f"expected an update [{self.sum.numel()}], got {tuple(update.shape)}"
            )
        c = clip_l2(update, self.clip_norm)
        self.sum.add_(c.vector.to(torch.float64))
        self.count += 1
        self.unclipped += int(c.norm <= self.clip_norm)
        return c


@dataclass(frozen=True)
class DPRelease:
    """One round's released aggregate.

    Attributes
    ----------
    mean : torch.Tensor
        float32 ``[d]``: ``(sum + noise) / denominator``.
    noise_std : float
        Std of the noise added to each coordinate of the sum (``z S``).
    denominator : float
        ``q N``.
    count : int
        Clients actually summed (bookkeeping only: not used by the estimator).
    """

    mean: torch.Tensor
    noise_std: float
    denominator: float
    count: int


def dp_fedavg_release(
    clipped_sum: torch.Tensor,
    count: int,
    *,
    expected: float,
    clip_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> DPRelease:
    """McMahan et al.'s ``f_f`` estimator with Gaussian noise on the sum.

    Parameters
    ----------
    clipped_sum : torch.Tensor
        ``[d]``: sum of ``count`` updates, each clipped to ``clip_norm``.
    count : int
        How many updates are in the sum (``>= 0``).
    expected : float
        ``q N`` (:func:`expected_clients`), fixed before the round.
    clip_norm : float
        ``S``.
    noise_multiplier : float
        ``z``; the accountant is told ``step(noise_multiplier=z, sample_rate=q)``.
    generator : torch.Generator
        The server's noise generator (seeded from ``secure_seed``).

    Returns
    -------
    DPRelease
    """
    if clipped_sum.dim() != 1:
        raise PrivacyError(f"expected a flat [d] sum, got {tuple(clipped_sum.shape)}")
    if count < 0 or not 0.0 < expected < math.inf:
        raise PrivacyError("need count >= 0 and a finite expected count > 0")
    mech = GaussianMechanism(noise_multiplier, clip_norm)
    noisy = clipped_sum.detach().to(torch.float64) + mech.noise(
        clipped_sum.numel(), generator=generator
    ).to(torch.float64)
    return DPRelease(
        (noisy / expected).to(torch.float32), mech.std, float(expected), count
    )
