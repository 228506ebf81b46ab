"""Byte encodings of flat vectors. Only raw numeric bytes: nothing is unpickled.

``dense-f32le`` is the baseline: ``d`` little-endian float32 values. Compressed
encodings (sparse, sketch) register their decoders here so the coordinator decodes
every update through one validated entry point.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import numpy as np
import torch

from fedplat.registry import Registry
from fedplat.transport.errors import InvalidArgument

DENSE_F32 = "dense-f32le"
# A fedplat.compression Payload (dense, sparse or sketch); decoded by the coordinator
# with the run's compressor, see server/engine.py.
PAYLOAD_V1 = "fedplat-payload-v1"

Decoder = Callable[[bytes, int, Mapping[str, str]], torch.Tensor]
_DECODERS: Registry[torch.Tensor] = Registry("encoding", InvalidArgument)


def register_decoder(encoding: str, decoder: Decoder) -> None:
    _DECODERS.register(encoding, decoder)


def available_encodings() -> list[str]:
    return _DECODERS.available()


def encode_dense(vec: torch.Tensor) -> bytes:
    """``[d]`` tensor -> little-endian float32 bytes (no copy when already f32 LE)."""
    arr = vec.detach().to(torch.float32).contiguous().numpy()
    return arr.astype("<f4", copy=False).tobytes()


def _decode_dense(data: bytes, numel: int, params: Mapping[str, str]) -> torch.Tensor:
    if len(data) != 4 * numel:
        raise InvalidArgument(
            f"dense payload has {len(data)} bytes, layout needs {4 * numel} "
            f"({numel} float32 values)"
        )
    arr = np.frombuffer(data, dtype="<f4")
    # numpy's isfinite is ~8x faster than torch's here; check before copying.
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).sum())
        raise InvalidArgument(f"update holds {bad} non-finite values (NaN or Inf)")
    # Copy: frombuffer over immutable bytes gives a read-only array.
    return torch.from_numpy(arr.astype(np.float32, copy=True))


register_decoder(DENSE_F32, _decode_dense)


def decode(
    encoding: str, data: bytes, numel: int, params: Mapping[str, str] | None = None
) -> torch.Tensor:
    """Decode an update's bytes into a finite ``[numel]`` float32 vector."""
    vec = _DECODERS.get(encoding)(data, numel, params or {})
    if vec.shape != (numel,):
        raise InvalidArgument(
            f"decoded update has shape {list(vec.shape)}, expected [{numel}]"
        )
    if encoding != DENSE_F32:  # the dense decoder checked before copying
        check_finite(vec)
    return vec


def check_finite(vec: torch.Tensor) -> None:
    """Raise :class:`InvalidArgument` if ``vec`` holds NaN or Inf."""
    arr = vec.detach().contiguous().numpy()
    if np.isfinite(arr).all():
        return
    finite = torch.isfinite(vec)
    if not bool(finite.all()):
        raise InvalidArgument(
            f"update holds {int((~finite).sum())} non-finite values (NaN or Inf)"
        )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
