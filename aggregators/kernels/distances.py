"""Gram matrices and pairwise distances of an ``[n, d]`` stack in one pass.

Distance-based rules (Krum, Multi-Krum, Bulyan, NNM) and the rules that iterate in
the span of the inputs (geometric median, centered clipping, Flag Aggregator) need
only inner products between rows, i.e. the ``[n, n]`` Gram matrix. It costs one
float32 GEMM, ``2 n^2 d`` flops at BLAS speed, instead of the ``n^2 / 2`` separate
passes over ``d`` of pairwise ``(x_i - x_j).norm()`` loops (Flower's and the
reference implementations). Squared distances follow from
``||x_i - x_j||^2 = G_ii + G_jj - 2 G_ij``.

That identity cancels catastrophically when the rows share a large common
component (honest updates close to each other relative to their norms): a float32
GEMM over a block of columns loses ~``1e-6 * ||x_i||^2``. The centered
form subtracts the column mean of each block before the GEMM (distances are
invariant to translating every row by the same vector) and so loses that fraction
of ``||x_i - c||^2`` instead; it costs two more passes over each block.
:func:`accurate_gram` takes the plain GEMM (the memory-bound floor) and redoes it
centered only when some pair of rows is too close for it to be accurate. Block
products are always accumulated in float64.
"""

from __future__ import annotations

import torch

# Plain Gram is kept when every pair satisfies
# ||x_i - x_j||^2 >= _MIN_SEPARATION * (||x_i||^2 + ||x_j||^2): then the GEMM's
# ~1e-6 relative rounding is at most ~1e-4 of any distance.
_MIN_SEPARATION = 1e-2

# Columns per GEMM: few large GEMMs (4 for d = 1e6). Each GEMM is one OpenMP
# region, and every region stalls at its barrier when another process holds a
# core: on the shared 2-core machine 31 blocks of 32768 columns took 0.93 s
# against 0.23-0.26 s for 1-4 GEMMs. MKL's blocked float32 accumulation keeps the
# error of a 262144-column block at ~2e-7 of the row norms (measured against
# float64 on Gaussian data); blocks are summed in float64.
_BLOCK_COLS = 1 << 18


def gram(
    x: torch.Tensor, center: bool = True, extra: torch.Tensor | None = None
) -> torch.Tensor:
    """Gram matrix of the rows of ``x`` (and ``extra``), optionally centered.

    Parameters
    ----------
    x : torch.Tensor
        ``[n, d]`` floating-point stack.
    extra : torch.Tensor, optional
        ``[k, d]`` more rows (e.g. a reference point), appended block by block so
        the ``[n + k, d]`` stack is never materialised.
    center : bool
        Subtract the mean row before taking inner products. The result then holds
        ``<x_i - c, x_j - c>`` for the mean row ``c``: pairwise distances and inner
        products of affine combinations (coefficients summing to 1) of rows
        relative to each other are unchanged, and more accurate.

    Returns
    -------
    torch.Tensor
        ``[n + k, n + k]`` float64, symmetric; the mean row ``c`` is that of all
        ``n + k`` rows.
    """
    n, d = x.shape
    k = 0 if extra is None else extra.shape[0]
    out = torch.zeros(n + k, n + k, dtype=torch.float64, device=x.device)
    if extra is not None and not center:
        # No copy of the stack: [x; e] [x; e]^T from x x^T, x e^T and e e^T.
        e = extra.to(x.dtype)
        out[:n, :n] = gram(x, center=False)
        cross = torch.zeros(n, k, dtype=torch.float64, device=x.device)
        for s0 in range(0, d, _BLOCK_COLS):
            cross += (
                x[:, s0 : s0 + _BLOCK_COLS] @ e[:, s0 : s0 + _BLOCK_COLS].T
            ).double()
        out[:n, n:] = cross
        out[n:, :n] = cross.T
        out[n:, n:] = e.double() @ e.double().T
        return out
    for s0 in range(0, d, _BLOCK_COLS):
        block = x[:, s0 : s0 + _BLOCK_COLS]
        if extra is not None:
            block = torch.cat([block, extra[:, s0 : s0 + _BLOCK_COLS].to(x.dtype)])
        if center:
            block = block - block.mean(dim=0, keepdim=True)
        out += (block @ block.T).to(torch.float64)
    # GEMM rounding leaves the two triangles unequal in the last bit.
    return 0.5 * (out + out.T)


def sq_distances_from_gram(g: torch.Tensor) -> torch.Tensor:
    """``||x_i - x_j||^2`` ``[n, n]`` from a Gram matrix ``g`` ``[n, n]``.

    Clamped at 0 (rounding can make a tiny distance negative) with an exact zero
    diagonal.
    """
    diag = torch.diagonal(g)
    d2 = (diag[:, None] + diag[None, :] - 2.0 * g).clamp_min_(0.0)
    d2.fill_diagonal_(0.0)
    return d2


def well_separated(g: torch.Tensor) -> bool:
    """Whether an uncentered Gram matrix ``[n, n]`` gives accurate distances."""
    n = g.shape[0]
    if n < 2:
        return True
    diag = torch.diagonal(g)
    scale = diag[:, None] + diag[None, :]
    d2 = sq_distances_from_gram(g)
    off = ~torch.eye(n, dtype=torch.bool)
    return bool((d2[off] >= _MIN_SEPARATION * scale[off]).all())


def accurate_gram(x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
    """Gram matrix ``[n + k, n + k]`` (float64) good for distances between rows.

    The plain GEMM when the rows are well separated (:func:`well_separated`),
    else the centered one. Inner products of *affine* combinations of rows (and
    distances) are the same for both; raw inner products are not, so use
    :func:`gram` with ``center=False`` when those are needed.
    """
    g = gram(x, center=False, extra=extra)
    return g if well_separated(g) else gram(x, center=True, extra=extra)


def pairwise_sq_distances(x: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances between the rows of ``x`` ``[n, d]`` -> ``[n, n]``
    (float64), from :func:`accurate_gram`."""
    return sq_distances_from_gram(accurate_gram(x))


def combination_sq_distances(g: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """``||x_i - v||^2`` ``[n]`` for ``v = coef @ X`` with ``sum(coef) == 1``.

    ``g`` is the (centered) Gram matrix ``[n, n]``, ``coef`` ``[n]`` float64.
    Because ``v`` is an affine combination of the rows, centering does not change
    the answer: ``||x_i - v||^2 = G_ii - 2 (G c)_i + c^T G c``.
    """
    gc = g @ coef
    return (torch.diagonal(g) - 2.0 * gc + coef @ gc).clamp_min(0.0)
