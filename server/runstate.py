"""Open a run, or resume it from its last completed round's checkpoint.

A run is identified by its name. Restarting the coordinator with the same config
resumes after the last completed round: the global model, the server optimizer's
and the aggregator's state and the privacy accountant come back from the
checkpoint (safetensors, SHA-256 checked against the store). A larger
``run.rounds`` extends a run (also a finished one); a smaller one than the rounds
already completed is refused. The run is read through the read port
(:class:`~fedplat.server.reads.RunReads`) and created, resized or completed by
the recorder, which writes for it from then on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from fedplat.aggregators import Aggregator
from fedplat.server.checkpoint import CheckpointError, load_checkpoint
from fedplat.server.config import ConfigError, RunConfig
from fedplat.server.optimizers import ServerOptimizer
from fedplat.server.reads import RunReads, RunRecord
from fedplat.server.recorder import Recorder
from fedplat.server.uplink_plan import UplinkPlan

from fedplat.vectors import Layout

log = logging.getLogger("fedplat.server")


@dataclass
class RunState:
    """The run's record and where its model stands."""

    record: RunRecord
    weights: torch.Tensor  # [d] the current global model
    model_version: int  # rounds completed
    finished: bool
    # The last checkpoint's ``extra`` metadata (the next round's norm bound
    # reference, fedplat.server.bounds, is read from it).
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.record.id


def open_run(
    cfg: RunConfig,
    recorder: Recorder,
    reads: RunReads,
    layout: Layout,
    weights: torch.Tensor,
    *,
    optimizer: ServerOptimizer,
    aggregator: Aggregator,
    plan: UplinkPlan,
) -> RunState:
    """The run named in ``cfg``: created, or resumed (state loaded in place);
    ``recorder`` writes for it from then on."""
    existing = reads.get_run_by_name(cfg.run.name)
    if existing is None:
        run = recorder.create_run(
            cfg.run.name, cfg.model_dump(mode="json"), layout.to_dict(), cfg.run.rounds
        )
        recorder.event(
            "run_created",
            f"run {cfg.run.name!r}: {cfg.run.rounds} rounds, "
            f"model {cfg.model.label} ({layout.numel} parameters)",
        )
        recorder.flush()
        return RunState(run, weights, 0, False)
    stored_layout = Layout.from_dict(existing.layout)
    if stored_layout != layout:
        raise ConfigError(
            f"run {cfg.run.name!r} already exists with another model layout "
            f"({stored_layout.describe_mismatch(layout)}); choose a new run name"
        )
    recorder.attach(existing.id)
    last = reads.last_completed_round(existing.id)
    done = 0 if last is None else last.number
    version = 0
    extra: dict[str, str] = {}
    if last is not None:
        if last.checkpoint_path is None:
            raise CheckpointError(f"round {last.number} completed without a checkpoint")
        ckpt = load_checkpoint(
            last.checkpoint_path,
            expected_sha256=last.checkpoint_sha256,
            expected_layout=layout,
        )
        weights = ckpt.weights.clone()
        optimizer.load_state_dict(ckpt.optimizer_state)
        aggregator.load_state_dict(ckpt.aggregator_state)
        plan.load_state(ckpt.extra)
        version, extra = ckpt.model_version, dict(ckpt.extra)
    run = _reconcile_rounds(cfg, recorder, existing, done)
    finished = done >= cfg.run.rounds
    if finished:
        if run.status != "completed":
            run = recorder.finish_run("completed")
    else:
        recorder.event(
            "run_resumed", f"resuming run {cfg.run.name!r} after round {done}"
        )
        recorder.flush()
        log.info("resuming run %s after round %d", cfg.run.name, done)
    return RunState(run, weights, version, finished, extra)


def _reconcile_rounds(
    cfg: RunConfig, recorder: Recorder, run: RunRecord, done: int
) -> RunRecord:
    """Apply a changed ``run.rounds``: extend the run, or refuse to shrink it."""
    want = cfg.run.rounds
    if want == run.total_rounds:
        return run
    if want < done:
        raise ConfigError(
            f"run {cfg.run.name!r} already completed {done} rounds; run.rounds "
            f"{want} would cut it short (give at least {done}, or a new run name)"
        )
    recorder.event(
        "run_extended" if want > run.total_rounds else "run_shortened",
        f"run {cfg.run.name!r}: total rounds {run.total_rounds} -> {want}",
    )
    reopen = run.status == "completed" and want > done
    return recorder.resize_run(want, reopen=reopen)


__all__ = ["RunState", "open_run"]
