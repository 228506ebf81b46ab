"""Evaluation metrics on hand-checkable inputs, and against scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from fedplat.metrics import (
    MetricError,
    available_metrics,
    average_ranks,
    compute_metrics,
    get_metric,
)


def _logits(pred: list[int], classes: int) -> torch.Tensor:
    """Logits whose arg-max is ``pred``."""
    return torch.nn.functional.one_hot(torch.tensor(pred), classes).float()


def test_accuracy_and_per_class_accuracy_by_hand() -> None:
    # targets 0 0 1 1 2, predictions 0 1 1 1 0: 3 of 5 right; class 0: 1/2,
    # class 1: 2/2, class 2: 0/1.
    out, y = _logits([0, 1, 1, 1, 0], 3), torch.tensor([0, 0, 1, 1, 2])
    assert get_metric("accuracy")(out, y) == {"accuracy": 0.6}
    assert get_metric("per_class_accuracy")(out, y) == {
        "per_class_accuracy.0": 0.5,
        "per_class_accuracy.1": 1.0,
        "per_class_accuracy.2": 0.0,
    }
    # A class absent from the targets has no accuracy (not a made-up 0).
    assert "per_class_accuracy.3" not in get_metric("per_class_accuracy")(
        _logits([0, 1], 4), torch.tensor([0, 1])
    )


def test_macro_f1_precision_recall_by_hand() -> None:
    # Same example. Class 0: TP 1, FP 1, FN 1 -> P 1/2, R 1/2, F1 1/2.
    # Class 1: TP 2, FP 1, FN 0 -> P 2/3, R 1, F1 4/5. Class 2: TP 0 -> 0, 0, 0.
    out, y = _logits([0, 1, 1, 1, 0], 3), torch.tensor([0, 0, 1, 1, 2])
    assert get_metric("f1")(out, y)["f1"] == pytest.approx((0.5 + 0.8 + 0) / 3)
    assert get_metric("precision")(out, y)["precision"] == pytest.approx(
        (0.5 + 2 / 3 + 0) / 3
    )
    assert get_metric("recall")(out, y)["recall"] == pytest.approx(0.5)


def test_binary_auc_by_hand_with_a_tie() -> None:
    # Positives score 0.9 and 0.4, negatives 0.4 and 0.1: of the 4 pairs, 3 are
    # ordered right and one is a tie (1/2) -> AUC 3.5 / 4.
    p1 = torch.tensor([0.9, 0.4, 0.4, 0.1])
    out = torch.stack([torch.log1p(-p1), torch.log(p1)], 1)  # softmax gives p1
    y = torch.tensor([1, 1, 0, 0])
    assert get_metric("auc")(out, y)["auc"] == pytest.approx(0.875)


def test_multiclass_auc_is_the_one_vs_rest_mean() -> None:
    # Perfectly ranked for every class -> 1; reversed scores -> 0.
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    out = 5 * torch.nn.functional.one_hot(y, 3).float()
    assert get_metric("auc")(out, y)["auc"] == pytest.approx(1.0)
    assert get_metric("auc")(-out, y)["auc"] == pytest.approx(0.0)


def test_average_ranks_share_ties() -> None:
    assert average_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [
        3.5,
        1.0,
        3.5,
        2.0,
    ]


def test_regression_metrics_by_hand() -> None:
    out = torch.tensor([[1.0], [2.0], [4.0]])  # [N, 1] against targets [N]
    y = torch.tensor([1.0, 3.0, 2.0])  # errors 0, -1, 2
    assert get_metric("mae")(out, y) == {"mae": 1.0}
    assert get_metric("mse")(out, y) == {"mse": pytest.approx(5 / 3)}
    assert get_metric("rmse")(out, y)["rmse"] == pytest.approx(math.sqrt(5 / 3))
    # SS_res 5, SS_tot (1-2)^2 + (3-2)^2 + 0 = 2 -> 1 - 5/2.
    assert get_metric("r2")(out, y)["r2"] == pytest.approx(-1.5)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 5),
    st.lists(st.integers(0, 10_000), min_size=6, max_size=40),
    st.integers(0, 2**31 - 1),
)
def test_classification_metrics_match_scikit_learn(
    classes: int, raw: list[int], seed: int
) -> None:
    y = torch.tensor([r % classes for r in raw])
    if len(set(y.tolist())) < 2:
        y[0], y[1] = 0, 1
    g = torch.Generator().manual_seed(seed)
    # Rounded logits: ties in scores happen and must be handled like sklearn.
    out = torch.round(torch.randn(len(raw), classes, generator=g) * 2) / 2
    pred, yn = out.argmax(1).numpy(), y.numpy()
    got = compute_metrics(
        {n: get_metric(n) for n in ("accuracy", "f1", "precision", "recall", "auc")},
        out,
        y,
    )
    assert got["accuracy"] == pytest.approx(skm.accuracy_score(yn, pred))
    for name, fn in (
        ("f1", skm.f1_score),
        ("precision", skm.precision_score),
        ("recall", skm.recall_score),
    ):
        labels = np.union1d(yn, pred)
        want = fn(yn, pred, average="macro", labels=labels, zero_division=0)
        assert got[name] == pytest.approx(want)
    probs = torch.softmax(out.double(), 1).numpy()
    present = np.unique(yn)
    if classes == 2:
        want_auc = skm.roc_auc_score(yn, probs[:, 1])
    else:
        want_auc = np.mean([skm.roc_auc_score(yn == c, probs[:, c]) for c in present])
    assert got["auc"] == pytest.approx(want_auc)


def test_compute_metrics_errors_are_one_clear_line() -> None:
    out, y = _logits([0, 1], 2), torch.tensor([0, 1])
    with pytest.raises(MetricError, match=r"'mae'.*do not match"):
        compute_metrics({"mae": get_metric("mae")}, out, y)
    with pytest.raises(MetricError, match="already taken"):
        compute_metrics({"a": lambda o, t: {"loss": 1.0}}, out, y)
    with pytest.raises(MetricError, match="non-empty mapping"):
        compute_metrics({"a": lambda o, t: 0.5}, out, y)  # type: ignore[dict-item,return-value]
    with pytest.raises(MetricError, match=r"auc.*positive and negative"):
        compute_metrics({"auc": get_metric("auc")}, out, torch.tensor([1, 1]))
    with pytest.raises(MetricError, match="failed: ZeroDivisionError"):
        compute_metrics({"bad": lambda o, t: {"x": 1 / 0}}, out, y)


def test_registry_lists_standard_metrics_and_imports_paths() -> None:
    assert {"accuracy", "auc", "f1", "mae", "per_class_accuracy"} <= set(
        available_metrics()
    )
    assert get_metric("fedplat.metrics:mae") is get_metric("mae")
    with pytest.raises(MetricError, match="unknown metric 'nope'"):
        get_metric("nope")
