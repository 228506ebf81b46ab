"""The Gaussian mechanism with an explicit, seeded generator.

Noise std is ``noise_multiplier * sensitivity``, the parametrisation Opacus's
accountants use: with L2 sensitivity ``clip_norm`` (one client added or removed
changes the released sum by at most ``clip_norm`` after clipping), a release with
``noise_multiplier`` sigma composes in the accountant as
``step(noise_multiplier=sigma, sample_rate=q)``.

Where to apply it:

* local DP: the client clips the vector it releases (e.g. its sketch ``R Δ``)
  to ``clip_norm`` and adds noise before sending (:func:`privatize`). Clipping
  the released vector itself makes the sensitivity exactly ``clip_norm``
  without relying on bounds of ``||R||`` (Song et al. 2023 bound it through the
  sketch-norm and Lipschitz constants instead). Under replace-one adjacency
  (any two updates of one client) the sensitivity is ``2 * clip_norm``: pass
  ``sensitivity_factor=2``.
* central DP: the coordinator clips each client's update, sums, adds noise of
  std ``noise_multiplier * clip_norm`` to the sum, and divides by the number
  of clients (:func:`noise_for_mean` does the last two steps on a mean).

The generator is explicit so runs are reproducible; in deployment seed it from
:func:`secure_seed` and keep the seed on the client, since anyone who knows it
can subtract the noise. (Floating-point Gaussian sampling is not hardened
against Mironov's 2012 precision attacks; this is a research platform.)
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from fedplat.privacy.accountant import AccountantKind, noise_multiplier_for
from fedplat.privacy.clipping import PrivacyError, clip_l2

__all__ = ["GaussianMechanism", "make_noise_generator", "secure_seed"]


def secure_seed() -> int:
    """A 64-bit seed from the OS's CSPRNG."""
    return secrets.randbits(64)


def make_noise_generator(seed: int) -> torch.Generator:
    """A CPU generator for DP noise, seeded explicitly."""
    if not 0 <= seed < 1 << 64:
        raise PrivacyError("seed must be in [0, 2^64)")
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


@dataclass(frozen=True)
class GaussianMechanism:
    """Clip to ``clip_norm`` and add ``N(0, (noise_multiplier * sensitivity)^2 I)``.

    Attributes
    ----------
    noise_multiplier : float
        Sigma in units of the sensitivity (what the accountant is told).
    clip_norm : float
        L2 bound of one contribution.
    sensitivity_factor : float
        1 for add/remove-one adjacency (Opacus's convention), 2 for replace-one.
    """

    noise_multiplier: float
    clip_norm: float
    sensitivity_factor: float = 1.0

    def __post_init__(self) -> None:
        sigma, clip = self.noise_multiplier, self.clip_norm
        if not 0.0 <= sigma < math.inf:
            raise PrivacyError(f"noise_multiplier must be finite, >= 0, got {sigma}")
        if not 0.0 < clip < math.inf:
            raise PrivacyError(f"clip_norm must be finite and > 0, got {clip}")
        if self.sensitivity_factor not in (1.0, 2.0):
            raise PrivacyError(
                "sensitivity_factor must be 1 (add/remove) or 2 (replace)"
            )

    @classmethod
    def calibrated(
        cls,
        *,
        epsilon: float,
        delta: float,
        steps: int,
        sample_rate: float,
        clip_norm: float,
        sensitivity_factor: float = 1.0,
        accountant: AccountantKind = "rdp",
    ) -> GaussianMechanism:
        """The mechanism whose ``steps`` compositions spend ``(epsilon, delta)``.

        Sigma comes from :func:`fedplat.privacy.accountant.noise_multiplier_for`
        (the accountant library's own calibration).
        """
        sigma = noise_multiplier_for(
            epsilon, delta, steps, sample_rate, accountant=accountant
        )
        return cls(sigma, clip_norm, sensitivity_factor)

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of one clipped contribution."""
        return self.clip_norm * self.sensitivity_factor

    @property
    def std(self) -> float:
        """Standard deviation of each noise coordinate."""
        return self.noise_multiplier * self.sensitivity

    def noise(
        self, d: int, *, generator: torch.Generator, scale: float = 1.0
    ) -> torch.Tensor:
        """Fresh noise ``[d]`` with std ``scale * std``."""
        z = torch.randn(d, generator=generator, dtype=torch.float64)
        return (z * (self.std * scale)).to(torch.float32)

    def add_noise(
        self, vec: torch.Tensor, *, generator: torch.Generator, scale: float = 1.0
    ) -> torch.Tensor:
        """``vec`` ``[d]`` plus noise of std ``scale * std`` (no clipping)."""
        if vec.dim() != 1:
            raise PrivacyError(f"expected a flat [d] tensor, got {tuple(vec.shape)}")
        return vec.detach().to(torch.float32) + self.noise(
            vec.numel(), generator=generator, scale=scale
        )

    def privatize(
        self, vec: torch.Tensor, *, generator: torch.Generator
    ) -> torch.Tensor:
        """Clip ``vec`` ``[d]`` to ``clip_norm``, then add noise: one DP release."""
        return self.add_noise(clip_l2(vec, self.clip_norm).vector, generator=generator)

    def noise_for_mean(
        self, mean: torch.Tensor, num_clients: int, *, generator: torch.Generator
    ) -> torch.Tensor:
        """Central DP on an unweighted mean of ``num_clients`` clipped updates.

        Noise of std ``std`` on the sum equals noise of std ``std / n`` on the
        mean ``[d]``.
        """
        if num_clients < 1:
            raise PrivacyError("num_clients must be >= 1")
        return self.add_noise(mean, generator=generator, scale=1.0 / num_clients)
