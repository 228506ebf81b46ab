"""The run's model, its held-out data, and server-side evaluation with any metrics.

:func:`build_model` builds a registered model (``model.name``) or an app's own
(``model.factory``); :func:`load_eval_data` loads a bundled dataset split or calls
the app's ``data.eval`` function; :class:`Evaluator` runs a flat weight vector over
that data in batches and returns an :class:`EvalMetrics` with the loss and every
configured metric. :func:`validate_run` does all of this once on one batch before a
run starts, so a model that does not fit its data is a one-line
:class:`~fedplat.server.config.ConfigError` instead of a crash after round 1.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fedplat.server.config import ConfigError, RunConfig

from fedplat.data.batches import BatchError, Batches
from fedplat.metrics import MetricError, MetricFn, compute_metrics, get_metric
from fedplat.registry import import_path
from fedplat.vectors import layout_of, load_vector

log = logging.getLogger("fedplat.server")


class EvaluationError(ValueError):
    """The model's outputs do not fit the evaluation targets, or a metric failed."""


@dataclass(frozen=True)
class EvalMetrics:
    """One evaluation of the global model.

    Attributes
    ----------
    task : {"classification", "regression"}
    loss : float
        Mean cross-entropy (classification) or mean squared error (regression).
    num_examples : int
    values : dict of str to float
        Every metric value: ``accuracy`` for classification and ``mae`` for
        regression always, plus those of ``evaluation.metrics``.
    """

    task: str
    loss: float
    num_examples: int
    values: Mapping[str, float] = field(default_factory=dict)

    @property
    def accuracy(self) -> float | None:
        """Held-out accuracy in ``[0, 1]`` (``None`` for regression)."""
        return self.values.get("accuracy")

    def value(self, name: str) -> float:
        """``loss`` or a metric value by name (e.g. as a contribution utility)."""
        if name == "loss":
            return self.loss
        if name not in self.values:
            known = ", ".join(["loss", *sorted(self.values)])
            raise MetricError(f"no evaluation value {name!r}; this run has {known}")
        return self.values[name]

    def as_metrics(self, prefix: str = "eval.") -> dict[str, float]:
        """The values for the store's metrics table, named ``eval.<name>``."""
        return {f"{prefix}{k}": v for k, v in self.values.items()}


def load_eval_data(cfg: RunConfig) -> Batches:
    """The coordinator's held-out data: ``data.eval`` or the bundled dataset."""
    d = cfg.data
    if d.eval is None:
        from fedplat.data import load_dataset

        ds = load_dataset(d.dataset, split=d.eval_split)
        return Batches.of(ds, f"{ds.name} {d.eval_split} split")
    fn = import_path(d.eval, ConfigError)
    if not callable(fn):
        raise ConfigError(f"data.eval {d.eval!r} is not callable")
    try:
        obj = fn(**d.eval_params)
    except Exception as exc:  # the app's code: report it on one line
        raise ConfigError(
            f"data.eval {d.eval!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        return Batches.of(obj, f"data.eval {d.eval!r}")
    except BatchError as exc:
        raise ConfigError(str(exc)) from None


def resolve_metrics(cfg: RunConfig) -> dict[str, MetricFn]:
    """``evaluation.metrics`` as name -> function (import paths imported)."""
    try:
        return {name: get_metric(name) for name in cfg.evaluation.metrics}
    except MetricError as exc:
        raise ConfigError(f"evaluation.metrics: {exc}") from None


def _task(cfg: RunConfig, targets: torch.Tensor) -> str:
    if cfg.evaluation.task != "auto":
        return cfg.evaluation.task
    return "regression" if torch.is_floating_point(targets) else "classification"


def _num_classes(cfg: RunConfig, data: Batches, task: str) -> int | None:
    if cfg.model.num_classes is not None:
        return cfg.model.num_classes
    if data.num_classes is not None or task != "classification":
        return data.num_classes
    # Unknown: the largest label of the held-out set (one pass over its targets).
    top = -1
    for _, y in data.iterate(cfg.evaluation.batch_size, cfg.evaluation.max_examples):
        if y.numel() and not torch.is_floating_point(y):
            top = max(top, int(y.max()))
    return top + 1 if top >= 1 else None


def build_model(cfg: RunConfig, data: Batches | None = None) -> torch.nn.Module:
    """The run's model, initialised deterministically from ``run.seed``.

    ``input_shape`` and ``num_classes`` come from ``model`` when set there, else
    from the evaluation data (its first batch, its labels).
    """
    from fedplat.models import ModelSpecError, build_from_factory, create_model

    m = cfg.model
    shape, classes = m.input_shape, m.num_classes
    if shape is None or classes is None:
        data = data if data is not None else load_eval_data(cfg)
        try:
            x, y = data.first(cfg.evaluation.batch_size)
        except BatchError as exc:
            raise ConfigError(str(exc)) from None
        shape = shape or tuple(int(s) for s in x.shape[1:])
        classes = _num_classes(cfg, data, _task(cfg, y))
    try:
        if m.factory is not None:
            return build_from_factory(
                m.factory,
                dict(m.params),
                seed=cfg.run.seed,
                input_shape=shape,
                num_classes=classes,
            )
        assert m.name is not None  # one of the two, by validation
        if classes is None:
            raise ConfigError(f"model {m.name!r} needs model.num_classes")
        return create_model(m.name, shape, classes, seed=cfg.run.seed, **m.params)
    except (ConfigError, ModelSpecError) as exc:
        raise ConfigError(str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"model {m.label!r}: {exc}") from exc


def check_fit(
    output: torch.Tensor, targets: torch.Tensor, task: str, num_classes: int | None
) -> None:
    """Raise :class:`EvaluationError` unless one batch's output fits its targets.

    Classification: logits ``[B, C]`` (floating, ``C`` = ``num_classes`` when
    known) against integer labels ``[B]`` in ``[0, C)``. Regression: floating
    outputs shaped like the targets (``[B, 1]`` against ``[B]`` is accepted).
    """
    out, tgt = list(output.shape), list(targets.shape)
    if not torch.is_floating_point(output):
        raise EvaluationError(f"model output {out} has dtype {output.dtype}, not float")
    if task == "regression":
        squeezed = output.squeeze(-1) if output.dim() == targets.dim() + 1 else output
        if not torch.is_floating_point(targets) or squeezed.shape != targets.shape:
            raise EvaluationError(
                f"model output {out} does not fit regression targets {tgt} "
                f"({targets.dtype}; need float targets shaped like the output)"
            )
        return
    if torch.is_floating_point(targets) or targets.dim() != 1:
        raise EvaluationError(
            f"classification needs integer class labels [B], got targets {tgt} of "
            f"{targets.dtype} (set evaluation.task: regression for real values)"
        )
    with_classes = f" with {num_classes} classes" if num_classes else ""
    if output.dim() != 2 or output.shape[0] != targets.shape[0] or out[1] < 2:
        raise EvaluationError(
            f"model output {out} does not fit targets {tgt}{with_classes} "
            "(need logits [B, C])"
        )
    if num_classes is not None and out[1] != num_classes:
        raise EvaluationError(
            f"model output {out} does not fit targets {tgt}{with_classes}"
        )
    lo, hi = int(targets.min()), int(targets.max())
    if lo < 0 or hi >= out[1]:
        raise EvaluationError(
            f"model output {out} does not fit targets {tgt} with labels in [{lo}, {hi}]"
        )


def _loss(output: torch.Tensor, targets: torch.Tensor, task: str) -> float:
    if task == "classification":
        return float(F.cross_entropy(output.float(), targets.long()))
    if output.dim() == targets.dim() + 1:
        output = output.squeeze(-1)
    return float(F.mse_loss(output.float(), targets.float()))


class Evaluator:
    """Evaluates flat weight vectors of ``model`` on held-out ``data``.

    Outputs and targets of the whole set (at most ``max_examples``) are kept, so
    metrics such as AUC are exact; the forward passes go in ``batch_size`` chunks.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data: Batches,
        *,
        metrics: Mapping[str, MetricFn] | None = None,
        task: str = "classification",
        num_classes: int | None = None,
        batch_size: int = 1024,
        max_examples: int | None = None,
    ) -> None:
        self.model = model
        self.layout = layout_of(model)
        self.data = data
        self.task = task
        self.num_classes = num_classes
        self.batch_size = batch_size
        self.max_examples = max_examples
        default = "accuracy" if task == "classification" else "mae"
        self.metrics = {default: get_metric(default), **dict(metrics or {})}

    @classmethod
    def from_config(
        cls, cfg: RunConfig, model: torch.nn.Module, data: Batches | None = None
    ) -> Evaluator:
        data = data if data is not None else load_eval_data(cfg)
        e = cfg.evaluation
        try:
            _, y = data.first(e.batch_size)
        except BatchError as exc:
            raise ConfigError(str(exc)) from None
        task = _task(cfg, y)
        return cls(
            model,
            data,
            metrics=resolve_metrics(cfg),
            task=task,
            num_classes=_num_classes(cfg, data, task),
            batch_size=e.batch_size,
            max_examples=e.max_examples,
        )

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's outputs and the targets over the whole set, as is."""
        device = next((p.device for p in self.model.parameters()), None)
        was_training = self.model.training
        self.model.eval()
        outs, ys = [], []
        try:
            with torch.no_grad():
                for x, y in self.data.iterate(self.batch_size, self.max_examples):
                    out = self.model(x if device is None else x.to(device))
                    if not isinstance(out, torch.Tensor):
                        raise EvaluationError(
                            f"model returned {type(out).__name__}, not a tensor"
                        )
                    check_fit(out, y, self.task, self.num_classes)
                    outs.append(out.detach().cpu())
                    ys.append(y)
        finally:
            self.model.train(was_training)
        if not outs:
            raise EvaluationError(f"{self.data.description} is empty")
        return torch.cat(outs), torch.cat(ys)

    def evaluate_model(self) -> EvalMetrics:
        """Loss and metrics of ``self.model`` with its current weights."""
        out, y = self.outputs()
        values = compute_metrics(self.metrics, out, y)
        return EvalMetrics(self.task, _loss(out, y, self.task), int(y.shape[0]), values)

    def __call__(self, weights: torch.Tensor) -> EvalMetrics:
        """Loss and metrics of the flat weight vector ``weights`` ``[d]``."""
        load_vector(self.model, weights, self.layout)
        return self.evaluate_model()


@dataclass(frozen=True)
class ValidationReport:
    """What :func:`validate_run` checked (for logs and tests)."""

    task: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    num_classes: int | None
    initial: EvalMetrics


def validate_run(cfg: RunConfig) -> ValidationReport:
    """Build the model and run it on the evaluation data before any client trains.

    Checks, in order: the metrics import, the evaluation data loads and yields
    ``(inputs, targets)`` pairs, the model builds, one batch goes through it with
    inputs of the parameters' dtype, the output fits the targets (shape, dtype,
    classes), the loss is finite, every metric runs on the whole set and the
    contribution utility names one of its values.

    Raises
    ------
    ConfigError
        One line naming the first problem, e.g. ``model output [32, 2] does not
        fit targets [32] with 3 classes``.
    """
    resolve_metrics(cfg)  # import errors first: they are the cheapest to find
    data = load_eval_data(cfg)
    model = build_model(cfg, data)
    try:
        x, y = data.first(cfg.evaluation.batch_size)
    except BatchError as exc:
        raise ConfigError(str(exc)) from None
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    if param is not None and torch.is_floating_point(x) and x.dtype != param.dtype:
        raise ConfigError(
            f"evaluation inputs are {x.dtype} but the model's parameters are "
            f"{param.dtype}: convert the inputs in data.eval (e.g. x.float())"
        )
    evaluator = Evaluator.from_config(cfg, model, data)
    try:
        model.eval()
        with torch.no_grad():
            out = model(x)
        if not isinstance(out, torch.Tensor):
            raise EvaluationError(f"model returned {type(out).__name__}, not a tensor")
        check_fit(out, y, evaluator.task, evaluator.num_classes)
        loss = _loss(out, y, evaluator.task)
        if not torch.isfinite(torch.tensor(loss)):
            raise EvaluationError(f"loss on the first evaluation batch is {loss}")
        initial = evaluator.evaluate_model()
        if cfg.contribution.enabled:
            initial.value(cfg.contribution.utility)
    except (EvaluationError, MetricError, BatchError) as exc:
        raise ConfigError(str(exc)) from None
    except Exception as exc:  # the model's own forward: one clear line
        raise ConfigError(
            f"model {cfg.model.label!r} failed on an evaluation batch of inputs "
            f"{list(x.shape)}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from exc
    log.info(
        "run %s validated: %s, inputs %s -> outputs %s, initial loss %.4f",
        cfg.run.name,
        evaluator.task,
        list(x.shape[1:]),
        list(out.shape[1:]),
        initial.loss,
    )
    return ValidationReport(
        evaluator.task,
        tuple(int(s) for s in x.shape[1:]),
        tuple(int(s) for s in out.shape),
        evaluator.num_classes,
        initial,
    )
