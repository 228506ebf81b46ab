"""Evaluation metrics: pure functions of (model outputs, targets), and their registry.

A metric is any callable ``fn(outputs, targets) -> Mapping[str, float]``: it gets
the whole evaluation set at once (so AUC and F1 are exact, not averages of batch
values) and returns one or more named values (``per_class_accuracy`` returns one per
class). Run files name metrics by their registered name or by an import path
``"package.module:fn"`` to a user's own function.

Conventions of the built-in metrics:

* classification: ``outputs`` are logits ``float [N, C]`` (``C >= 2``), ``targets``
  are class indices ``int64 [N]``; a prediction is the arg-max, a class probability
  the softmax;
* regression: ``outputs`` and ``targets`` are floats of the same shape ``[N, ...]``
  (an output ``[N, 1]`` against targets ``[N]`` is accepted).

References for the definitions: AUC as the Mann-Whitney statistic with average ranks
for ties (Hanley & McNeil, Radiology 1982), one-vs-rest macro AUC for more than two
classes (Provost & Domingos 2000, as in scikit-learn's ``multi_class="ovr"``); macro
precision/recall/F1 over the classes that occur in the targets or the predictions
(scikit-learn's ``average="macro"``, a class never predicted having precision 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from fedplat.registry import Registry

MetricFn = Callable[[torch.Tensor, torch.Tensor], Mapping[str, float]]

#: Values where a smaller number is a better model (a utility negates them).
LOWER_IS_BETTER = frozenset({"loss", "mae", "mse", "rmse"})
#: Names the evaluator reports itself; a metric may not return them.
RESERVED = frozenset({"loss", "num_examples"})


class MetricError(ValueError):
    """A metric is unknown, fails, or does not fit the outputs and targets."""


_METRICS: Registry[Mapping[str, float]] = Registry("metric", MetricError, imports=True)


def register_metric(name: str, fn: MetricFn) -> None:
    """Add ``fn`` under ``name``; registering a name twice is an error."""
    _METRICS.register(name, fn)


def available_metrics() -> list[str]:
    """Registered metric names (import paths are accepted besides these)."""
    return _METRICS.available()


def get_metric(name: str) -> MetricFn:
    """The metric registered as ``name`` or imported from ``"pkg.module:fn"``."""
    return _METRICS.get(name)


def is_registered(name: str) -> bool:
    return name in _METRICS


def compute_metrics(
    metrics: Mapping[str, MetricFn], outputs: torch.Tensor, targets: torch.Tensor
) -> dict[str, float]:
    """Every metric's named values, checked: floats, no name given twice.

    Parameters
    ----------
    metrics
        Metric name (as configured) -> function.
    outputs, targets
        The whole evaluation set, ``[N, ...]`` each.

    Raises
    ------
    MetricError
        A metric raised, returned something other than a mapping of names to
        numbers, or returned a name already taken.
    """
    out: dict[str, float] = {}
    for label, fn in metrics.items():
        try:
            values = fn(outputs, targets)
        except MetricError as exc:
            raise MetricError(f"metric {label!r}: {exc}") from None
        except Exception as exc:  # a user's function: name it, never guess
            raise MetricError(
                f"metric {label!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(values, Mapping) or not values:
            raise MetricError(
                f"metric {label!r} must return a non-empty mapping of names to "
                f"floats, got {type(values).__name__}"
            )
        for key, value in values.items():
            if not isinstance(key, str) or not key:
                raise MetricError(f"metric {label!r} returned a bad name {key!r}")
            if key in RESERVED or key in out:
                raise MetricError(f"metric {label!r} returns {key!r}, already taken")
            try:
                out[key] = float(value)
            except (TypeError, ValueError):
                raise MetricError(
                    f"metric {label!r}: value {key!r} is not a number: {value!r}"
                ) from None
    return out


# ----------------------------------------------------------- classification


def _classification(
    outputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits float64 [N, C], targets int64 [N])`` after checking the shapes."""
    if outputs.dim() != 2 or outputs.shape[1] < 2:
        raise MetricError(f"needs logits [N, C] with C >= 2, got {list(outputs.shape)}")
    if targets.shape != (outputs.shape[0],) or torch.is_floating_point(targets):
        raise MetricError(
            f"needs integer targets [{outputs.shape[0]}], got "
            f"{targets.dtype} {list(targets.shape)}"
        )
    if outputs.shape[0] == 0:
        raise MetricError("no examples")
    t = targets.long()
    if int(t.min()) < 0 or int(t.max()) >= outputs.shape[1]:
        raise MetricError(f"targets must lie in [0, {outputs.shape[1]})")
    return outputs.double(), t


def confusion_matrix(
    predictions: torch.Tensor, targets: torch.Tensor, classes: int
) -> torch.Tensor:
    """``int64 [C, C]``: row = true class, column = predicted class."""
    flat = targets.long() * classes + predictions.long()
    return torch.bincount(flat, minlength=classes * classes).view(classes, classes)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Fraction of examples whose arg-max logit is the target, in ``[0, 1]``."""
    logits, t = _classification(outputs, targets)
    return {"accuracy": float((logits.argmax(1) == t).double().mean())}


def per_class_accuracy(
    outputs: torch.Tensor, targets: torch.Tensor
) -> dict[str, float]:
    """``per_class_accuracy.<c>``: accuracy on the examples of class ``c`` (its
    recall), for each class that occurs in the targets."""
    logits, t = _classification(outputs, targets)
    cm = confusion_matrix(logits.argmax(1), t, logits.shape[1])
    support = cm.sum(1)
    return {
        f"per_class_accuracy.{c}": int(cm[c, c]) / int(support[c])
        for c in range(cm.shape[0])
        if int(support[c]) > 0
    }


def _macro(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    logits, t = _classification(outputs, targets)
    cm = confusion_matrix(logits.argmax(1), t, logits.shape[1]).double()
    tp = cm.diagonal()
    predicted, actual = cm.sum(0), cm.sum(1)
    present = (predicted + actual) > 0
    # 0/0 (a class never predicted) counts as 0, scikit-learn's zero_division=0.
    precision = torch.where(predicted > 0, tp / predicted.clamp(min=1), 0.0)
    recall = torch.where(actual > 0, tp / actual.clamp(min=1), 0.0)
    f1 = 2 * tp / (predicted + actual).clamp(min=1)
    return {
        "precision": float(precision[present].mean()),
        "recall": float(recall[present].mean()),
        "f1": float(f1[present].mean()),
    }


def f1(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Macro F1: the mean over classes of ``2 TP / (2 TP + FP + FN)``."""
    return {"f1": _macro(outputs, targets)["f1"]}


def precision(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Macro precision ``TP / (TP + FP)``."""
    return {"precision": _macro(outputs, targets)["precision"]}


def recall(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Macro recall ``TP / (TP + FN)`` (balanced accuracy)."""
    return {"recall": _macro(outputs, targets)["recall"]}


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of ``x`` ``[N]``, ties sharing their average rank (float64)."""
    sorted_x, order = torch.sort(x)
    _, inverse, counts = torch.unique_consecutive(
        sorted_x, return_inverse=True, return_counts=True
    )
    ends = torch.cumsum(counts, 0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    ranks = torch.empty(x.numel(), dtype=torch.float64)
    ranks[order] = mean_rank[inverse]
    return ranks


def binary_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """ROC AUC of ``scores`` ``[N]`` for the boolean labels ``positive`` ``[N]``:
    the probability that a random positive scores above a random negative (ties
    count one half), by the rank-sum (Mann-Whitney) formula."""
    n_pos = int(positive.sum())
    n_neg = positive.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        raise MetricError("AUC needs positive and negative examples")
    rank_sum = float(average_ranks(scores.double())[positive].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def auc(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """ROC AUC: of class 1's probability for two classes; for more, the mean of
    the one-vs-rest AUCs of the classes present in the targets."""
    logits, t = _classification(outputs, targets)
    probs = torch.softmax(logits, dim=1)
    if logits.shape[1] == 2:
        return {"auc": binary_auc(probs[:, 1], t == 1)}
    present = [c for c in range(logits.shape[1]) if bool((t == c).any())]
    if len(present) < 2:
        raise MetricError("AUC needs at least two classes in the targets")
    return {"auc": sum(binary_auc(probs[:, c], t == c) for c in present) / len(present)}


# --------------------------------------------------------------- regression


def _regression(
    outputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    o = outputs
    if o.dim() == targets.dim() + 1 and o.shape[-1] == 1:
        o = o.squeeze(-1)
    if o.shape != targets.shape:
        raise MetricError(
            f"outputs {list(outputs.shape)} do not match targets {list(targets.shape)}"
        )
    if o.numel() == 0:
        raise MetricError("no examples")
    return o.double(), targets.double()


def mae(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Mean absolute error over all entries."""
    o, t = _regression(outputs, targets)
    return {"mae": float((o - t).abs().mean())}


def mse(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Mean squared error over all entries."""
    o, t = _regression(outputs, targets)
    return {"mse": float((o - t).square().mean())}


def rmse(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Root of the mean squared error."""
    return {"rmse": math.sqrt(mse(outputs, targets)["mse"])}


def r2(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Coefficient of determination ``1 - SS_res / SS_tot`` over all entries."""
    o, t = _regression(outputs, targets)
    ss_tot = float((t - t.mean()).square().sum())
    if ss_tot == 0.0:
        raise MetricError("R^2 is undefined for constant targets")
    return {"r2": 1.0 - float((o - t).square().sum()) / ss_tot}


CLASSIFICATION: Sequence[str] = (
    "accuracy",
    "auc",
    "f1",
    "precision",
    "recall",
    "per_class_accuracy",
)
REGRESSION: Sequence[str] = ("mae", "mse", "rmse", "r2")

for _name, _fn in (
    ("accuracy", accuracy),
    ("auc", auc),
    ("f1", f1),
    ("precision", precision),
    ("recall", recall),
    ("per_class_accuracy", per_class_accuracy),
    ("mae", mae),
    ("mse", mse),
    ("rmse", rmse),
    ("r2", r2),
):
    register_metric(_name, _fn)

__all__ = [
    "CLASSIFICATION",
    "LOWER_IS_BETTER",
    "REGRESSION",
    "MetricError",
    "MetricFn",
    "accuracy",
    "auc",
    "available_metrics",
    "average_ranks",
    "binary_auc",
    "compute_metrics",
    "confusion_matrix",
    "f1",
    "get_metric",
    "is_registered",
    "mae",
    "mse",
    "per_class_accuracy",
    "precision",
    "r2",
    "recall",
    "register_metric",
    "rmse",
]
