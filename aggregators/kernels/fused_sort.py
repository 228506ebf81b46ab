"""Compiled selection networks: coordinate-wise order statistics in one pass.

The eager column sort of :mod:`fedplat.aggregators.kernels.bitonic` runs a bitonic
network as ~90 small torch ops per block of columns; every op streams its block
through L2, so a ``[50, 1e6]`` median costs ~40 plain means. Here the same idea
(sort every column with a fixed comparator network of ``torch.minimum`` /
``torch.maximum``) is handed to ``torch.compile``: Inductor fuses the whole
network and the reduction into one C++ loop over columns that loads each
column's ``n`` values once, keeps them in vector registers / L1, and writes only
the results. Measured on the 2-core machine, ``[50, 1e6]``: ~5-6 plain means
against ~40 for the eager network (``bench/aggregators_speed.py``).

The network is Batcher's odd-even merge sort (Batcher 1968) for the next power
of two ``N >= n``. It is in standard form (every comparator puts the minimum on
the lower row), so padding rows ``n..N-1`` holding ``+inf`` never move and every
comparator touching one is a no-op: dropping them leaves a sorting network for
exactly ``n`` rows. A backward liveness pass then drops the comparators that
cannot influence the ranks a reduction reads (the median needs 330 of the 403
comparators for ``n = 50``).

Compiling needs a C++ compiler (``g++``) and takes ~10-30 s per distinct ``n``
and reduction on the 2-core machine (76-86 s for ``n = 100``; Inductor caches the
generated code on disk, Dynamo's trace is redone per process). The first large
call starts it in a background thread and is answered by the eager network, as
is every call until the kernel is ready and has passed a self-check against the
eager network; if compiling fails (no compiler, unsupported platform) or a kernel
later raises, a warning is logged and callers keep the eager network.
``FEDPLAT_FUSED_ORDER_STATS=0`` disables this path, ``=sync`` compiles on the
calling thread.

Runtime state. Dynamo guards every compiled graph on global state, among it
``torch.get_num_threads()`` and grad mode, and recompiles *on the calling
thread* when a guard fails: ``torch.set_num_threads`` after warm-up made the
next call of each kernel block 14-19 s at ``n = 50``. So a kernel is keyed by
that state too (:func:`_state`; a new state compiles in the background like a
new ``n``, the eager network answering meanwhile), every call runs under
``no_grad``, and a ready kernel is called through ``torch._dynamo.run``, which
only replays compiled graphs: a guard that still fails runs the network
uncompiled on that call instead of compiling.
"""

from __future__ import annotations

import logging
import os
import threading
import types
from collections.abc import Callable, Sequence
from functools import cache
from typing import NamedTuple

import torch

log = logging.getLogger(__name__)

# Columns below which the eager network is used: compiling would cost more than
# it saves, and small inputs (tests, small models) keep their exact old path.
MIN_COLUMNS = 1 << 17
# Rows above which the network (O(n log^2 n) comparators, traced one by one)
# takes too long to compile; the eager path handles them.
MAX_ROWS = 128

# A rule's per-column maths over the sorted values of a column: ``s[r]`` is the
# ``r``-th smallest value of every column; returns ``(aggregate, lowest kept,
# highest kept)`` (see ``order_stats.ColumnReduction``).
Reduction = Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]


def _odd_even_merge_sort(size: int) -> list[tuple[int, int]]:
    """Comparators ``(i, j)``, ``i < j``, of Batcher's odd-even merge sort on
    ``size`` (a power of two) rows, in order; ``(i, j)`` puts the minimum on ``i``."""
    comps: list[tuple[int, int]] = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        comps.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return comps


@cache
def comparators(
    n: int, ranks: tuple[int, ...] | None = None
) -> tuple[tuple[int, int], ...]:
    """A comparator network leaving rows ``ranks`` (all rows when ``None``) of an
    ``n``-row input holding its sorted values (ascending).

    Examples
    --------
    Batcher's network for 4 rows is (0, 1), (2, 3), (0, 2), (1, 3), (1, 2); for 3
    rows the comparators touching the padding row 3 are dropped:

    >>> comps = comparators(3)
    >>> comps
    ((0, 1), (0, 2), (1, 2))
    >>> torch.stack(apply_network(torch.tensor([[3.0], [1.0], [2.0]]).unbind(0), comps))
    tensor([[1.],
            [2.],
            [3.]])
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    size = 1 << max(0, (n - 1).bit_length())
    comps = [(i, j) for i, j in _odd_even_merge_sort(size) if j < n]
    if ranks is None:
        return tuple(comps)
    if any(not 0 <= r < n for r in ranks):
        raise ValueError(f"ranks must lie in [0, {n}), got {list(ranks)}")
    live = set(ranks)
    kept: list[tuple[int, int]] = []
    for i, j in reversed(comps):
        if i in live or j in live:
            kept.append((i, j))
            live.update((i, j))
    return tuple(reversed(kept))


def apply_network(
    rows: Sequence[torch.Tensor], comps: Sequence[tuple[int, int]]
) -> list[torch.Tensor]:
    """Run ``comps`` over ``rows`` (one tensor per row, all the same shape)."""
    v = list(rows)
    for i, j in comps:
        a, b = v[i], v[j]
        v[i], v[j] = torch.minimum(a, b), torch.maximum(a, b)
    return v


def sorted_reduce(
    x: torch.Tensor, ranks: tuple[int, ...] | None, reduce: Reduction
) -> tuple[torch.Tensor, ...]:
    """Eager reference: sort the columns of ``x`` ``[n, d]`` with the network and
    apply ``reduce`` (what the compiled kernel computes)."""
    comps = comparators(x.shape[0], ranks)
    return reduce(apply_network(x.unbind(0), comps))


Kernel = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


class _Compiled(NamedTuple):
    """One kernel: ``build`` compiles on a call (background thread), ``serve``
    replays only what ``build`` compiled (never compiles; a guard miss runs
    the network uncompiled)."""

    build: Kernel
    serve: Kernel


def _compile(
    name: str, n: int, ranks: tuple[int, ...] | None, reduce: Reduction
) -> _Compiled:
    comps = comparators(n, ranks)

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return reduce(apply_network(t.unbind(0), comps))

    # Dynamo caches compiled graphs on the code object (and stops after a few
    # recompilations): give every kernel its own.
    name = "".join(c if c.isalnum() else "_" for c in name)
    fn = types.FunctionType(
        fn.__code__.replace(co_name=name), fn.__globals__, name, None, fn.__closure__
    )
    # Inductor stops fusing after 64 nodes by default and would split the network
    # into several loops, each storing and reloading every row; one loop keeps
    # the column in registers / L1 (trimmed mean of [50, 1e6]: 9.2 -> 2.3 means).
    build = torch.compile(
        fn, dynamic=True, fullgraph=True, options={"max_fusion_size": 1 << 16}
    )
    return _Compiled(build, torch._dynamo.run(fn))


def _state(x: torch.Tensor) -> tuple[object, ...]:
    """The global state Dynamo's guards read that a caller may change between
    rounds (grad mode is pinned by ``no_grad`` around every call)."""
    return (
        torch.get_num_threads(),
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
        x.is_inference(),
    )


def full_key(key: tuple[object, ...], x: torch.Tensor) -> tuple[object, ...]:
    """The cache key of the kernel for reduction ``key`` over ``x`` now:
    ``(*key, dtype, *state)``."""
    return (*key, x.dtype, *_state(x))


def _probe(n: int, dtype: torch.dtype, inference: bool) -> torch.Tensor:
    """A small random input of the kernel's class (``[n, 64]``)."""
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode(inference):
        return torch.randn(n, 64, generator=gen, dtype=dtype)


class _Kernels:
    """Compiled kernels by key; thread-safe, each compiled at most once.

    By default a kernel is compiled in a background thread on a small input of
    the same shape class (``dynamic=True``: one kernel serves every ``d``); until
    it is ready, :meth:`run` returns ``None`` and the caller uses the eager
    network, so a coordinator never stalls a round on a compile.
    ``FEDPLAT_FUSED_ORDER_STATS=sync`` compiles on the calling thread instead.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[tuple[object, ...], _Compiled] = {}
        self._pending: dict[tuple[object, ...], threading.Thread] = {}
        self._failed: set[tuple[object, ...]] = set()
        self._warned = False

    def _build(
        self,
        key: tuple[object, ...],
        n: int,
        dtype: torch.dtype,
        ranks: tuple[int, ...] | None,
        reduce: Reduction,
    ) -> None:
        try:
            kernel = _compile("fused_" + "_".join(map(str, key)), n, ranks, reduce)
            # A self-check on a small random input (one kernel serves every d).
            probe = _probe(n, dtype, inference=bool(key[-1]))
            with torch.no_grad():
                got = kernel.build(probe)
                want = sorted_reduce(probe, ranks, reduce)
            if not all(torch.allclose(a, b) for a, b in zip(got, want, strict=True)):
                raise RuntimeError("compiled kernel disagrees with the eager network")
        except Exception as exc:  # no compiler, unsupported platform, ...
            with self._lock:
                self._failed.add(key)
                self._pending.pop(key, None)
                warn, self._warned = not self._warned, True
            if warn:
                log.warning(
                    "compiled order statistics unavailable (%s: %s); "
                    "using the eager sorting network",
                    type(exc).__name__,
                    exc,
                )
            return
        with self._lock:
            self._pending.pop(key, None)
            # The state changed while compiling: the graph may be guarded on
            # the other one; the next call in this state compiles again.
            tail = (dtype, *_state(probe))
            if key[-len(tail) :] == tail:
                self._ready[key] = kernel

    def run(
        self,
        key: tuple[object, ...],
        x: torch.Tensor,
        ranks: tuple[int, ...] | None,
        reduce: Reduction,
        sync: bool,
    ) -> tuple[torch.Tensor, ...] | None:
        """The compiled ``sorted_reduce(x, ranks, reduce)``, or ``None`` while it
        is compiling or when it cannot be compiled (the caller falls back)."""
        key = full_key(key, x)
        with self._lock:
            kernel = self._ready.get(key)
            start = (
                kernel is None and key not in self._failed and key not in self._pending
            )
            if start and sync:
                # Other callers fall back meanwhile instead of compiling twice.
                self._pending[key] = threading.current_thread()
            elif start:
                thread = threading.Thread(
                    target=self._build,
                    args=(key, x.shape[0], x.dtype, ranks, reduce),
                    name=f"fedplat-compile-{key[0]}",
                    daemon=True,
                )
                self._pending[key] = thread
                thread.start()
        if kernel is None and start and sync:
            self._build(key, x.shape[0], x.dtype, ranks, reduce)
            kernel = self._ready.get(key)
        if kernel is None:
            return None
        try:
            with torch.no_grad():
                return kernel.serve(x.contiguous())
        except Exception as exc:  # never let a kernel fault fail an aggregation
            with self._lock:
                self._ready.pop(key, None)
                self._failed.add(key)
            log.warning(
                "compiled order statistics failed (%s: %s); using the eager network",
                type(exc).__name__,
                exc,
            )
            return None

    def compiled_keys(self) -> list[tuple[object, ...]]:
        with self._lock:
            return list(self._ready)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the pending compiles; ``True`` when none is left."""
        with self._lock:
            threads = list(self._pending.values())
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        with self._lock:
            return not self._pending


_KERNELS = _Kernels()


def mode() -> str:
    """``FEDPLAT_FUSED_ORDER_STATS``: ``0`` (off), ``sync`` or ``1`` (default:
    compile in the background)."""
    value = os.environ.get("FEDPLAT_FUSED_ORDER_STATS", "1")
    if value not in ("0", "1", "sync"):
        raise ValueError(
            f"FEDPLAT_FUSED_ORDER_STATS must be 0, 1 or sync, got {value!r}"
        )
    return value


def applicable(x: torch.Tensor) -> bool:
    """Whether the compiled path should be tried for ``x`` ``[n, d]``."""
    n, d = x.shape
    return (
        mode() != "0"
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and 2 <= n <= MAX_ROWS
        and d >= MIN_COLUMNS
    )


def run(
    key: tuple[object, ...],
    x: torch.Tensor,
    ranks: tuple[int, ...] | None,
    reduce: Reduction,
) -> tuple[torch.Tensor, ...] | None:
    """Compiled ``sorted_reduce``; ``key`` must identify ``(n, ranks, reduce)``.
    Returns ``None`` while the kernel compiles (in the background) or when it
    cannot be compiled."""
    return _KERNELS.run(key, x, ranks, reduce, sync=mode() == "sync")


def compiled_keys() -> list[tuple[object, ...]]:
    """Keys of the kernels compiled so far in this process."""
    return _KERNELS.compiled_keys()


def wait(timeout: float | None = None) -> bool:
    """Block until background compiles finish (benchmarks call this after a
    warm-up call); ``True`` when none is pending."""
    return _KERNELS.wait(timeout)
