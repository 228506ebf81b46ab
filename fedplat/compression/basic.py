"""Identity, the float16 wrapper, and top-k with error feedback."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from fedplat.compression.base import (
    CompressionError,
    Compressor,
    StateDict,
    StateValue,
    check_state_keys,
    check_vector,
    make_generator,
    state_int,
    state_tensor,
)
from fedplat.compression.selection import exact_topk, sampled_topk
from fedplat.compression.wire import (
    Payload,
    PayloadError,
    dense_payload,
    sparse_payload,
)

__all__ = ["FP16", "ErrorFeedbackState", "Identity", "TopK", "decode_dense_or_sparse"]

_FP16_MAX = float(torch.finfo(torch.float16).max)


def decode_dense_or_sparse(payload: Payload) -> torch.Tensor:
    """Float32 ``[d]`` from a dense or sparse payload (zeros off the support)."""
    if payload.kind == "dense":
        return payload.values.to(torch.float32)
    if payload.kind == "sparse":
        assert payload.indices is not None
        out = torch.zeros(payload.d, dtype=torch.float32)
        out[payload.indices] = payload.values.to(torch.float32)
        return out
    raise PayloadError(f"expected a dense or sparse payload, got {payload.kind!r}")


class Identity:
    """No compression: the update travels as ``d`` float32 values."""

    def encode(self, vec: torch.Tensor, *, round: int, seed: int) -> Payload:
        """``vec`` ``[d]`` -> dense payload (a copy, so later edits don't leak)."""
        return dense_payload(check_vector(vec).clone())

    def decode(self, payload: Payload) -> torch.Tensor:
        """Dense (or sparse) payload -> float32 ``[d]``."""
        return decode_dense_or_sparse(payload)

    def state_dict(self) -> StateDict:
        return {}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        check_state_keys(state, set(), "identity")


class FP16:
    """Wrapper sending the inner compressor's values as float16.

    Like PyTorch's ``fp16_compress_wrapper``: the inner compressor runs in
    float32 (its residual/momentum never sees the rounding), only the values on
    the wire are halved. A payload with a value beyond float16's range (65504)
    stays float32 rather than being clamped or turned into Inf.
    """

    def __init__(self, inner: Compressor) -> None:
        self.inner = inner

    def encode(self, vec: torch.Tensor, *, round: int, seed: int) -> Payload:
        """``vec`` ``[d]`` -> the inner payload with float16 values."""
        payload = self.inner.encode(vec, round=round, seed=seed)
        v = payload.values
        if v.numel() and float(v.abs().max()) > _FP16_MAX:
            return payload
        half = v.to(torch.float16)
        if payload.kind == "sparse":
            assert payload.indices is not None
            # Halving the values shifts the sparse/dense break-even point.
            return sparse_payload(payload.d, payload.indices, half)
        return payload.with_values(half)

    def decode(self, payload: Payload) -> torch.Tensor:
        """Delegates to the inner compressor (it accepts float16 values)."""
        return self.inner.decode(payload)

    def state_dict(self) -> StateDict:
        return self.inner.state_dict()

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        self.inner.load_state_dict(state)


@dataclass
class ErrorFeedbackState:
    """Error-feedback memory: what was computed but not yet sent.

    Attributes
    ----------
    residual : torch.Tensor or None
        float32 ``[d]``; ``None`` before the first call.
    steps : int
        Encode calls so far.
    """

    residual: torch.Tensor | None = None
    steps: int = 0

    def state_dict(self) -> StateDict:
        out: StateDict = {"steps": self.steps}
        if self.residual is not None:
            out["residual"] = self.residual.clone()
        return out

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        check_state_keys(state, {"steps", "residual"}, "error-feedback")
        self.residual = state_tensor(state, "residual")
        self.steps = state_int(state, "steps")


class TopK:
    """Top-k sparsification with error feedback (Stich et al. 2018; Seide et al. 2014).

    ``acc = residual + vec``; send the ``k`` largest ``|acc|``; keep the rest as
    the next residual. Without error feedback the unsent mass is dropped.

    Parameters
    ----------
    ratio : float, optional
        Fraction of entries sent, ``k = ceil(ratio * d)``.
    k : int, optional
        Absolute number of entries (exactly one of ``ratio`` / ``k``).
    error_feedback : bool
        Keep the residual (default) or drop it.
    selection : {"exact", "sampled"}
        ``torch.topk``, or DGC's sampled threshold (see :mod:`.selection`).
    """

    def __init__(
        self,
        ratio: float | None = None,
        *,
        k: int | None = None,
        error_feedback: bool = True,
        selection: Literal["exact", "sampled"] = "exact",
    ) -> None:
        if (ratio is None) == (k is None):
            raise CompressionError("give exactly one of ratio and k")
        if ratio is not None and not 0.0 < ratio <= 1.0:
            raise CompressionError(f"ratio must be in (0, 1], got {ratio}")
        if k is not None and k < 1:
            raise CompressionError(f"k must be >= 1, got {k}")
        if selection not in ("exact", "sampled"):
            raise CompressionError(
                f"selection must be 'exact' or 'sampled', got {selection!r}"
            )
        self.ratio, self.k = ratio, k
        self.error_feedback = error_feedback
        self.selection = selection
        self.state = ErrorFeedbackState()

    def k_for(self, d: int) -> int:
        """Entries sent for a ``[d]`` vector."""
        if self.k is not None:
            return min(self.k, d)
        assert self.ratio is not None
        return min(d, math.ceil(self.ratio * d))

    def encode(self, vec: torch.Tensor, *, round: int, seed: int) -> Payload:
        """``vec`` ``[d]`` -> sparse payload of ``k`` entries of ``residual + vec``."""
        res = self.state.residual
        vec = check_vector(vec, None if res is None else res.numel())
        d = vec.numel()
        acc = vec + res if (self.error_feedback and res is not None) else vec.clone()
        k = self.k_for(d)
        if self.selection == "sampled":
            gen = make_generator(seed, round, "topk.sample")
            sel = sampled_topk(acc.abs(), k, generator=gen)
        else:
            sel = exact_topk(acc.abs(), k)
        idx = torch.sort(sel.indices).values
        values = acc[idx].clone()
        if self.error_feedback:
            acc[idx] = 0.0
            self.state.residual = acc
        self.state.steps += 1
        return sparse_payload(d, idx, values)

    def decode(self, payload: Payload) -> torch.Tensor:
        """Sparse (or dense-fallback) payload -> float32 ``[d]``."""
        return decode_dense_or_sparse(payload)

    def state_dict(self) -> StateDict:
        return self.state.state_dict()

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        self.state.load_state_dict(state)
