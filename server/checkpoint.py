"""Checkpoints as safetensors files (never pickle), written atomically.

A checkpoint holds the global model vector, the server optimizer's state and the
aggregator's state, plus string metadata (run id, round, layout JSON).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from fedplat.vectors import Layout


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or belongs to another run/layout."""


@dataclass(frozen=True)
class Checkpoint:
    run_id: str
    round: int
    model_version: int
    layout: Layout
    weights: torch.Tensor  # [d] float32
    optimizer_state: dict[str, torch.Tensor]
    aggregator_state: dict[str, torch.Tensor]
    extra: dict[str, str] = field(default_factory=dict)  # e.g. accountant state JSON


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_writable(directory: str | os.PathLike[str]) -> None:
    """CheckpointError unless files can be created in ``directory`` (made if
    missing): checked when a coordinator starts, not when its first round closes."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=d)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CheckpointError(_os_reason(d, exc)) from None


def _os_reason(d: Path, exc: OSError) -> str:
    if isinstance(exc, FileExistsError):
        return f"cannot write in {d}: {exc.filename} exists and is not a folder"
    return f"cannot write in {d}: {exc.strerror or exc}"


def save_checkpoint(
    directory: str | os.PathLike[str], ckpt: Checkpoint
) -> tuple[str, str]:
    """Write ``round_XXXXXX.safetensors`` atomically; return ``(path, sha256)``.

    A failure to write (the folder gone or read-only, a full disk) is a
    :class:`CheckpointError` naming the folder."""
    d = Path(directory) / ckpt.run_id
    try:
        return _save(d, ckpt)
    except OSError as exc:
        raise CheckpointError(_os_reason(d, exc)) from None
    except SafetensorError as exc:
        raise CheckpointError(f"cannot write in {d}: {exc}") from None


def _save(d: Path, ckpt: Checkpoint) -> tuple[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"round_{ckpt.round:06d}.safetensors"
    tmp = final.with_suffix(".tmp")
    tensors = {"weights": ckpt.weights.contiguous()}
    tensors.update(
        {f"opt.{k}": v.contiguous() for k, v in ckpt.optimizer_state.items()}
    )
    tensors.update(
        {f"agg.{k}": v.contiguous() for k, v in ckpt.aggregator_state.items()}
    )
    meta = {
        **{f"extra.{k}": v for k, v in ckpt.extra.items()},
        "run_id": ckpt.run_id,
        "round": str(ckpt.round),
        "model_version": str(ckpt.model_version),
        "layout": json.dumps(ckpt.layout.to_dict()),
    }
    save_file(tensors, str(tmp), metadata=meta)
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    # Make the rename durable before the store records the round as completed.
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return str(final), _sha256_file(final)


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    expected_sha256: str | None = None,
    expected_layout: Layout | None = None,
) -> Checkpoint:
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint {p} is missing")
    if expected_sha256 is not None and _sha256_file(p) != expected_sha256:
        raise CheckpointError(f"checkpoint {p} does not match its recorded SHA-256")
    try:
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(p))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"checkpoint {p} cannot be read: {exc}") from None
    try:
        layout = Layout.from_dict(json.loads(meta["layout"]))
        ckpt = Checkpoint(
            run_id=meta["run_id"],
            round=int(meta["round"]),
            model_version=int(meta["model_version"]),
            layout=layout,
            weights=tensors["weights"],
            optimizer_state={
                k[4:]: v for k, v in tensors.items() if k.startswith("opt.")
            },
            aggregator_state={
                k[4:]: v for k, v in tensors.items() if k.startswith("agg.")
            },
            extra={k[6:]: v for k, v in meta.items() if k.startswith("extra.")},
        )
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {p} is malformed: {exc}") from exc
    if expected_layout is not None and layout != expected_layout:
        raise CheckpointError(
            f"checkpoint {p} has another model layout: "
            f"{expected_layout.describe_mismatch(layout)}"
        )
    if ckpt.weights.shape != (layout.numel,):
        raise CheckpointError(f"checkpoint {p}: weights do not match the layout")
    return ckpt


def prune_checkpoints(
    directory: str | os.PathLike[str],
    run_id: str,
    keep_last: int,
    protect: set[str] | None = None,
) -> None:
    """Delete all but the newest ``keep_last`` checkpoints of a run."""
    d = Path(directory) / run_id
    files = sorted(d.glob("round_*.safetensors"))
    protect = protect or set()
    for f in files[:-keep_last]:
        if str(f) not in protect:
            f.unlink(missing_ok=True)
