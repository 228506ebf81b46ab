"""Per-client L2 clipping: bounds each contribution's sensitivity.

The 1e-6 guard in the scale follows ``torch.nn.utils.clip_grad_norm_`` and
Opacus's per-sample clipping: a vector already within the bound is returned
unchanged (scale exactly 1), one above it lands at norm ``<= max_norm``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Clipped", "ClippedRows", "clip_l2", "clip_rows"]


class PrivacyError(ValueError):
    """Bad privacy parameters or inputs."""


@dataclass(frozen=True)
class Clipped:
    """One clipped vector.

    Attributes
    ----------
    vector : torch.Tensor
        float32 ``[d]`` with ``||vector||_2 <= max_norm``.
    norm : float
        L2 norm before clipping.
    scale : float
        Factor applied (1.0 when no clipping was needed).
    """

    vector: torch.Tensor
    norm: float
    scale: float

    @property
    def clipped(self) -> bool:
        return self.scale < 1.0


@dataclass(frozen=True)
class ClippedRows:
    """Clipped client updates ``[n, d]`` with their norms ``[n]`` before clipping."""

    rows: torch.Tensor
    norms: torch.Tensor
    scales: torch.Tensor


def _check_norm(max_norm: float) -> None:
    if not max_norm > 0.0 or max_norm == float("inf"):
        raise PrivacyError(f"max_norm must be finite and > 0, got {max_norm}")


def clip_l2(vec: torch.Tensor, max_norm: float) -> Clipped:
    """Scale ``vec`` ``[d]`` down to L2 norm ``<= max_norm`` (never up)."""
    _check_norm(max_norm)
    if vec.dim() != 1 or not vec.is_floating_point():
        raise PrivacyError(f"expected a flat float [d] tensor, got {tuple(vec.shape)}")
    v = vec.detach().to(torch.float32)
    if not bool(torch.isfinite(v).all()):
        raise PrivacyError("cannot clip a vector with NaN or Inf")
    norm = float(torch.linalg.vector_norm(v, dtype=torch.float64))
    scale = min(1.0, max_norm / (norm + 1e-6))
    return Clipped(v * scale if scale < 1.0 else v.clone(), norm, scale)


def clip_rows(updates: torch.Tensor, max_norm: float) -> ClippedRows:
    """Clip each row of ``updates`` ``[n, d]`` to L2 norm ``<= max_norm``.

    Used for central DP at the coordinator: clip every client's update before
    summing, so one client changes the sum by at most ``max_norm``.
    """
    _check_norm(max_norm)
    if updates.dim() != 2 or not updates.is_floating_point():
        raise PrivacyError(f"expected [n, d] float updates, got {tuple(updates.shape)}")
    u = updates.detach().to(torch.float32)
    if not bool(torch.isfinite(u).all()):
        raise PrivacyError("cannot clip updates with NaN or Inf")
    norms = torch.linalg.vector_norm(u, dim=1, dtype=torch.float64)
    scales = torch.clamp(max_norm / (norms + 1e-6), max=1.0).to(torch.float32)
    return ClippedRows(u * scales[:, None], norms.to(torch.float32), scales)
