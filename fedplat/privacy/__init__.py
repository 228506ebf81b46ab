"""Differential privacy: L2 clipping, the Gaussian mechanism, Opacus accounting."""

from fedplat.privacy.accountant import (
    RDP_ALPHAS,
    AccountantKind,
    PrivacyAccountant,
    noise_multiplier_for,
)
from fedplat.privacy.clipping import (
    Clipped,
    ClippedRows,
    PrivacyError,
    clip_l2,
    clip_rows,
)
from fedplat.privacy.gaussian import (
    GaussianMechanism,
    make_noise_generator,
    secure_seed,
)
from fedplat.privacy.local import privatize_payload

__all__ = [
    "RDP_ALPHAS",
    "AccountantKind",
    "Clipped",
    "ClippedRows",
    "GaussianMechanism",
    "PrivacyAccountant",
    "PrivacyError",
    "clip_l2",
    "clip_rows",
    "make_noise_generator",
    "noise_multiplier_for",
    "privatize_payload",
    "secure_seed",
]
