"""Where a round's accepted updates go: a row buffer, or a running weighted sum.

Rules that look at every row (robust aggregators, contribution scoring) get a
:class:`RowStack`: one preallocated ``[n_selected, d]`` float32 buffer, each
selected client owning the row of its place in enrolment order, and uploads are
decoded straight into their row. Rows of clients that never deliver are never
touched (the buffer comes from ``torch.empty``, so untouched pages cost no
memory); at close the accepted rows are moved to the front in order, and the
``[k, d]`` view is handed to the rule without a copy.

FedAvg with no pre-aggregation needs only the sum: :class:`RunningSum`
keeps ``sum_i w_i u_i`` in float64 (``O(d)`` whatever the number of clients;
``w_i = 1`` for an unweighted rule) and decodes each upload into a scratch row
from a small pool, added once the upload is complete and valid, then returned
to the pool. Float64 makes the round's mean independent of the order uploads
arrive in: the float64 sums of two orders differ by a few units in the 53rd
bit, and both round to the same float32 mean but at a near-tie (about one
coordinate in 10^7 per round at ten clients). A run with a fixed seed whose
rounds take the same clients gives the same model however their uploads race
(float32 sums differ in the 24th bit between orders, and 20 rounds of training
grew that into the fourth digit of the demo's accuracy: 0.8520 and 0.8513 from
one seed).
Each row is widened in chunks of :data:`CHUNK` (a 2 MiB scratch, not a
model-sized float64 copy): about 2x a float32 axpy, a few ms per update at 10M
parameters, against the tens of ms its decoding takes.

With a sketch compressor, :class:`SketchSum` is the same running sum over the
clients' sketches ``[b]`` (the intake keeps each payload's sketch values instead
of de-sketching it): the sketch is linear, so the sum of sketches is the sketch
of the sum, de-sketched once when the round closes (and noised before that under
central DP).

Both kinds apply the round's norm bound (:mod:`fedplat.server.bounds`), each
update ``u_i`` scaled by ``min(1, B / ||u_i||)``: :class:`RowStack` at
:meth:`RowStack.take`, from the exact median of the round's norms;
:class:`RunningSum` as each row is added (``sum += w_i s_i u_i``, the weight
``w_i`` unchanged: the update is clipped, not re-weighted), from the previous
round's norms or a held prefix, whose rows wait in their scratch buffers until
the prefix is complete or :meth:`RunningSum.settle` releases it at close.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import torch
from fedplat.server.bounds import Bounded, RoundBounds, exact_bound

#: Elements widened to float64 at a time by :func:`add_widened`.
CHUNK = 1 << 18


def add_widened(total: torch.Tensor, row: torch.Tensor, alpha: float) -> None:
    """``total += alpha * row``: float64 ``total``, float32 ``row``, chunked.

    ``total.add_(row)`` across dtypes takes a slow unvectorized path (about 15x
    a float32 axpy) and ``row.double()`` is a model-sized copy; a small float64
    scratch does neither.
    """
    n = total.numel()
    scratch = torch.empty(min(CHUNK, n), dtype=torch.float64)
    for i in range(0, n, CHUNK):
        k = min(CHUNK, n - i)
        part = scratch[:k]
        part.copy_(row[i : i + k])
        total[i : i + k].add_(part, alpha=alpha)


@dataclass(frozen=True)
class Accepted:
    """One accepted update's place in the round, and what the bounds did to it."""

    client_id: str
    row: int  # the client's index among the round's selected clients
    weight: float  # its averaging weight, after every cap
    norm: float | None = None  # L2 norm of the update (or sketch) as received
    scale: float = 1.0  # min(1, bound / norm): 1 unless norm-bounded
    bound: float | None = None  # the norm bound it was held to (None: none)
    weight_capped: bool = False  # a cap lowered its declared example count

    @property
    def norm_bounded(self) -> bool:
        return self.scale < 1.0


class RowStack:
    """``[n, d]`` rows decoded in place (see the module docstring)."""

    needs_rows = True
    sketch_space = False

    def check_upload(self) -> None:
        """Raise ``PayloadError`` if this round takes no uploads."""

    def __init__(self, n: int, d: int, bounds: RoundBounds | None = None) -> None:
        self.n, self.d = n, d
        self.bounds = bounds or RoundBounds()
        self._buf: torch.Tensor | None = None
        self._accepted: dict[int, Accepted] = {}
        self._lock = threading.Lock()

    def acquire(self, row: int) -> torch.Tensor:
        """The row client ``row`` decodes into."""
        with self._lock:
            if self._buf is None:
                self._buf = torch.empty(self.n, self.d, dtype=torch.float32)
            return self._buf[row]

    def release(self, row: int, buffer: torch.Tensor) -> None:
        """A failed upload: its row stays unused."""

    def commit(self, acc: Accepted, buffer: torch.Tensor) -> None:
        with self._lock:
            self._accepted[acc.row] = acc

    def accepted(self) -> list[Accepted]:
        with self._lock:
            return [self._accepted[r] for r in sorted(self._accepted)]

    def take(self) -> tuple[torch.Tensor, list[Accepted]]:
        """The accepted rows, in row order, as a ``[k, d]`` view (compacted in
        place: row ``j`` moves up to ``i <= j``, so no row is overwritten before
        it has moved), norm-bounded in place."""
        accepted = self.accepted()
        assert self._buf is not None or not accepted
        if not accepted:
            return torch.empty(0, self.d), []
        buf = self._buf
        assert buf is not None
        for i, acc in enumerate(accepted):
            if acc.row != i:
                buf[i].copy_(buf[acc.row])
        stack = buf[: len(accepted)]
        spec = self.bounds.norm
        if spec is not None:
            norms = [a.norm if a.norm is not None else 0.0 for a in accepted]
            scales, bound = exact_bound(norms, spec)
            for i, s in enumerate(scales):
                if s < 1.0:
                    stack[i].mul_(s)
            accepted = [
                replace(a, scale=s, bound=bound)
                for a, s in zip(accepted, scales, strict=True)
            ]
        return stack, accepted

    def free(self) -> None:
        self._buf = None


class RunningSum:
    """``sum_i w_i u_i`` and ``sum_i w_i`` (see the module docstring)."""

    needs_rows = False
    sketch_space = False

    def check_upload(self) -> None:
        """Raise ``PayloadError`` if this round takes no uploads."""

    def __init__(
        self,
        d: int,
        *,
        weighted: bool = True,
        bounds: RoundBounds | None = None,
        selected: int = 1,
    ) -> None:
        self.d = d
        self.weighted = weighted
        self.bounds = bounds or RoundBounds()
        self.sum: torch.Tensor | None = None
        self.total_weight = 0.0
        self._pool: list[torch.Tensor] = []
        self._accepted: dict[int, Accepted] = {}
        self._lock = threading.Lock()
        self._bound = self.bounds.streaming(selected)

    def acquire(self, row: int) -> torch.Tensor:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return torch.empty(self.d, dtype=torch.float32)

    def release(self, row: int, buffer: torch.Tensor) -> None:
        with self._lock:
            self._pool.append(buffer)

    def commit(self, acc: Accepted, buffer: torch.Tensor) -> None:
        """Add ``w s u`` (``buffer`` holds ``u``), or hold it in the prefix."""
        with self._lock:
            if self._bound is None:
                self._add(acc, buffer)
                return
            norm = acc.norm if acc.norm is not None else 0.0
            for b in self._bound.offer(norm, (acc, buffer)):
                self._add_bounded(b)

    def settle(self) -> None:
        """Add the rows still held in the prefix (the round is closing)."""
        with self._lock:
            if self._bound is not None:
                for b in self._bound.flush():
                    self._add_bounded(b)

    def _add_bounded(self, b: Bounded[tuple[Accepted, torch.Tensor]]) -> None:
        acc, buffer = b.item
        self._add(replace(acc, scale=b.scale, bound=b.bound), buffer)

    def _add(self, acc: Accepted, buffer: torch.Tensor) -> None:
        if self.sum is None:
            self.sum = torch.zeros(self.d, dtype=torch.float64)
        w = acc.weight if self.weighted else 1.0
        add_widened(self.sum, buffer, w * acc.scale)
        self.total_weight += w
        self._accepted[acc.row] = acc
        self._pool.append(buffer)

    def accepted(self) -> list[Accepted]:
        with self._lock:
            return [self._accepted[r] for r in sorted(self._accepted)]

    def free(self) -> None:
        self.sum = None
        self._pool.clear()
        self._bound = None


class SketchSum(RunningSum):
    """:class:`RunningSum` over the clients' sketches ``[b]`` (module docstring)."""

    sketch_space = True


class MaskedSum(RunningSum):
    """The sum of a secure-aggregation round (the coordinator never sees a row).

    Uploads are refused (:meth:`check_upload`): clients send masked inputs through the
    ``SecAgg`` call, and :meth:`set_result` stores the unmasked sum of the
    survivors' clipped vectors ``[dim]`` (the update, or its sketch when
    ``sketch_space``) and, under adaptive clipping, the count of unclipped
    updates the clients appended.
    """

    def __init__(self, d: int, *, sketch_space: bool) -> None:
        super().__init__(d, weighted=False)
        self.sketch_space = sketch_space
        self.unclipped: int | None = None
        # How far fixed-point rounding may move one contribution (L2): central
        # DP's noise covers it (server/central_dp.py, release).
        self.rounding = 0.0

    def check_upload(self) -> None:
        from fedplat.compression.wire import PayloadError

        raise PayloadError(
            "this round uses secure aggregation: send the masked input through "
            "the SecAgg call, not an upload"
        )

    def acquire(self, row: int) -> torch.Tensor:
        self.check_upload()
        raise AssertionError("unreachable")

    def set_result(
        self,
        total: torch.Tensor,
        accepted: list[Accepted],
        unclipped: int | None,
        rounding: float = 0.0,
    ) -> None:
        with self._lock:
            self.sum = total.to(torch.float64)
            self.total_weight = float(len(accepted))
            self._accepted = {a.row: a for a in accepted}
            self.unclipped = unclipped
            self.rounding = rounding


Accumulator = RowStack | RunningSum

__all__ = [
    "Accepted",
    "Accumulator",
    "MaskedSum",
    "RowStack",
    "RunningSum",
    "SketchSum",
]
