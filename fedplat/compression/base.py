"""The compressor protocol, its checkpointable state, and shared helpers.

Modelled on PyTorch's PowerSGD communication hook: a compressor's mutable memory
(error-feedback residual, momentum, velocity, warm-up counter) lives in an explicit
state object, so a client can checkpoint it between rounds and a restarted client
continues bit-for-bit where it stopped.

A state dict maps names to either ``torch.Tensor`` or JSON-able scalars
(``int``/``float``/``str``/``bool``); :func:`fedplat.compression.state.save_state`
writes the tensors with safetensors and the scalars as safetensors metadata, so no
pickle is ever involved.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Protocol, TypeAlias, runtime_checkable

import torch

from fedplat.compression.wire import Payload
from fedplat.vectors import all_finite, check_finite

__all__ = [
    "CompressionError",
    "Compressor",
    "StateDict",
    "StateValue",
    "check_vector",
    "derive_seed",
    "make_generator",
]

StateValue: TypeAlias = torch.Tensor | int | float | str | bool
StateDict: TypeAlias = dict[str, StateValue]


class CompressionError(ValueError):
    """Bad input to a compressor (wrong shape, non-finite values, bad state)."""


@runtime_checkable
class Compressor(Protocol):
    """Turns a flat update ``[d]`` into a :class:`Payload` and back.

    ``encode`` runs on the client and may update the compressor's state
    (error feedback, momentum). ``decode`` runs on the coordinator and needs no
    client state: sparse payloads carry their indices, sketches carry the
    ``(seed, round)`` that rebuilds the sketch matrix.
    """

    def encode(self, vec: torch.Tensor, *, round: int, seed: int) -> Payload:
        """Compress ``vec`` ``[d]`` (float32) for round ``round``."""
        ...

    def decode(self, payload: Payload) -> torch.Tensor:
        """Reconstruct a float32 ``[d]`` vector from ``payload``."""
        ...

    def state_dict(self) -> StateDict:
        """Tensors and JSON-able scalars that fully describe the mutable state."""
        ...

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        """Restore a state produced by :meth:`state_dict` (validated)."""
        ...


def derive_seed(seed: int, round: int, *labels: str | int) -> int:
    """A 64-bit seed that is a pure function of ``(seed, round, labels)``.

    BLAKE2b rather than ``seed + round`` so that nearby ``(seed, round)`` pairs
    and different streams (bucket hash vs sign hash, chunk 0 vs chunk 1) give
    unrelated generator states; client and coordinator compute the same value
    on any platform.
    """
    if not 0 <= seed < 1 << 64 or not 0 <= round < 1 << 64:
        raise CompressionError("seed and round must be in [0, 2^64)")
    h = hashlib.blake2b(
        struct.pack("<QQ", seed, round), digest_size=8, person=b"fedplat-compr"
    )
    for label in labels:
        h.update(b"\x00" + str(label).encode())
    return int.from_bytes(h.digest(), "little")


def make_generator(seed: int, round: int, *labels: str | int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed`.

    Client and coordinator both run ``torch==2.13.0`` (pinned), whose CPU
    Mersenne-Twister streams are deterministic for a given seed.
    """
    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(seed, round, *labels))
    return g


def check_vector(vec: torch.Tensor, d: int | None = None) -> torch.Tensor:
    """Validate a flat float32 update ``[d]``: 1-D, finite, expected length.

    Checked before any state is touched: one NaN would otherwise poison an
    error-feedback residual or DGC's velocity forever.
    """
    if not isinstance(vec, torch.Tensor) or vec.dim() != 1:
        shape = tuple(vec.shape) if isinstance(vec, torch.Tensor) else type(vec)
        raise CompressionError(f"expected a flat [d] tensor, got {shape}")
    if vec.dtype != torch.float32:
        raise CompressionError(f"expected float32, got {vec.dtype}")
    if d is not None and vec.numel() != d:
        raise CompressionError(f"vector has {vec.numel()} entries, expected {d}")
    check_finite(vec, "vector", CompressionError)
    return vec.detach()


def state_tensor(
    state: Mapping[str, StateValue], key: str, d: int | None = None
) -> torch.Tensor | None:
    """Fetch an optional float32 ``[d]`` buffer from a state dict, validated."""
    if key not in state:
        return None
    t = state[key]
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.float32:
        raise CompressionError(f"state {key!r} must be a 1-D float32 tensor")
    if d is not None and t.numel() != d:
        raise CompressionError(f"state {key!r} has {t.numel()} entries, expected {d}")
    if not all_finite(t):
        raise CompressionError(f"state {key!r} holds non-finite values")
    return t.detach().clone()


def state_int(state: Mapping[str, StateValue], key: str, default: int = 0) -> int:
    """Fetch a non-negative integer scalar from a state dict, validated."""
    if key not in state:
        return default
    v = state[key]
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.is_floating_point():
            raise CompressionError(f"state {key!r} must be an integer")
        v = int(v.item())
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CompressionError(f"state {key!r} must be a non-negative integer")
    return v


def check_state_keys(
    state: Mapping[str, StateValue], allowed: set[str], owner: str
) -> None:
    """Reject unknown keys: a misspelled key must not be silently ignored."""
    unknown = sorted(set(state) - allowed)
    if unknown:
        raise CompressionError(
            f"{owner} state has unknown keys {unknown}; valid: {sorted(allowed)}"
        )
