"""Export a run's model as a file plain torch (or onnxruntime) loads without fedplat.

The model comes from the checkpoint the store recorded for the chosen round (the
last completed round, the best evaluated one, or a given number); the file's
SHA-256 is checked against the store before it is read. Formats:

* ``safetensors``: the named tensors of the model's ``state_dict`` (floating
  entries, i.e. everything that was trained), read with
  ``safetensors.torch.load_file``; run name and round in the metadata;
* ``torch``: the same ``state_dict`` written by ``torch.save``, loadable with
  torch's ``load`` with ``weights_only=True`` (no code is unpickled);
* ``onnx``: the model itself, built from the run's stored config by the same
  factory the coordinator used, with a dynamic batch dimension (input ``input``,
  output ``output``); needs ``pip install 'fedplat[export]'``.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# torch, safetensors and the store are imported where they are used: the CLI
# reads FORMATS to build its parser, and `fedplat --help` should not load torch.
if TYPE_CHECKING:
    import torch

    from fedplat.store import RoundRecord, RunRecord, Store
    from fedplat.vectors import Layout

FORMATS = ("safetensors", "torch", "onnx")


class ExportError(ValueError):
    """No such round or checkpoint, a checkpoint that fails its check, a bad format."""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_model` wrote."""

    path: Path
    format: str
    run_name: str
    round: int
    accuracy: float | None
    loss: float | None
    num_tensors: int
    checkpoint_sha256: str


def pick_round(
    store: Store,
    run: RunRecord,
    *,
    number: int | None = None,
    best: bool = False,
    metric: str | None = None,
    lowest: bool | None = None,
) -> RoundRecord:
    """The completed round to export: ``number``, the best evaluated one, or the
    last one.

    "Best" is :func:`fedplat.best.best_round`'s: by ``metric`` (any metric a
    completed round has; highest wins unless ``lowest`` or the name says less is
    better), or without one the highest accuracy, else the lowest loss. A
    ``metric`` the run never recorded raises naming those it has.
    """
    done = [r for r in store.list_rounds(run.id) if r.status == "completed"]
    if not done:
        raise ExportError(f"run {run.name!r} has no completed round")
    if number is not None:
        for r in done:
            if r.number == number:
                return r
        raise ExportError(
            f"round {number} of run {run.name!r} is not a completed round "
            f"(completed: {done[0].number}..{done[-1].number})"
        )
    if not best:
        return done[-1]
    from fedplat.best import best_round, round_metric_names

    metrics = store.list_metrics(run.id) if metric is not None else []
    if metric is not None and metric not in round_metric_names(done, metrics):
        known = ", ".join(round_metric_names(done, metrics)) or "none"
        raise ExportError(
            f"run {run.name!r} has no metric {metric!r} in a completed round; "
            f"it has: {known}"
        )
    found = best_round(done, metrics, metric=metric, lowest=lowest)
    if found is None:
        raise ExportError(f"run {run.name!r} has no evaluated round to call best")
    return found


def checkpoint_state(
    run: RunRecord, rec: RoundRecord
) -> tuple[dict[str, torch.Tensor], Layout]:
    """The named tensors of round ``rec``'s checkpoint, verified against the store
    (SHA-256 and the run's layout)."""
    from fedplat.server.checkpoint import CheckpointError, load_checkpoint
    from fedplat.vectors import Layout, LayoutError, unflatten

    if rec.checkpoint_path is None or rec.checkpoint_sha256 is None:
        raise ExportError(f"round {rec.number} of run {run.name!r} has no checkpoint")
    if not Path(rec.checkpoint_path).is_file():
        raise ExportError(
            f"the checkpoint of round {rec.number} is gone ({rec.checkpoint_path}): "
            "the coordinator keeps only the newest checkpoints.keep_last rounds"
        )
    try:
        layout = Layout.from_dict(run.layout)
        ckpt = load_checkpoint(
            rec.checkpoint_path,
            expected_sha256=rec.checkpoint_sha256,
            expected_layout=layout,
        )
    except (CheckpointError, LayoutError) as exc:
        raise ExportError(str(exc)) from None
    state = {
        k: v.clone().contiguous() for k, v in unflatten(ckpt.weights, layout).items()
    }
    return state, layout


def _onnx(run: RunRecord, weights: torch.Tensor, layout: Layout, out: Path) -> None:
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter needs it)
    except ImportError:
        raise ExportError(
            "ONNX export needs the export extra: pip install 'fedplat[export]'"
        ) from None
    from fedplat.server.config import ConfigError, parse_config
    from fedplat.server.evaluation import build_model, load_eval_data
    from fedplat.vectors import load_vector

    try:
        cfg = parse_config(run.config, f"the stored config of run {run.name!r}")
        data = load_eval_data(cfg)
        model = build_model(cfg, data)
        x, _ = data.first(2)
    except ConfigError as exc:
        raise ExportError(f"cannot rebuild the model for ONNX: {exc}") from None
    load_vector(model, weights, layout)
    model.eval()
    import torch

    batch = torch.export.Dim("batch")
    # The exporter reports its progress on stdout: keep the CLI's output clean.
    with contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(
            model,
            (x,),
            dynamo=True,
            input_names=["input"],
            output_names=["output"],
            dynamic_shapes=({0: batch},),
            verbose=False,
        )
    if program is None:
        raise ExportError("the ONNX exporter returned nothing")
    program.save(str(out))


def export_model(
    store: Store,
    run_ref: str,
    fmt: str,
    out: str | Path,
    *,
    number: int | None = None,
    best: bool = False,
    metric: str | None = None,
    lowest: bool | None = None,
) -> ExportResult:
    """Write run ``run_ref``'s model (name or id) to ``out`` in format ``fmt``
    (which round: see :func:`pick_round`)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    run = store.get_run(run_ref) or store.get_run_by_name(run_ref)
    if run is None:
        raise ExportError(f"no run named or with id {run_ref!r}")
    rec = pick_round(store, run, number=number, best=best, metric=metric, lowest=lowest)
    state, layout = checkpoint_state(run, rec)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"run": run.name, "round": str(rec.number)}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path), metadata=meta)
    elif fmt == "torch":
        import torch

        torch.save(state, path)
    else:
        from fedplat.vectors import flatten

        _onnx(run, flatten(state, layout), layout, path)
    assert rec.checkpoint_sha256 is not None  # checked by checkpoint_state
    return ExportResult(
        path,
        fmt,
        run.name,
        rec.number,
        rec.accuracy,
        rec.loss,
        len(state),
        rec.checkpoint_sha256,
    )


__all__ = ["FORMATS", "ExportError", "ExportResult", "export_model", "pick_round"]
