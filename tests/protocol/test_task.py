"""The task config, and the one training schema the run file, gossip and tasks use."""

from __future__ import annotations

import json

import pytest
from fedplat.server.config import RunConfig
from pydantic import ValidationError

from fedplat.config import Strict
from fedplat.gossip.config import PeerConfig
from fedplat.gossip.scenario import Scenario
from fedplat.protocol.task import TaskConfig, TaskConfigError, TrainingSettings


def test_every_training_section_is_the_one_schema() -> None:
    assert RunConfig.model_fields["client_training"].annotation is TrainingSettings
    gossip = Scenario.model_fields["training"].annotation
    assert isinstance(gossip, type) and issubclass(gossip, TrainingSettings)
    # Its own fields, defaults and bounds are the schema's: none redeclared.
    assert {k: repr(f) for k, f in gossip.model_fields.items()} == {
        k: repr(f) for k, f in TrainingSettings.model_fields.items()
    }
    assert PeerConfig(node_id="a").training == TrainingSettings()
    assert issubclass(TrainingSettings, Strict)


def test_training_bounds() -> None:
    t = TrainingSettings()
    assert (t.epochs, t.batch_size, t.lr, t.optimizer, t.momentum, t.max_steps) == (
        1, 32, 0.05, "sgd", 0.0, None,
    )  # fmt: skip
    for bad in (
        {"epochs": 0},
        {"lr": 0},
        {"lr": float("inf")},
        {"momentum": 1.0},
        {"max_steps": 0},
        {"optimizer": "adam", "momentum": 0.9},
        {"weight_decay": 0.1},
    ):
        with pytest.raises(ValidationError):
            TrainingSettings.model_validate(bad)
    assert TrainingSettings(optimizer="adam").momentum == 0.0


def test_task_config_carries_the_settings_through_json() -> None:
    training = TrainingSettings(epochs=2, lr=0.1, momentum=0.5, max_steps=7)
    cfg = TaskConfig(training=training, seed=4)
    data = json.loads(cfg.to_json())
    assert data["training"] == training.model_dump()
    assert TaskConfig.from_json(cfg.to_json()) == cfg
    assert cfg.train_config() == {**training.model_dump(), "seed": 4}
    assert TrainingSettings.from_train_config(cfg.train_config()) == training
    # Missing keys take the schema's defaults; a newer coordinator's keys are
    # left out rather than refusing the task.
    parsed = TaskConfig.from_json('{"training": {"lr": 0.2, "later_knob": 1}}')
    assert parsed.training == TrainingSettings(lr=0.2)


@pytest.mark.parametrize(
    ("training", "match"),
    [
        ({"epochs": True}, "epochs: Input should be a valid integer"),
        ({"epochs": "2"}, "epochs: Input should be a valid integer"),
        ({"batch_size": 0}, "batch_size: Input should be greater than or equal to 1"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"optimizer": "adam", "momentum": 0.9}, "sgd only"),
        ([1], "training must be an object"),
    ],
)
def test_a_bad_training_section_is_a_task_config_error(
    training: object, match: str
) -> None:
    with pytest.raises(TaskConfigError, match=match):
        TaskConfig.from_json(json.dumps({"training": training}))
