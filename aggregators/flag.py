"""Flag Aggregator (Almasi, Mishra, Kharel, Patel & Ravi, ICLR 2024, "Flag
Aggregator: scalable distributed training under failures and augmented losses
using convex optimization").

Follows the authors' code (hamidralmasi/FlagAggregator, ``aggregators/flag.py`` and
``aggregators/center_algorithms_torch.py``: ``irls_flag``, ``flag_mean_iteration``,
``calc_error_1_2``):

1. Normalise every row: ``g_i / ||g_i||`` (``F.normalize``: a zero row stays zero).
2. ``Y0 = QR(rand(d, m) - 0.5)`` with ``torch.manual_seed(seed)``, seed 1.
3. IRLS for the flag median (objective ``sum_i sqrt(1 - ||Y^T g_i||^2)``, the sines
   of the angles between each direction and the subspace, clamped at 0), one
   iteration in the reference (``n_its = 1``): weights
   ``w_i = (|1 - ||Y^T g_i||^2| + 1e-7)^(-1/4)``; with ``lam > 0`` one more column
   per ordered pair ``i != j``,
   ``lam / (p (p - 1)) * (|1 - ||Y^T (g_i - g_j)||^2| + 1e-7)^(-1/4) (g_i - g_j)``;
   the new ``Y`` is the top-``m`` left singular vectors of the weighted columns,
   kept only if the objective decreased (``irls_flag`` returns the previous ``Y``
   otherwise).
4. Output ``(1 / m) sum_i Y Y^T g_i`` (the reference computes the plain average too
   but returns this). The CSV side-writes of the reference are dropped.

Computed without any ``[d, p]`` or ``[d, p^2]`` matrix: every column lies in the
span of the normalised rows, so the SVD is done on a small ``[r, K]`` matrix
expressed in an orthonormal basis of that span obtained from the ``[n, n]`` Gram
matrix (same left singular subspace; the reference's extra singular vectors for
zero singular values are orthogonal to every ``g_i`` and contribute nothing to the
output or the objective). ``Q`` of the initial QR is obtained as
``raw @ inv(chol(raw^T raw))`` (same ``Y Y^T``; column signs do not matter) to avoid
a Householder QR of a ``[d, m]`` matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from fedplat.aggregators.base import (
    AggregationError,
    RowReport,
    Rule,
    RuleOutput,
    check_float,
    check_int,
)
from fedplat.aggregators.kernels.distances import gram

_RESCALE = ("paper", "median_norm")
# irls_flag stops when the objective change or the objective itself is below this.
_STOP = 1e-10


def flag_objective(proj: torch.Tensor) -> torch.Tensor:
    """``sum_i sqrt(max(0, 1 - ||P[:, i]||^2))`` for projections ``P`` ``[k, n]``
    (``calc_error_1_2(..., 'sine')`` of the reference)."""
    return (1.0 - (proj * proj).sum(dim=0)).clamp_min(0.0).sqrt().sum()


@dataclass(frozen=True)
class _Initial:
    """``Y0 = basis @ mix`` (``basis`` ``[d, k]`` in the input dtype)."""

    basis: torch.Tensor
    mix: torch.Tensor  # [k, k0] float64
    proj: torch.Tensor  # [k0, n] float64, Y0^T g_hat


def _initial_subspace(
    updates: torch.Tensor, inv_norm: torch.Tensor, m: int, seed: int
) -> _Initial:
    d = updates.shape[1]
    gen = torch.Generator(device=updates.device)
    gen.manual_seed(seed)
    # Same stream as the reference's torch.manual_seed(seed); torch.rand(d, m).
    raw = torch.rand(d, m, generator=gen, device=updates.device) - 0.5
    if d >= 4 * m:
        # raw = Q R  =>  Q = raw R^-1 with R = chol(raw^T raw)^T; one [m, d] x
        # [d, m + n] product instead of a QR over d rows.
        rtr = raw.T.double() @ raw.double()
        r_upper = torch.linalg.cholesky(rtr, upper=True)
        mix = torch.linalg.solve_triangular(
            r_upper, torch.eye(m, dtype=torch.float64, device=raw.device), upper=True
        )
        cross = (updates @ raw.to(updates.dtype)).T.double()  # [m, n] raw^T X^T
        proj = mix.T @ cross * inv_norm[None, :]
        return _Initial(raw.to(updates.dtype), mix, proj)
    # Tiny d (tests): Q has min(d, m) columns, exactly as torch.qr in the reference.
    q = torch.linalg.qr(raw.double()).Q
    proj = (updates.double() @ q).T * inv_norm[None, :]
    eye = torch.eye(q.shape[1], dtype=torch.float64, device=q.device)
    return _Initial(q.to(updates.dtype), eye, proj)


class FlagAggregator(Rule):
    """Flag Aggregator (FA): the flag median subspace of the normalised updates.

    Parameters
    ----------
    m : int
        Subspace dimension (``r_col`` in the reference; default 8, its default).
    lam : float
        Weight of the pairwise term (``lambda_``; default 0, as in the paper's main
        runs).
    seed : int
        Seed of the random initial subspace (the reference hard-codes 1).
    iterations : int
        IRLS iterations (the reference hard-codes 1).
    eps : float
        Regulariser of the IRLS weights (reference: 1e-7).
    rescale : {"paper", "median_norm"}
        ``"paper"`` returns ``(1/m) sum_i Y Y^T g_i`` exactly; its norm is set by
        ``n/m``, not by the updates. ``"median_norm"`` (our addition, for model
        deltas whose scale matters) returns ``(median_i ||g_i|| / n) sum_i Y Y^T
        g_i``: the average projected direction at the median update norm.

    Client weights are not used (the reference has none). Decisions: ``score`` is
    ``||Y^T g_i||^2``, the share of the client's direction inside the subspace
    (the reference logs it as ``values``), ``weight`` that score normalised to sum
    to 1; ``"down-weighted"`` below half the average.

    Examples
    --------
    Three orthogonal rows and ``m = 3``: the subspace holds every direction, so
    the output is ``(1/m)`` times the sum of the unit rows:

    >>> x = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 4.0]])
    >>> FlagAggregator(m=3)(x).aggregate
    tensor([0.3333, 0.3333, 0.3333])
    """

    name = "flag"

    def __init__(
        self,
        m: int = 8,
        lam: float = 0.0,
        seed: int = 1,
        iterations: int = 1,
        eps: float = 1e-7,
        rescale: str = "paper",
    ) -> None:
        self.m = check_int("m", m, minimum=1)
        self.lam = check_float("lam", lam, minimum=0.0)
        self.seed = check_int("seed", seed)
        self.iterations = check_int("iterations", iterations, minimum=1)
        self.eps = check_float("eps", eps, minimum=0.0, strict=True)
        if rescale not in _RESCALE:
            raise AggregationError(
                f"rescale must be one of {_RESCALE}, got {rescale!r}"
            )
        self.rescale = rescale

    def _columns(self, proj: torch.Tensor) -> torch.Tensor:
        """Coefficients ``C`` ``[n, K]`` of the IRLS columns over ``g_hat``
        (``flag_mean_iteration``), from projections ``proj = Y^T g_hat`` ``[k, n]``."""
        n = proj.shape[1]
        sq = (proj * proj).sum(dim=0)
        w = ((1.0 - sq).abs() + self.eps) ** -0.25
        cols = [torch.diag(w)]
        if self.lam > 0 and n > 1:
            i, j = torch.where(~torch.eye(n, dtype=torch.bool))  # ordered pairs i != j
            diff = proj[:, i] - proj[:, j]
            pw = ((1.0 - (diff * diff).sum(dim=0)).abs() + self.eps) ** -0.25
            pw = pw * self.lam / (n * (n - 1))
            pair = torch.zeros(n, i.numel(), dtype=torch.float64)
            k = torch.arange(i.numel())
            pair[i, k] = pw
            pair[j, k] = -pw
            cols.append(pair)
        return torch.cat(cols, dim=1)

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        n = updates.shape[0]
        g = gram(updates)
        norms = torch.diagonal(g).clamp_min(0.0).sqrt()
        inv = torch.where(
            norms > 0, 1.0 / norms.clamp_min(1e-300), torch.zeros_like(norms)
        )
        g_hat = inv[:, None] * g * inv[None, :]  # Gram of the normalised rows
        lam_all, vec_all = torch.linalg.eigh(g_hat)
        keep = lam_all > 1e-12 * float(lam_all.max().clamp_min(1e-300))
        lam_r, vec_r = lam_all[keep], vec_all[:, keep]  # orthonormal basis of the span

        init = _initial_subspace(updates, inv, self.m, self.seed)
        proj = init.proj  # Y^T g_hat, [k, n]
        span_coef: torch.Tensor | None = None  # Y = g_hat^T @ span_coef once updated
        err = float(flag_objective(proj))
        diff = 1.0
        for _ in range(self.iterations):
            if not (diff > _STOP and err > _STOP):
                break
            b = lam_r.sqrt()[:, None] * (vec_r.T @ self._columns(proj))  # [r, K]
            u_b = torch.linalg.svd(b, full_matrices=False).U
            k = min(self.m, u_b.shape[1])
            coef = vec_r @ (u_b[:, :k] / lam_r.sqrt()[:, None])  # [n, k]
            new_proj = coef.T @ g_hat
            new_err = float(flag_objective(new_proj))
            diff = err - new_err
            if diff > 0:  # irls_flag keeps the new Y only if the objective fell
                proj, span_coef, err = new_proj, coef, new_err
        total = proj.sum(dim=1)  # Y^T sum_i g_hat_i, [k]
        if span_coef is not None:
            coef_rows = (span_coef @ total) * inv  # over the raw rows
            direction_sum = coef_rows.to(updates.dtype) @ updates
        else:
            direction_sum = init.basis @ (init.mix @ total).to(updates.dtype)
        if self.rescale == "paper":
            agg = direction_sum / self.m
        else:
            agg = direction_sum * (float(torch.quantile(norms, 0.5)) / n)
        score = (proj * proj).sum(dim=0)
        total_score = float(score.sum())
        weight = (
            score / total_score if total_score > 0 else torch.full_like(score, 1 / n)
        )
        flags = {"down-weighted": weight < 0.5 / n}
        return RuleOutput(agg, RowReport(weight, score > 0, score, flags))
