"""Leave-one-out contribution: what the round loses without each client.

``LOO_i = U(N) - U(N \\ {i})`` (Cook, 1977 in statistics; a standard data-valuation
baseline). It costs ``n`` utility evaluations per round, but it undervalues
clients whose updates are redundant with others' (two identical honest clients
both get ~0), which is why GTG-Shapley is the default primary score.
"""

from __future__ import annotations

import torch

from fedplat.contribution.shapley import SubsetValue


def leave_one_out(value: SubsetValue, n: int, full_value: float) -> torch.Tensor:
    """Leave-one-out values of the round's ``n`` clients.

    Parameters
    ----------
    value
        ``U(S)``; ``value([])`` is ``U(∅)`` (used when ``n == 1``).
    n
        Number of clients, ``>= 1``.
    full_value
        ``U(N)``.

    Returns
    -------
    torch.Tensor
        ``[n]`` float64, ``U(N) - U(N \\ {i})``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    everyone = range(n)
    return torch.tensor(
        [full_value - float(value([j for j in everyone if j != i])) for i in everyone],
        dtype=torch.float64,
    )
