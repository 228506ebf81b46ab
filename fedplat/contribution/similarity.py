"""Cheap, utility-free scores: cosine similarity of each update to a reference.

The reference is the round's robust aggregate (what the aggregator kept), or the
coordinate-wise median of the updates when none is given. A label-flipper's update
points away from it; a random update is orthogonal to it; a zero update has no
direction at all (its cosine is defined as 0 here, and flagged separately).
"""

from __future__ import annotations

import torch


def coordinate_median(updates: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median ``[d]`` of ``updates [n, d]`` (lower median)."""
    if updates.dim() != 2 or updates.shape[0] == 0:
        raise ValueError(f"updates must be [n >= 1, d], got {list(updates.shape)}")
    return updates.median(dim=0).values


def cosine_to_reference(updates: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every row of ``updates`` to ``reference``.

    Parameters
    ----------
    updates
        ``[n, d]`` client updates.
    reference
        ``[d]`` reference direction (robust aggregate or median).

    Returns
    -------
    torch.Tensor
        ``[n]`` float64 in ``[-1, 1]``; 0 for a zero row or a zero reference.
    """
    if updates.dim() != 2 or reference.shape != (updates.shape[1],):
        raise ValueError(
            f"updates [n, d] and reference [d] expected, got "
            f"{list(updates.shape)} and {list(reference.shape)}"
        )
    ref = reference.double()
    # float64 per row (a loop over clients, not coordinates): d can be millions,
    # and a float64 copy of the whole [n, d] stack could be too big to hold.
    dots = torch.empty(updates.shape[0], dtype=torch.float64)
    norms = torch.empty_like(dots)
    for i, row in enumerate(updates):
        r = row.double()
        dots[i] = r @ ref
        norms[i] = torch.linalg.vector_norm(r)
    denom = norms * float(torch.linalg.vector_norm(ref))
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.where(denom > 0, dots / safe, torch.zeros_like(dots))
    return out.clamp_(-1.0, 1.0)


def cosine_to_others(updates: torch.Tensor) -> torch.Tensor:
    """Cosine of every row to the sum of the *other* rows.

    A reference that includes the row itself (the mean, or a coordinate median
    that picks the row's own value wherever it sits mid-pack) is correlated
    with it even when the row is pure noise. Against the others' sum, a random
    row independent of them has a cosine of order ``1/sqrt(d)`` exactly, which
    is what the ``random-update`` flag tests.

    Parameters
    ----------
    updates
        ``[n, d]`` with ``n >= 2``.

    Returns
    -------
    torch.Tensor
        ``[n]`` float64; 0 where a row or its complement is zero.
    """
    if updates.dim() != 2 or updates.shape[0] < 2:
        raise ValueError(f"updates must be [n >= 2, d], got {list(updates.shape)}")
    total = torch.zeros(updates.shape[1], dtype=torch.float64)
    for row in updates:
        total += row.double()
    total_sq = float(total @ total)
    out = torch.zeros(updates.shape[0], dtype=torch.float64)
    for i, row in enumerate(updates):
        r = row.double()
        dot_total, own = float(r @ total), float(r @ r)
        # <u, S - u> and ||S - u||^2 from the shared sum: one pass per row.
        rest_sq = max(total_sq - 2 * dot_total + own, 0.0)
        if own > 0 and rest_sq > 0:
            out[i] = (dot_total - own) / (own**0.5 * rest_sq**0.5)
    return out.clamp_(-1.0, 1.0)
