"""Split a dataset's indices among federated clients (IID and non-IID).

Every partitioner returns one ``int64`` index array per client, each sorted in
ascending order. Unless a docstring says otherwise the arrays are disjoint and
together cover ``range(n_items)`` exactly once. Randomised partitioners are
deterministic given ``seed`` (a fresh ``numpy.random.default_rng(seed)``).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedplat.registry import Registry

Partition = list[np.ndarray]

# Resampling bound for `dirichlet`: with alpha >= 0.1 and the usual
# min_size=10 a valid draw is found in a handful of tries; running out means the
# request is (nearly) infeasible, and an error is better than looping forever.
DEFAULT_MAX_RETRIES = 1000


def _check_n_clients(n_clients: int, n_items: int) -> None:
    if isinstance(n_clients, bool) or not isinstance(n_clients, numbers.Integral):
        raise ValueError(f"n_clients must be an int, got {n_clients!r}")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if n_clients > n_items:
        raise ValueError(
            f"n_clients ({n_clients}) must not exceed the number of items ({n_items})"
        )


def _as_labels(labels: Any) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("labels must not be empty")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _finish(parts: Sequence[np.ndarray]) -> Partition:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(n_items: int, n_clients: int, seed: int) -> Partition:
    """Uniformly random split into ``n_clients`` parts of near-equal size.

    Parameters
    ----------
    n_items : int
        Number of items ``N``; indices are ``0 .. N-1``.
    n_clients : int
        ``1 <= n_clients <= N``.
    seed : int

    Returns
    -------
    list of np.ndarray
        ``n_clients`` int64 arrays; sizes differ by at most 1.
    """
    if n_items < 1:
        raise ValueError(f"n_items must be >= 1, got {n_items}")
    _check_n_clients(n_clients, n_items)
    perm = np.random.default_rng(seed).permutation(n_items)
    return _finish(np.array_split(perm, n_clients))


def _dirichlet_draw(
    by_class: list[np.ndarray],
    n_clients: int,
    alpha: float,
    balance: bool,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """One draw: each class split over the clients in Dirichlet(alpha) shares."""
    n = sum(idx.size for idx in by_class)
    cap = n / n_clients
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    sizes = np.zeros(n_clients, dtype=np.int64)
    for idx_k in by_class:
        idx_k = rng.permutation(idx_k)
        p = rng.dirichlet(np.full(n_clients, alpha))
        if balance:
            masked = p * (sizes < cap)
            # All mass on full clients (or underflow at tiny alpha): keep p.
            if masked.sum() > 0:
                p = masked
        p = p / p.sum()
        cuts = (np.cumsum(p)[:-1] * idx_k.size).astype(np.int64)
        for c, chunk in enumerate(np.split(idx_k, cuts)):
            parts[c].append(chunk)
            sizes[c] += chunk.size
    return [np.concatenate(ch) for ch in parts]


def dirichlet(
    labels: np.ndarray,
    n_clients: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    *,
    balance: bool = True,
    max_retries: int = DEFAULT_MAX_RETRIES,
) -> Partition:
    """Label-skewed split with per-class Dirichlet proportions.

    For every class ``k`` a vector ``p_k ~ Dir(alpha * 1_n)`` is drawn and the
    items of class ``k`` (shuffled) are cut into ``n_clients`` runs of relative
    sizes ``p_k`` (Hsu et al. 2019, "Measuring the effects of non-identical data
    distribution"). Small ``alpha`` (e.g. 0.1) gives each client few classes;
    large ``alpha`` (e.g. 100) approaches IID. The whole draw is repeated until
    every client holds at least ``min_size`` items.

    With ``balance=True`` (the default, as in the NIID-Bench reference code of
    Li et al. 2022 that most FL benchmarks copy) a client that already holds
    ``N / n_clients`` items gets no share of later classes, which keeps client
    sizes from diverging and makes the ``min_size`` condition easy to meet.

    Parameters
    ----------
    labels : np.ndarray
        int ``[N]`` class labels.
    n_clients : int
        ``1 <= n_clients <= N``.
    alpha : float
        Dirichlet concentration, ``> 0``.
    seed : int
    min_size : int
        Minimum items per client, ``0 <= min_size <= N // n_clients``.
    balance : bool
        Cap on client size while assigning (see above).
    max_retries : int
        Number of draws before giving up.

    Returns
    -------
    list of np.ndarray
        ``n_clients`` int64 index arrays, disjoint, covering ``0 .. N-1``.

    Raises
    ------
    ValueError
        Invalid arguments, or no draw met ``min_size`` within ``max_retries``.
    """
    y = _as_labels(labels)
    n = y.size
    _check_n_clients(n_clients, n)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite number > 0, got {alpha}")
    if min_size < 0 or min_size * n_clients > n:
        raise ValueError(
            f"min_size must be in [0, {n // n_clients}] for {n} items and "
            f"{n_clients} clients, got {min_size}"
        )
    if max_retries < 1:
        raise ValueError(f"max_retries must be >= 1, got {max_retries}")

    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(y == k) for k in np.unique(y)]
    smallest = 0
    for _ in range(max_retries):
        parts = _dirichlet_draw(by_class, n_clients, float(alpha), balance, rng)
        smallest = min(p.size for p in parts)
        if smallest >= min_size:
            return _finish(parts)
    raise ValueError(
        f"dirichlet: no draw gave every one of {n_clients} clients >= {min_size} "
        f"items in {max_retries} tries (alpha={alpha}, {n} items, smallest client "
        f"in last draw: {smallest}); lower min_size or n_clients, or raise alpha"
    )


def shards(
    labels: np.ndarray, n_clients: int, shards_per_client: int, seed: int
) -> Partition:
    """Label-sorted shards (McMahan et al. 2017, "pathological non-IID").

    Items are sorted by label (ties in random order), cut into
    ``n_clients * shards_per_client`` contiguous shards of near-equal size, and
    each client receives ``shards_per_client`` shards chosen at random. With
    2 shards per client each client sees at most about 2 classes.

    Parameters
    ----------
    labels : np.ndarray
        int ``[N]`` class labels.
    n_clients : int
    shards_per_client : int
        ``>= 1``, with ``n_clients * shards_per_client <= N``.
    seed : int

    Returns
    -------
    list of np.ndarray
        ``n_clients`` int64 index arrays, disjoint, covering ``0 .. N-1``.
    """
    y = _as_labels(labels)
    n = y.size
    _check_n_clients(n_clients, n)
    if shards_per_client < 1:
        raise ValueError(f"shards_per_client must be >= 1, got {shards_per_client}")
    n_shards = n_clients * shards_per_client
    if n_shards > n:
        raise ValueError(
            f"n_clients * shards_per_client = {n_shards} exceeds the {n} items"
        )
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    order = perm[np.argsort(y[perm], kind="stable")]
    pieces = np.array_split(order, n_shards)
    owner = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return _finish([np.concatenate([pieces[s] for s in row]) for row in owner])


def label_sorted(labels: np.ndarray, n_clients: int) -> Partition:
    """Sort by label and split contiguously (no randomness).

    The "label-sorted" (extreme) non-IID split of robust-aggregation benchmarks
    such as ByzFL: client ``i`` gets the ``i``-th contiguous block of the
    label-sorted items, so each client sees only one or two classes whenever
    ``n_clients >= n_classes``. Ties keep their original order.

    Returns
    -------
    list of np.ndarray
        ``n_clients`` int64 index arrays of near-equal size, disjoint, covering
        ``0 .. N-1``.
    """
    y = _as_labels(labels)
    _check_n_clients(n_clients, y.size)
    order = np.argsort(y, kind="stable")
    return _finish(np.array_split(order, n_clients))


def sized(n_items: int, sizes: Sequence[int] | Sequence[float], seed: int) -> Partition:
    """Random split with prescribed, possibly unequal, client sizes.

    Parameters
    ----------
    n_items : int
        Number of items ``N``.
    sizes : sequence of int or of float
        Either item counts (ints ``>= 1`` summing to at most ``N``) or
        fractions (floats in ``(0, 1]`` summing to at most 1). Fractions summing
        to 1 (within 1e-6) cover all items, the remainder of the rounding going
        to the largest fractional parts; otherwise each count is
        ``floor(f * N)``.
    seed : int

    Returns
    -------
    list of np.ndarray
        ``len(sizes)`` disjoint int64 index arrays. They cover ``0 .. N-1`` only
        if the sizes add up to ``N`` (or the fractions to 1).
    """
    if n_items < 1:
        raise ValueError(f"n_items must be >= 1, got {n_items}")
    vals = list(sizes)
    if not vals:
        raise ValueError("sizes must not be empty")
    if any(isinstance(v, bool) for v in vals):
        raise ValueError("sizes must be ints or floats, not bools")
    if all(isinstance(v, numbers.Integral) for v in vals):
        counts = np.asarray(vals, dtype=np.int64)
        if counts.min() < 1:
            raise ValueError(f"every size must be >= 1, got {vals}")
        if counts.sum() > n_items:
            raise ValueError(f"sizes sum to {counts.sum()} > n_items={n_items}")
    elif all(isinstance(v, numbers.Real) for v in vals) and not any(
        isinstance(v, numbers.Integral) for v in vals
    ):
        frac = np.asarray(vals, dtype=np.float64)
        if not np.all(np.isfinite(frac)) or frac.min() <= 0 or frac.max() > 1:
            raise ValueError(f"fractions must be in (0, 1], got {vals}")
        total = float(frac.sum())
        if total > 1 + 1e-6:
            raise ValueError(f"fractions sum to {total} > 1")
        exact = frac * n_items
        counts = np.floor(exact).astype(np.int64)
        if abs(total - 1) <= 1e-6:
            short = n_items - int(counts.sum())
            # Largest-remainder rounding; ties go to the lower client index.
            order = np.argsort(-(exact - counts), kind="stable")
            counts[order[:short]] += 1
        if counts.min() < 1:
            raise ValueError(
                f"fractions {vals} of {n_items} items leave a client with no items"
            )
    else:
        raise ValueError(f"sizes must be all ints (counts) or all floats, got {vals}")
    perm = np.random.default_rng(seed).permutation(n_items)
    return _finish(np.split(perm[: counts.sum()], np.cumsum(counts)[:-1]))


# ---------------------------------------------------------------------- dispatch


def _iid(labels: np.ndarray, n_clients: int, seed: int) -> Partition:
    return iid(len(labels), n_clients, seed)


def _dirichlet(
    labels: np.ndarray,
    n_clients: int,
    seed: int,
    *,
    alpha: float,
    min_size: int = 10,
    balance: bool = True,
    max_retries: int = DEFAULT_MAX_RETRIES,
) -> Partition:
    return dirichlet(
        labels,
        n_clients,
        alpha,
        seed,
        min_size,
        balance=balance,
        max_retries=max_retries,
    )


def _shards(
    labels: np.ndarray, n_clients: int, seed: int, *, shards_per_client: int = 2
) -> Partition:
    return shards(labels, n_clients, shards_per_client, seed)


def _label_sorted(labels: np.ndarray, n_clients: int, seed: int) -> Partition:
    del seed  # deterministic by construction
    return label_sorted(labels, n_clients)


def _sized(
    labels: np.ndarray,
    n_clients: int,
    seed: int,
    *,
    sizes: Sequence[int] | Sequence[float],
) -> Partition:
    if len(sizes) != n_clients:
        raise ValueError(f"len(sizes)={len(sizes)} != n_clients={n_clients}")
    return sized(len(labels), sizes, seed)


_PARTITIONERS: Registry[Partition] = Registry("partitioner", ValueError)
for _name, _fn in (
    ("iid", _iid),
    ("dirichlet", _dirichlet),
    ("shards", _shards),
    ("label_sorted", _label_sorted),
    ("sized", _sized),
):
    _PARTITIONERS.register(_name, _fn)


def available_partitioners() -> list[str]:
    """Names accepted by :func:`partition`."""
    return _PARTITIONERS.available()


def partition(
    name: str, labels: np.ndarray, n_clients: int, seed: int, **params: Any
) -> Partition:
    """Partition ``labels``' indices by partitioner name.

    Parameters
    ----------
    name : str
        ``"iid"``, ``"dirichlet"`` (needs ``alpha``; optional ``min_size``,
        ``balance``, ``max_retries``), ``"shards"`` (optional
        ``shards_per_client``, default 2), ``"label_sorted"``, or ``"sized"``
        (needs ``sizes`` of length ``n_clients``).
    labels : np.ndarray
        int ``[N]`` class labels (only their count matters for iid / sized).
    n_clients : int
    seed : int
        Ignored by ``label_sorted``.
    **params
        Partitioner-specific parameters; unknown or missing ones are an error.

    Returns
    -------
    list of np.ndarray
        ``n_clients`` int64 index arrays.
    """
    key = name.replace("-", "_")
    fn = _PARTITIONERS.get(key)
    # (labels, n_clients, seed) come first; the rest are the partitioner's own.
    own = list(inspect.signature(fn).parameters.values())[3:]
    required = {p.name for p in own if p.default is p.empty}
    optional = {p.name for p in own} - required
    unknown = sorted(set(params) - required - optional)
    if unknown:
        raise ValueError(
            f"partitioner {key!r} does not take {unknown}; it accepts "
            f"{sorted(required | optional)}"
        )
    missing = sorted(required - set(params))
    if missing:
        raise ValueError(f"partitioner {key!r} needs parameter(s) {missing}")
    return fn(_as_labels(labels), n_clients, seed, **params)
