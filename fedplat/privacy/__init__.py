"""Differential privacy: clipping, the Gaussian mechanism, Opacus accounting,
Poisson sampling, DP-FedAvg, adaptive clipping and sketch-space noise."""

from fedplat.privacy.accountant import (
    RDP_ALPHAS,
    AccountantKind,
    PrivacyAccountant,
    noise_multiplier_for,
)
from fedplat.privacy.adaptive import AdaptiveClip, adaptive_noise_multiplier
from fedplat.privacy.budget import PrivacyBudget, PrivacyBudgetExceeded, RoundPrivacy
from fedplat.privacy.clipping import (
    Clipped,
    ClippedRows,
    PrivacyError,
    clip_l2,
    clip_rows,
)
from fedplat.privacy.dpfedavg import (
    ClippedSum,
    DPRelease,
    dp_fedavg_release,
    expected_clients,
)
from fedplat.privacy.gaussian import (
    GaussianMechanism,
    make_noise_generator,
    secure_seed,
)
from fedplat.privacy.local import privatize_payload
from fedplat.privacy.sampling import poisson_sample
from fedplat.privacy.sketched import (
    count_sketch_norm_bound,
    dp_sketch_release,
    noise_sketch_sum,
)

__all__ = [
    "RDP_ALPHAS",
    "AccountantKind",
    "AdaptiveClip",
    "Clipped",
    "ClippedRows",
    "ClippedSum",
    "DPRelease",
    "GaussianMechanism",
    "PrivacyAccountant",
    "PrivacyBudget",
    "PrivacyBudgetExceeded",
    "PrivacyError",
    "RoundPrivacy",
    "adaptive_noise_multiplier",
    "clip_l2",
    "clip_rows",
    "count_sketch_norm_bound",
    "dp_fedavg_release",
    "dp_sketch_release",
    "expected_clients",
    "make_noise_generator",
    "noise_multiplier_for",
    "noise_sketch_sum",
    "poisson_sample",
    "privatize_payload",
    "secure_seed",
]
