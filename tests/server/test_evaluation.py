"""Server-side evaluation: any model on any-shaped data, any metrics, and the
start-of-run validation that turns a model/data mismatch into a ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fedplat.server.config import ConfigError, RunConfig, parse_config
from fedplat.server.coordinator import Coordinator
from fedplat.server.evaluation import (
    Evaluator,
    build_model,
    load_eval_data,
    validate_run,
)
from fedplat.server.recorder import Recorder

from fedplat.store import Store
from tests.support import run_config

APP = "tests.apps.plugins"


def _cfg(tmp_path: Path, **sections: Any) -> RunConfig:
    raw = run_config(tmp_path)
    for k, v in sections.items():
        raw[k] = v  # whole sections, not merged
    return parse_config(raw)


def _table(tmp_path: Path, kind: str = "tensors", **extra: Any) -> RunConfig:
    return _cfg(
        tmp_path,
        model={"factory": f"{APP}:table_mlp", "params": {"hidden": 8}},
        data={
            "dataset": "digits",
            "eval": f"{APP}:digits_table",
            "eval_params": {"kind": kind},
        },
        **extra,
    )


@pytest.mark.parametrize("kind", ["tensors", "dataset", "loader"])
def test_any_eval_data_kind_gives_the_same_result(tmp_path: Path, kind: str) -> None:
    cfg = _table(
        tmp_path,
        kind,
        evaluation={"metrics": ["f1", "auc", f"{APP}:top2_accuracy"], "batch_size": 64},
    )
    report = validate_run(cfg)
    assert report.task == "classification" and report.input_shape == (64,)
    assert report.num_classes == 10
    ev = Evaluator.from_config(cfg, build_model(cfg))
    res = ev.evaluate_model()
    assert res.num_examples == 200
    assert set(res.values) == {"accuracy", "f1", "auc", "top2"}
    # Every source is the same 200 digits: the results are identical.
    ref = Evaluator.from_config(
        _table(
            tmp_path,
            "tensors",
            evaluation={"metrics": ["f1", "auc", f"{APP}:top2_accuracy"]},
        ),
        build_model(cfg),
    )
    assert ref.evaluate_model() == res
    assert res.value("loss") == res.loss and res.accuracy == res.values["accuracy"]


def test_accuracy_and_loss_agree_with_a_hand_computation(tmp_path: Path) -> None:
    cfg = _table(tmp_path, evaluation={"max_examples": 30, "batch_size": 7})
    model = build_model(cfg)
    res = Evaluator.from_config(cfg, model).evaluate_model()
    x, y = load_eval_data(cfg).tensors  # type: ignore[misc]
    with torch.no_grad():
        logits = model(x[:30])
    assert res.num_examples == 30
    assert res.accuracy == pytest.approx(
        float((logits.argmax(1) == y[:30]).float().mean())
    )
    assert res.loss == pytest.approx(
        float(torch.nn.functional.cross_entropy(logits, y[:30])), rel=1e-5
    )


def test_regression_reports_mse_loss_and_mae(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        model={"factory": f"{APP}:regressor"},
        data={"dataset": "digits", "eval": f"{APP}:diabetes_table"},
        evaluation={"metrics": ["rmse", "r2"]},
    )
    report = validate_run(cfg)
    assert report.task == "regression" and report.num_classes is None
    res = Evaluator.from_config(cfg, build_model(cfg)).evaluate_model()
    assert res.accuracy is None and set(res.values) == {"mae", "rmse", "r2"}
    assert res.loss == pytest.approx(res.values["rmse"] ** 2, rel=1e-5)
    with pytest.raises(ValueError, match="no evaluation value 'accuracy'"):
        res.value("accuracy")


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"model": {"factory": f"{APP}:two_logits"}},
            r"^model output \[64, 2\] does not fit targets \[64\] with 10 classes",
        ),
        (
            {"model": {"factory": f"{APP}:broken"}},
            r"failed on an evaluation batch of inputs \[64, 64\]: RuntimeError",
        ),
        (
            {
                "model": {"factory": f"{APP}:two_logits"},
                "evaluation": {"task": "regression"},
            },
            r"output \[200, 2\] does not fit regression targets \[200\]",
        ),
        (
            {
                "data": {
                    "dataset": "digits",
                    "eval": f"{APP}:digits_table",
                    "eval_params": {"kind": "float64"},
                }
            },
            "inputs are torch.float64 but the model's parameters are torch.float32",
        ),
        (
            {"data": {"dataset": "digits", "eval": f"{APP}:nope"}},
            "has no attribute 'nope'",
        ),
        (
            {
                "data": {
                    "dataset": "digits",
                    "eval": f"{APP}:digits_table",
                    "eval_params": {"bogus": 1},
                }
            },
            "data.eval .* failed: TypeError",
        ),
        (
            {"evaluation": {"metrics": ["tests.apps.missing:fn"]}},
            "cannot import 'tests.apps.missing'",
        ),
        (
            {"contribution": {"enabled": True, "utility": "auc", "key_path": None}},
            "no evaluation value 'auc'",
        ),
    ],
)
def test_validation_names_the_problem_on_one_line(
    tmp_path: Path, sections: dict[str, Any], message: str
) -> None:
    raw = {
        "model": {"factory": f"{APP}:table_mlp"},
        "data": {"dataset": "digits", "eval": f"{APP}:digits_table"},
        "evaluation": {"batch_size": 64},
    }
    raw.update(sections)
    cfg = _cfg(tmp_path, **raw)
    with pytest.raises(ConfigError, match=message) as err:
        validate_run(cfg)
    assert "\n" not in str(err.value)


def test_a_mismatched_run_never_starts(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        model={"factory": f"{APP}:two_logits"},
        data={"dataset": "digits", "eval": f"{APP}:digits_table"},
    )
    store = Store(str(tmp_path / "s.db"))
    with pytest.raises(ConfigError, match="does not fit targets"):
        Coordinator(cfg, Recorder(store))
    assert store.list_runs() == []  # nothing recorded, nobody selected
    store.close()


def test_registered_models_take_shape_and_classes_from_the_data(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        model={"name": "mlp", "params": {"hidden": [8]}},
        data={"dataset": "digits"},
    )
    model = build_model(cfg)
    assert model.net[-1].out_features == 10  # type: ignore[index,union-attr]
    assert validate_run(cfg).input_shape == (1, 8, 8)


def test_every_metric_value_is_stored_each_evaluated_round(tmp_path: Path) -> None:
    from fedplat.sim import simulate
    from tests.support import digits_client

    raw = run_config(tmp_path, rounds=2, clients=2)
    raw["evaluation"] = {
        "metrics": ["f1", "per_class_accuracy", f"{APP}:top2_accuracy"]
    }
    cfg = parse_config(raw)
    res = simulate(cfg, lambda i, f: digits_client(i, f, 2), 2)
    store = Store(cfg.store.url, migrate=False)
    names = {m.name for m in store.list_metrics(res.run_id)}
    rounds = store.list_rounds(res.run_id)
    top2 = [m.value for m in store.list_metrics(res.run_id, "eval.top2")]
    store.close()
    assert {
        "eval.accuracy",
        "eval.f1",
        "eval.top2",
        "eval.per_class_accuracy.9",
    } <= names
    assert len(top2) == 2 and all(
        t >= r.accuracy for t, r in zip(top2, rounds, strict=True)
    )


def test_contribution_utility_is_any_named_value() -> None:
    from fedplat.server.evaluation import EvalMetrics

    from fedplat.contribution import make_utility_from_metric

    result = EvalMetrics("regression", 4.0, 10, {"mae": 1.5, "r2": 0.25})
    assert make_utility_from_metric(lambda w: result, "r2")(torch.zeros(1)) == 0.25
    # Lower is better for loss and errors: the utility is their negation.
    assert make_utility_from_metric(lambda w: result, "mae")(torch.zeros(1)) == -1.5
    assert make_utility_from_metric(lambda w: result, "loss")(torch.zeros(1)) == -4.0
