"""Global model construction and server-side evaluation on a held-out set."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from fedplat.server.config import ConfigError, RunConfig

from fedplat.vectors import layout_of, load_vector


@dataclass(frozen=True)
class EvalMetrics:
    accuracy: float
    loss: float
    num_examples: int


def _shape_and_classes(cfg: RunConfig) -> tuple[tuple[int, ...], int]:
    if cfg.model.input_shape is not None and cfg.model.num_classes is not None:
        return tuple(cfg.model.input_shape), cfg.model.num_classes
    from fedplat.data import load_dataset

    ds = load_dataset(cfg.data.dataset, split=cfg.data.eval_split)
    return (
        tuple(cfg.model.input_shape or ds.input_shape),
        cfg.model.num_classes or ds.num_classes,
    )


def build_model(cfg: RunConfig) -> torch.nn.Module:
    """The run's model, initialised deterministically from ``run.seed``."""
    from fedplat.models import create_model

    shape, classes = _shape_and_classes(cfg)
    try:
        return create_model(
            cfg.model.name, shape, classes, seed=cfg.run.seed, **cfg.model.params
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"model {cfg.model.name!r}: {exc}") from exc


class Evaluator:
    """Evaluates a flat weight vector on the coordinator's held-out set."""

    def __init__(self, model: torch.nn.Module, data: object | None) -> None:
        self.model = model
        self.layout = layout_of(model)
        self.data = data

    @classmethod
    def from_config(cls, cfg: RunConfig, model: torch.nn.Module) -> Evaluator:
        from fedplat.data import load_dataset

        ds = load_dataset(cfg.data.dataset, split=cfg.data.eval_split)
        if (
            cfg.data.eval_max_examples is not None
            and len(ds) > cfg.data.eval_max_examples
        ):
            ds = ds.subset(torch.arange(cfg.data.eval_max_examples))
        return cls(model, ds)

    def __call__(self, weights: torch.Tensor) -> EvalMetrics:
        from fedplat.models.training import evaluate

        load_vector(self.model, weights, self.layout)
        res = evaluate(self.model, self.data)  # type: ignore[arg-type]
        return EvalMetrics(float(res.accuracy), float(res.loss), int(res.num_examples))
