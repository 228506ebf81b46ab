"""Pre-aggregators: transforms of the ``[n, d]`` stack applied before a rule.

Each is a callable ``(updates [n, d], weights [n]) -> PreOutput`` and they chain in
a :class:`fedplat.aggregators.pipeline.Pipeline` (the ByzFL ``RobustAggregator``
pattern). Every output reports which inputs each new row is made of (``share``),
so a pipeline can map the rule's per-row decisions back to the clients.
"""

from __future__ import annotations

import torch
from fedplat.aggregators.base import (
    AggregationError,
    PreAggregator,
    PreOutput,
    check_float,
    check_int,
    require,
)
from fedplat.aggregators.kernels.distances import pairwise_sq_distances


def _identity_share(n: int) -> torch.Tensor:
    return torch.eye(n, dtype=torch.float64)


class NormClipping(PreAggregator):
    """Scale every row to norm at most ``max_norm``: ``x * min(1, c / ||x||)``
    (static clipping, e.g. ByzFL ``Clipping``; Karimireddy et al. 2021 discuss why
    clipping around 0 alone is not robust and center it, see ``cclip``).

    Parameters
    ----------
    max_norm : float
        Clipping threshold ``c`` (> 0).

    Rows that were scaled down are flagged ``"clipped"``.

    Examples
    --------
    >>> x = torch.tensor([[3.0, 4.0], [0.5, 0.0]])
    >>> NormClipping(max_norm=1.0)(x, torch.tensor([0.5, 0.5])).updates
    tensor([[0.6000, 0.8000],
            [0.5000, 0.0000]])
    """

    name = "clipping"

    def __init__(self, max_norm: float) -> None:
        self.max_norm = check_float("max_norm", max_norm, minimum=0.0, strict=True)

    def __call__(self, updates: torch.Tensor, weights: torch.Tensor) -> PreOutput:
        n = updates.shape[0]
        norms = torch.linalg.vector_norm(updates, dim=1, dtype=torch.float64)
        scale = (self.max_norm / norms.clamp_min(1e-300)).clamp_max(1.0)
        clipped = scale < 1.0
        out = (
            updates * scale.to(updates.dtype)[:, None]
            if bool(clipped.any())
            else updates
        )
        return PreOutput(
            updates=out,
            weights=weights,
            share=_identity_share(n),
            owner=torch.arange(n),
            flags={"clipped": clipped},
        )


class NearestNeighborMixing(PreAggregator):
    """Nearest-neighbour mixing, NNM (Allouah et al., AISTATS 2023, "Fixing by
    mixing", Algorithm 1): replace every row by the average of its ``n - f``
    nearest rows (itself included) in Euclidean distance.

    Parameters
    ----------
    f : int
        Byzantine clients tolerated; needs ``f < n`` at call time (the paper's
        guarantees assume ``2f < n``).

    Distances come from one Gram matrix; the mixing is one ``[n, n] x [n, d]``
    product. Ties in distance go to the lower row index.

    Examples
    --------
    ``f = 1``: every row becomes the mean of itself and its nearest row:

    >>> x = torch.tensor([[0.0], [1.0], [5.0]])
    >>> NearestNeighborMixing(f=1)(x, torch.full((3,), 1 / 3)).updates
    tensor([[0.5000],
            [0.5000],
            [3.0000]])
    """

    name = "nnm"

    def __init__(self, f: int) -> None:
        self.f = check_int("f", f)

    def __call__(self, updates: torch.Tensor, weights: torch.Tensor) -> PreOutput:
        n = updates.shape[0]
        require(self.f < n, self.name, "f < n", f=self.f, n=n)
        k = n - self.f
        d2 = pairwise_sq_distances(updates)
        # Stable sort: equal distances keep index order; the row itself (distance 0)
        # comes first unless another row is identical and earlier, which is the
        # same multiset of values.
        nearest = torch.sort(d2, dim=1, stable=True).indices[:, :k]
        mix = torch.zeros(n, n, dtype=torch.float64)
        mix.scatter_(1, nearest, 1.0 / k)
        out = mix.to(updates.dtype) @ updates
        return PreOutput(out, weights, mix, torch.arange(n), {})


class Bucketing(PreAggregator):
    """Bucketing (Karimireddy, He & Jaggi, ICLR 2022, "Byzantine-robust learning on
    heterogeneous datasets via bucketing", Algorithm 1).

    Each call draws a random permutation of the rows, cuts it into buckets of
    ``bucket_size`` consecutive rows (the last one may be smaller) and averages
    each bucket, so the rule sees ``ceil(n / s)`` less heterogeneous rows.

    Parameters
    ----------
    bucket_size : int
        ``s >= 1`` (the paper uses ``s = 2``).
    seed : int
        Seed of the bucketing generator; its state is part of :meth:`state_dict`,
        so a resumed run draws the same buckets.

    With client weights the bucket average is weighted and the bucket's weight is
    the sum of its members' (uniform weights give the paper's plain average).

    Examples
    --------
    One bucket of all four rows is their mean, holding all the weight:

    >>> x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    >>> out = Bucketing(bucket_size=4)(x, torch.full((4,), 0.25))
    >>> out.updates, out.weights
    (tensor([[1.5000]]), tensor([1.], dtype=torch.float64))
    """

    name = "bucketing"

    def __init__(self, bucket_size: int = 2, seed: int = 0) -> None:
        self.bucket_size = check_int("bucket_size", bucket_size, minimum=1)
        self.seed = check_int("seed", seed)
        self._gen = torch.Generator()
        self._gen.manual_seed(seed)

    def __call__(self, updates: torch.Tensor, weights: torch.Tensor) -> PreOutput:
        n = updates.shape[0]
        perm = torch.randperm(n, generator=self._gen)
        buckets = perm.split(self.bucket_size)
        m = len(buckets)
        owner = torch.empty(n, dtype=torch.int64)
        w = weights.to(torch.float64)
        share = torch.zeros(m, n, dtype=torch.float64)
        for j, members in enumerate(buckets):
            owner[members] = j
            bw = w[members]
            total = float(bw.sum())
            share[j, members] = bw / total if total > 0 else 1.0 / members.numel()
        out = share.to(updates.dtype) @ updates
        new_w = torch.zeros(m, dtype=torch.float64).index_add_(0, owner, w)
        return PreOutput(out, new_w / new_w.sum(), share, owner, {})

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rng": self._gen.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        unknown = sorted(set(state) - {"rng"})
        if unknown:
            raise AggregationError(f"{self.name}: unknown state keys {unknown}")
        if "rng" in state:
            self._gen.set_state(state["rng"].to(torch.uint8).cpu())
