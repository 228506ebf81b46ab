"""Persist a compressor's state with safetensors (never pickle).

Tensors go into the safetensors body; JSON-able scalars go into its string
metadata under one key, so a restarted client reloads exactly what it saved.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fedplat.compression.base import CompressionError, StateDict, StateValue

__all__ = ["load_state", "save_state"]

_SCALARS_KEY = "fedplat.compression.scalars"


def save_state(path: str | os.PathLike[str], state: Mapping[str, StateValue]) -> None:
    """Write ``state`` (tensors + scalars) to ``path`` atomically."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, int | float | str | bool] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            tensors[key] = value.detach().contiguous()
        elif isinstance(value, bool | int | float | str):
            scalars[key] = value
        else:
            raise CompressionError(f"state {key!r} has unsupported type {type(value)}")
    tmp = f"{os.fspath(path)}.tmp"
    save_file(tensors, tmp, metadata={_SCALARS_KEY: json.dumps(scalars)})
    os.replace(tmp, path)


def load_state(path: str | os.PathLike[str]) -> StateDict:
    """Read a state written by :func:`save_state`."""
    out: StateDict = {}
    with safe_open(os.fspath(path), framework="pt") as f:
        meta = f.metadata() or {}
        for key in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
            out[key] = f.get_tensor(key)
    try:
        scalars = json.loads(meta.get(_SCALARS_KEY, "{}"))
    except json.JSONDecodeError as exc:
        raise CompressionError(f"corrupt scalar metadata in {path}: {exc}") from exc
    if not isinstance(scalars, dict):
        raise CompressionError(f"corrupt scalar metadata in {path}")
    for key, value in scalars.items():
        if key in out or not isinstance(value, bool | int | float | str):
            raise CompressionError(f"corrupt scalar {key!r} in {path}")
        out[key] = value
    return out
