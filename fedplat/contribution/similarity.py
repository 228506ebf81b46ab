"""Cheap, utility-free scores: cosine similarity of each update to a reference.

The reference is the round's robust aggregate (what the aggregator kept), or the
coordinate-wise median of the updates when none is given (the robust rule's own,
:func:`fedplat.aggregators.coordinatewise.coordinate_median`). A label-flipper's update
points away from it; a random update is orthogonal to it; a zero update has no
direction at all (its cosine is defined as 0 here, and flagged separately).
"""

from __future__ import annotations

import torch


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


def max_abs_cosine_to_others(updates: torch.Tensor) -> torch.Tensor:
    """For every row, the largest ``|cos|`` with any *other* non-zero row.

    A row of noise independent of the others is nearly orthogonal to each of
    them (``|cos| ~ 1/sqrt(d)``); an honest update shares directions with at
    least some other honest updates, even on non-IID data, and even when
    attackers' updates pull the others' sum sideways (which makes a cosine to a
    sum, or to a reference that includes the row itself, unreliable).

    Parameters
    ----------
    updates
        ``[n, d]``.

    Returns
    -------
    torch.Tensor
        ``[n]`` float64 in ``[0, 1]``; 0 for a zero row or when no other row is
        non-zero.
    """
    if updates.dim() != 2:
        raise ValueError(f"updates must be [n, d], got {list(updates.shape)}")
    # One [n, n] Gram matrix (BLAS); float32 accumulation is ~1e-4 relative,
    # far below the ~1/sqrt(d) cosines this separates.
    gram = (updates @ updates.T).double()
    norms = gram.diagonal().clamp(min=0).sqrt()
    denom = norms[:, None] * norms[None, :]
    cos = torch.where(denom > 0, gram / denom.clamp(min=1e-300), torch.zeros_like(gram))
    cos.fill_diagonal_(0.0)
    return cos.abs().clamp_(max=1.0).max(dim=1).values
