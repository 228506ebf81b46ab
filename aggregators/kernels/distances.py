"""Gram matrices and pairwise distances of an ``[n, d]`` stack in one pass.

Distance-based rules (Krum, Multi-Krum, Bulyan, NNM) and the rules that iterate in
the span of the inputs (geometric median, centered clipping, Flag Aggregator) need
only inner products between rows, i.e. the ``[n, n]`` Gram matrix. It costs one
float32 GEMM, ``2 n^2 d`` flops at BLAS speed, instead of the ``n^2 / 2`` separate
passes over ``d`` of pairwise ``(x_i - x_j).norm()`` loops (Flower's and the
reference implementations). Squared distances follow from
``||x_i - x_j||^2 = G_ii + G_jj - 2 G_ij``.

Accuracy. That identity cancels catastrophically when rows are close to each
other relative to their norms: a float32 GEMM over a block of columns loses
~``1e-6 * ||x_i||^2``. Distances are invariant to translating every row by the
same vector, so :func:`accurate_gram` first takes the plain GEMM (the
memory-bound floor) and, only when some pair of rows is too close for it, redoes
it with every row taken relative to an *origin row*: the row with the smallest
sum of squared distances to its ``(n - 1) // 2`` nearest rows, a point inside
the majority cluster. The error is then ~``1e-6 * ||x_i - x_origin||^2``.
Centering on the plain mean instead let one far row (``1e20``) drag the origin
with it and destroy every distance; the origin row cannot be moved by rows
outside the majority, and entries ``G_ij`` of two rows never depend on a third.

Range. A float32 product overflows for rows beyond ~``1e19`` and underflows for
rows below ~``1e-19`` (every squared distance of ``randn * 1e-25`` rows was 0, so
Krum picked row 0). Either way the GEMM is redone *before* the origin row is
chosen (choosing it from an overflowed Gram made every score ``inf`` and picked
row 0, even when row 0 was the attacker): first with every row multiplied by
the power of two that brings the largest entry to ``[0.5, 1)`` (one max-abs
reduction; exact, and divided out of the float64 result), and when the rows
span too many magnitudes for that, in float64, which holds the products of any
float32 rows. Powers of two commute with every rounding step, so scaling all
rows by ``2^k`` scales the result by ``4^k`` exactly on a given path. Only
float64 inputs beyond ~``1e150`` can still overflow; their distances become
``+inf`` (never NaN), so rules that compare distances rank them last, and when
even the majority's distances overflow or underflow float64 the rules refuse
(:class:`AggregationError`) instead of ranking garbage. Block products are
always accumulated in float64.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from fedplat.aggregators.base import AggregationError

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


def _work_dtype(x: torch.Tensor, wide: bool) -> torch.dtype:
    if wide:
        return torch.float64
    # Half-precision GEMMs overflow at 65504 and round at 1e-3.
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _gram_pass(
    x: torch.Tensor,
    extra: torch.Tensor | None,
    origin: torch.Tensor | None,
    dtype: torch.dtype,
    scale: float = 1.0,
) -> torch.Tensor:
    """``<y_i, y_j>`` for the rows ``y`` of ``scale * ([x; extra] - origin)``,
    blocks of columns in ``dtype``, accumulated in float64 (not symmetrised).

    ``scale`` is a power of two, so it is exact; the caller divides it out."""
    n, d = x.shape
    k = 0 if extra is None else extra.shape[0]
    out = torch.zeros(n + k, n + k, dtype=torch.float64, device=x.device)
    for s0 in range(0, d, _BLOCK_COLS):
        block = x[:, s0 : s0 + _BLOCK_COLS].to(dtype)
        more = None if extra is None else extra[:, s0 : s0 + _BLOCK_COLS].to(dtype)
        if origin is not None:
            shift = origin[s0 : s0 + _BLOCK_COLS].to(dtype)
            block = block - shift
            more = None if more is None else more - shift
        if scale != 1.0:
            # One block-sized copy at most: in place when a copy was made above.
            block = block.mul_(scale) if origin is not None else block * scale
            more = None if more is None else more * scale
        out[:n, :n] += (block @ block.T).to(torch.float64)
        if more is not None:
            # No copy of the stack: [x; e] [x; e]^T from x x^T, x e^T and e e^T.
            cross = (block @ more.T).to(torch.float64)
            out[:n, n:] += cross
            out[n:, :n] += cross.T
            out[n:, n:] += (more @ more.T).to(torch.float64)
    return out


def _unit_scale(x: torch.Tensor, extra: torch.Tensor | None) -> float:
    """The power of two that brings the largest ``|entry|`` of ``[x; extra]``
    into ``[0.5, 1)`` (1 for an all-zero stack): one max-abs reduction."""
    # aminmax is one vectorised pass (~3 ms for 2e7 floats); vector_norm(inf)
    # and abs().amax() took 40-50 ms.
    m = 0.0
    for t in (x,) if extra is None else (x, extra):
        lo, hi = torch.aminmax(t)
        m = max(m, -float(lo), float(hi))
    if m == 0.0 or not math.isfinite(m):
        return 1.0
    return math.ldexp(1.0, -math.frexp(m)[1])


class _Plan(NamedTuple):
    """How the products of a stack were taken: ``dtype`` and exact ``scale``."""

    dtype: torch.dtype
    scale: float


def _plain_gram(
    x: torch.Tensor, extra: torch.Tensor | None
) -> tuple[torch.Tensor, _Plan]:
    """Gram matrix around the coordinate origin (not symmetrised) and the plan
    that gave it in range: the input precision (half: float32), else the same
    with every row scaled by :func:`_unit_scale` (a float32 GEMM, ~4x faster
    than float64 at ``d = 1e6``), else float64, which holds the products of any
    float32 rows. The scale is divided out (exactly) of the result."""
    work = _work_dtype(x, False)
    g = _gram_pass(x, extra, None, work)
    if work == torch.float64 or not _out_of_range(x, extra, None, g, work):
        return g, _Plan(work, 1.0)
    scale = _unit_scale(x, extra)
    if scale != 1.0:
        g = _gram_pass(x, extra, None, work, scale)
        if not _out_of_range(x, extra, None, g, work):
            return g / scale**2, _Plan(work, scale)
    # Rows too far apart in magnitude for one float32 scale.
    return _gram_pass(x, extra, None, torch.float64), _Plan(torch.float64, 1.0)


def _centered_gram(
    x: torch.Tensor, extra: torch.Tensor | None, origin: torch.Tensor, plan: _Plan
) -> torch.Tensor:
    """Gram matrix around ``origin`` with the plain pass's plan (float64 if
    the shifted rows overflow it), not symmetrised."""
    g = _gram_pass(x, extra, origin, plan.dtype, plan.scale)
    if plan.dtype != torch.float64 and not bool(torch.isfinite(g).all()):
        return _gram_pass(x, extra, origin, torch.float64)
    return g / plan.scale**2


def gram(
    x: torch.Tensor,
    extra: torch.Tensor | None = None,
    origin: torch.Tensor | None = None,
    *,
    wide: bool = False,
) -> torch.Tensor:
    """Gram matrix of the rows of ``x`` (and ``extra``), relative to ``origin``.

    Parameters
    ----------
    x : torch.Tensor
        ``[n, d]`` floating-point stack.
    extra : torch.Tensor, optional
        ``[k, d]`` more rows (e.g. a reference point), handled block by block so
        the ``[n + k, d]`` stack is never materialised.
    origin : torch.Tensor, optional
        ``[d]``; the result holds ``<x_i - origin, x_j - origin>``. Distances and
        inner products of affine combinations of rows (coefficients summing to
        1) relative to each other do not depend on it.
    wide : bool
        Compute the products in float64 from the start (else only when the
        input dtype overflows or underflows; see the module docstring).

    Returns
    -------
    torch.Tensor
        ``[n + k, n + k]`` float64, symmetric.

    Examples
    --------
    >>> gram(torch.tensor([[1.0, 0.0], [3.0, 4.0]]))
    tensor([[ 1.,  3.],
            [ 3., 25.]], dtype=torch.float64)
    """
    if wide:
        return _symmetric(_gram_pass(x, extra, origin, torch.float64))
    if origin is None:
        return _symmetric(_plain_gram(x, extra)[0])
    plan = _Plan(_work_dtype(x, False), 1.0)
    return _symmetric(_centered_gram(x, extra, origin, plan))


def _out_of_range(
    x: torch.Tensor,
    extra: torch.Tensor | None,
    origin: torch.Tensor | None,
    g: torch.Tensor,
    dtype: torch.dtype,
) -> bool:
    """Whether ``g``, computed in ``dtype``, overflowed, or holds a nonzero row
    (around the coordinate origin) whose products underflowed.

    Underflow test: a row whose largest entry ``m`` has ``m * eps`` (the finest
    difference between such entries) square to below ``tiny`` loses digits in
    its distances. Its squared norm is at most ``d m^2``, so every such row has
    ``G_ii < d tiny / eps^2`` (``d 2^-80`` for float32, i.e. entries below
    ~``1e-12`` at ``d = 1e6``); only those rows are read again, to tell an exact
    zero row (common, and harmless) from an underflowed one. Around an
    ``origin`` only overflow is checked: the plain pass chose the dtype.
    """
    if not bool(torch.isfinite(g).all()):
        return True
    return origin is None and _underflows(x, extra, g, dtype)


def _underflows(
    x: torch.Tensor, extra: torch.Tensor | None, g: torch.Tensor, dtype: torch.dtype
) -> bool:
    """The underflow half of :func:`_out_of_range`."""
    info = torch.finfo(dtype)
    floor = x.shape[1] * info.tiny / info.eps**2
    small = (torch.diagonal(g) < floor).nonzero().flatten().tolist()
    n = x.shape[0]
    for i in small:
        row = x[i] if i < n or extra is None else extra[i - n]
        if bool(row.any()):
            return True
    return False


def _symmetric(g: torch.Tensor) -> torch.Tensor:
    # GEMM rounding leaves the two triangles unequal in the last bit.
    return 0.5 * (g + g.T)


def sq_distances_from_gram(g: torch.Tensor) -> torch.Tensor:
    """``||x_i - x_j||^2`` ``[n, n]`` from a Gram matrix ``g`` ``[n, n]``.

    Clamped at 0 (rounding can make a tiny distance negative) with an exact zero
    diagonal; a pair whose entries overflowed is ``+inf``, never NaN.

    Examples
    --------
    >>> sq_distances_from_gram(gram(torch.tensor([[1.0, 0.0], [3.0, 4.0]])))
    tensor([[ 0., 20.],
            [20.,  0.]], dtype=torch.float64)
    """
    diag = torch.diagonal(g)
    d2 = diag[:, None] + diag[None, :] - 2.0 * g
    d2 = torch.where(torch.isnan(d2), math.inf, d2).clamp_min_(0.0)
    d2.fill_diagonal_(0.0)
    return d2


def _plain_is_accurate(g: torch.Tensor, d2: torch.Tensor) -> bool:
    """Whether a Gram matrix ``g`` taken around the coordinate origin gives
    accurate distances ``d2``: every pair is far apart relative to its norms."""
    n = g.shape[0]
    if n < 2:
        return True
    diag = torch.diagonal(g)
    scale = diag[:, None] + diag[None, :]
    off = ~torch.eye(n, dtype=torch.bool, device=g.device)
    return bool((d2[off] >= _MIN_SEPARATION * scale[off]).all())


def central_row(d2: torch.Tensor) -> int:
    """The row with the smallest sum of squared distances to its ``(n - 1) // 2``
    nearest other rows (at least one), ties to the lower index. While most rows
    are honest, every honest row's sum involves honest rows only, so a row far
    from the majority is never picked.

    Examples
    --------
    Two far rows, even identical, are never central (sums of the 2 nearest:
    5, 2, 5, and 0 + 1e40 for each far row):

    >>> x = torch.tensor([[0.0], [1.0], [2.0], [1e20], [1e20]])
    >>> central_row(sq_distances_from_gram(gram(x)))
    1
    """
    score = _centrality(d2)
    return int(torch.sort(score, stable=True).indices[0])


def _centrality(d2: torch.Tensor) -> torch.Tensor:
    """``[n]`` sums of squared distances to the ``(n - 1) // 2`` nearest other
    rows (zeros when ``n < 2``)."""
    n = d2.shape[0]
    if n < 2:
        return torch.zeros(n, dtype=d2.dtype, device=d2.device)
    others = d2.clone()
    others.fill_diagonal_(math.inf)
    k = max(1, (n - 1) // 2)
    return others.topk(k, dim=1, largest=False).values.sum(dim=1)


def accurate_gram(x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
    """Gram matrix ``[n + k, n + k]`` (float64) good for distances between rows.

    The plain GEMM when the rows are far apart relative to their norms, else the
    GEMM relative to :func:`central_row` (module docstring). When the plain
    float32 GEMM overflowed or underflowed, it is redone with the rows scaled by
    a power of two, or in float64 (:func:`_plain_gram`), before the origin is
    chosen, and the second GEMM is taken the same way. Inner products
    of *affine* combinations of rows (and distances) are the same for both; raw
    inner products are not, so use :func:`gram` without ``origin`` for those.

    Raises
    ------
    AggregationError
        When float64 cannot hold the distances of most rows (float64 inputs
        beyond ~``1e150`` or below ~``1e-140``): ranking ``inf`` or ``0``
        would pick row 0 silently.
    """
    g, plan = _plain_gram(x, extra)
    if x.dtype == torch.float64 and _underflows(x, extra, g, torch.float64):
        raise AggregationError(
            "squared distances between the updates underflow float64 "
            "(entries below ~1e-140); scale the updates up"
        )
    g = _symmetric(g)
    d2 = sq_distances_from_gram(g)
    if bool(torch.isfinite(g).all()) and _plain_is_accurate(g, d2):
        return g
    score = _centrality(d2)
    r = int(torch.sort(score, stable=True).indices[0])
    if not math.isfinite(float(score[r])):
        # Even the majority's distances overflowed: no row is known to be
        # central, and ranking by inf would silently pick row 0.
        raise AggregationError(
            "squared distances between most updates overflow float64 "
            "(entries above ~1e150); scale the updates down"
        )
    n = x.shape[0]
    origin = x[r] if r < n or extra is None else extra[r - n]
    return _symmetric(_centered_gram(x, extra, origin, plan))


def pairwise_sq_distances(x: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances between the rows of ``x`` ``[n, d]`` -> ``[n, n]``
    (float64), from :func:`accurate_gram`; ``+inf`` where they overflow.

    Examples
    --------
    >>> pairwise_sq_distances(torch.tensor([[0.0, 0.0], [3.0, 4.0], [1e20, 0.0]]))
    tensor([[0.0000e+00, 2.5000e+01, 1.0000e+40],
            [2.5000e+01, 0.0000e+00, 1.0000e+40],
            [1.0000e+40, 1.0000e+40, 0.0000e+00]], dtype=torch.float64)
    """
    return sq_distances_from_gram(accurate_gram(x))


def combination_sq_distances(g: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """``||x_i - v||^2`` ``[n]`` for ``v = coef @ X`` with ``sum(coef) == 1``.

    ``g`` is a Gram matrix ``[n, n]`` around any origin, ``coef`` ``[n]``
    float64. Because ``v`` is an affine combination of the rows, the origin does
    not change the answer: ``||x_i - v||^2 = G_ii - 2 (G c)_i + c^T G c``.
    """
    gc = g @ coef
    return (torch.diagonal(g) - 2.0 * gc + coef @ gc).clamp_min(0.0)


def require_finite(g: torch.Tensor, rule: str) -> None:
    """Raise :class:`AggregationError` when a Gram matrix overflowed float64
    (float64 rows beyond ~1e150): combinations of rows cannot be measured."""
    if not bool(torch.isfinite(g).all()):
        raise AggregationError(
            f"{rule}: squared norms of the updates overflow float64 "
            "(entries above ~1e150); scale the updates down"
        )
