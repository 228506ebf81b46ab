"""Reward shares: a budget split by cumulative non-negative contribution.

The rule (documented for participants in docs/contribution.md):

1. A client's cumulative contribution ``C_i`` is the sum over rounds of its
   primary per-round score (GTG-Shapley by default; Buyukates, He et al., arXiv
   2302.14031).
   Negative rounds count: a client that hurt the model in some rounds pays it
   back from its good rounds. A round in which the client is flagged as free-
   riding counts at most 0 (no work, no credit; the accountant applies this).
2. A client flagged as a free-rider (zero, replayed or random update) in at least
   ``strikes`` rounds is disqualified: its share is 0 whatever ``C_i``.
3. Everyone else gets ``share_i = max(C_i, 0) / sum_j max(C_j, 0)`` and
   ``reward_i = budget * share_i`` (negative totals are clipped to 0). When nobody
   has a positive ``C_i`` nothing is paid.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping


def reward_shares(
    cumulative: Mapping[str, float], disqualified: Collection[str] = ()
) -> dict[str, float]:
    """Each client's share of the budget (shares sum to 1, or all are 0).

    Parameters
    ----------
    cumulative
        Client id -> cumulative contribution ``C_i`` (finite).
    disqualified
        Client ids that get nothing (free-riders).

    Returns
    -------
    dict of str to float
        Client id -> share in ``[0, 1]``, for every client of ``cumulative``.
    """
    eligible = {
        cid: max(float(c), 0.0) if cid not in disqualified else 0.0
        for cid, c in cumulative.items()
    }
    for cid, c in eligible.items():
        if not math.isfinite(c):
            raise ValueError(f"cumulative contribution of {cid!r} is not finite")
    total = math.fsum(eligible.values())
    if total <= 0:
        return dict.fromkeys(eligible, 0.0)
    return {cid: c / total for cid, c in eligible.items()}
