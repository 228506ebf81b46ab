"""What the parts of a running coordinator share: one run's components and state.

:func:`build_context` turns a validated config into the run's pieces (model
layout, rule, server optimizer, uplink plan, evaluator, contribution accountant)
and opens or resumes the run (:mod:`fedplat.server.runstate`) through the
recorder it is given, which the composition root built on the store
(:mod:`fedplat.server.app`). The parts write through the recorder and read
through its read port (:attr:`RunContext.reads`); none holds the store.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from fedplat.aggregators import AggregationError, Aggregator
from fedplat.server.config import ConfigError, RunConfig
from fedplat.server.evaluation import Evaluator, build_model, validate_run
from fedplat.server.optimizers import ServerOptimizer
from fedplat.server.reads import StoreReader
from fedplat.server.recorder import Recorder
from fedplat.server.runstate import RunState, open_run
from fedplat.server.uplink_plan import UplinkPlan

from fedplat.contribution import (
    ContributionAccountant,
    load_or_create_signing_key,
    make_utility_from_metric,
)
from fedplat.contribution.utility import UtilityFn
from fedplat.protocol.messages import ModelPayload
from fedplat.vectors import Layout, flatten, layout_of


class ModelCache:
    """The global model encoded once per version, shared by every download."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._lock = threading.Lock()
        self._payload: ModelPayload | None = None
        self._tensor: torch.Tensor | None = None

    def prepare(self, state: RunState) -> ModelPayload:
        with self._lock:
            p = self._payload
            if p is not None and p.model_version == state.model_version:
                return p
            w = state.weights.detach().to(torch.float32).contiguous()
            # The bytes are the tensor's memory (no copy); keep the tensor alive.
            data = w.numpy().view(np.uint8).data
            self._tensor = w
            self._payload = ModelPayload(
                model_version=state.model_version,
                round=state.model_version,
                layout=self.layout,
                data=data,
                sha256=hashlib.sha256(data).hexdigest(),
            )
            return self._payload

    def current(self) -> ModelPayload:
        assert self._payload is not None, "prepare() first"
        return self._payload


@dataclass
class RunContext:
    cfg: RunConfig
    reads: StoreReader
    layout: Layout
    state: RunState
    aggregator: Aggregator
    optimizer: ServerOptimizer
    plan: UplinkPlan
    evaluator: Evaluator
    recorder: Recorder
    model: ModelCache
    contribution: ContributionAccountant | None = None
    utility: UtilityFn | None = None
    clock: Callable[[], float] = field(default=time.time)

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def save_mutable_state(self) -> dict[str, object]:
        """What an aggregation step mutates, to undo a step that failed."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "aggregator": self.aggregator.state_dict(),
        }

    def restore_mutable_state(self, saved: dict[str, object]) -> None:
        self.optimizer.load_state_dict(saved["optimizer"])  # type: ignore[arg-type]
        self.aggregator.load_state_dict(saved["aggregator"])  # type: ignore[arg-type]


def _aggregator(cfg: RunConfig) -> Aggregator:
    try:
        return cfg.aggregator.build()
    except (AggregationError, ValueError) as exc:
        raise ConfigError(f"aggregator: {exc}") from exc


def build_context(
    cfg: RunConfig,
    recorder: Recorder,
    *,
    evaluator: Evaluator | None = None,
    clock: Callable[[], float] = time.time,
) -> RunContext:
    """The run's components, and the run opened or resumed by ``recorder``
    (which writes for it from then on)."""
    # Before anything is stored or any client selected: a model that does not fit
    # its evaluation data is a ConfigError now, not a crash after round 1.
    validate_run(cfg)
    aggregator = _aggregator(cfg)
    model = build_model(cfg)
    layout = layout_of(model)
    optimizer = ServerOptimizer(cfg.server_optimizer, cfg.run.rounds)
    plan = UplinkPlan(cfg, layout)
    evaluator = (
        evaluator if evaluator is not None else Evaluator.from_config(cfg, model)
    )
    reads = recorder.reads
    state = open_run(
        cfg,
        recorder,
        reads,
        layout,
        flatten(model, layout),
        optimizer=optimizer,
        aggregator=aggregator,
        plan=plan,
    )
    ctx = RunContext(
        cfg,
        reads,
        layout,
        state,
        aggregator,
        optimizer,
        plan,
        evaluator,
        recorder,
        ModelCache(layout),
        clock=clock,
    )
    c = cfg.contribution
    if c.enabled:
        key = load_or_create_signing_key(c.key_path) if c.key_path else None
        ctx.contribution = ContributionAccountant(c, reads, state.run_id, key)
        ctx.utility = make_utility_from_metric(evaluator, c.utility)
    return ctx


__all__ = ["ModelCache", "RunContext", "build_context"]
