"""The typed contract of a training task: what the coordinator asks of a client.

:class:`TaskConfig` travels as JSON in every task (``Task.config_json`` on the
wire) and is parsed here, in one place, on both sides: the client's training
settings, the uplink's compression and privacy, and the seeds. A client's
``train_fn`` sees :meth:`TaskConfig.train_config` (epochs, batch size, learning
rate, optimizer, momentum, step cap and the per-round seed).

:class:`TrainingSettings` is the one definition of local training's fields,
defaults and bounds: the run file's ``client_training`` section, a gossip
scenario's ``training`` section and a gossip peer's settings are this model, and
a task carries it as is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from fedplat.config import Strict, validation_message


class TaskConfigError(ValueError):
    """A task config is not valid JSON of the expected shape."""


class TrainingSettings(Strict):
    """Local training of one round (see the module docstring for its users).

    Attributes
    ----------
    epochs
        Passes over the local data.
    batch_size
    lr
        Learning rate, finite and > 0.
    optimizer
        ``"sgd"`` or ``"adam"``.
    momentum
        SGD momentum in ``[0, 1)``; 0 with Adam (which has no such knob).
    max_steps
        Stop after this many optimizer steps, even mid-epoch (``None``: no cap).
    """

    epochs: int = Field(default=1, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=0.05, gt=0, allow_inf_nan=False)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(default=0.0, ge=0, lt=1)
    max_steps: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _momentum_is_sgds(self) -> TrainingSettings:
        # fedplat.models.make_optimizer refuses it: every client would fail.
        if self.optimizer == "adam" and self.momentum != 0:
            raise ValueError("momentum applies to optimizer sgd only; set it to 0")
        return self

    @property
    def is_plain_sgd(self) -> bool:
        """SGD without momentum (what gossip's batched simulation can run)."""
        return self.optimizer == "sgd" and self.momentum == 0

    @classmethod
    def from_train_config(cls, config: Mapping[str, Any]) -> TrainingSettings:
        """The settings in a ``train_fn``'s config (:meth:`TaskConfig.train_config`):
        missing keys take their defaults, other keys (``seed``) are not read."""
        return cls.model_validate(
            {k: config[k] for k in cls.model_fields if k in config}
        )


@dataclass(frozen=True)
class CompressionSpec:
    """A compressor of :mod:`fedplat.compression` by registry name and params."""

    name: str = "identity"
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def is_identity(self) -> bool:
        return self.name == "identity"


@dataclass(frozen=True)
class PrivacySpec:
    """Client-side DP duties: ``local`` clips and noises what leaves the device;
    ``central``: none on the plain path (the coordinator clips to ``clip_norm``,
    this round's, and adds the noise); under secure aggregation the client clips
    to ``clip_norm`` itself."""

    mode: Literal["local", "central"]
    clip_norm: float
    noise_multiplier: float


@dataclass(frozen=True)
class SecAggSpec:
    """This client's part in the round's secure aggregation.

    ``config`` is the round's :meth:`fedplat.secagg.SecAggConfig.as_dict` (parsed
    and validated by the client), ``party`` the client's id in it. The client
    clips its update (or its sketch) to ``PrivacySpec.clip_norm``; with
    ``adaptive`` it appends ``clip_norm`` times the bit "my update was not
    clipped" as one more coordinate, so the masked sum carries the count that
    adaptive clipping releases (Andrew et al. 2021)."""

    config: dict[str, Any]
    party: int
    adaptive: bool = False


@dataclass(frozen=True)
class TaskConfig:
    training: TrainingSettings = field(default_factory=TrainingSettings)
    compression: CompressionSpec = field(default_factory=CompressionSpec)
    compression_seed: int = 0
    privacy: PrivacySpec | None = None
    seed: int = 0
    secagg: SecAggSpec | None = None

    def train_config(self) -> dict[str, Any]:
        """The settings a ``train_fn`` reads (plain dict, JSON values)."""
        return {**self.training.model_dump(), "seed": self.seed}

    def to_json(self) -> str:
        data = asdict(self)
        data["training"] = self.training.model_dump()
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TaskConfig:
        """Parse a task config; every malformed field is a :class:`TaskConfigError`."""
        if not text:
            return cls()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskConfigError(f"task config is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise TaskConfigError("task config must be a JSON object")
        try:
            return _from_dict(data)
        except (TypeError, ValueError, KeyError) as exc:
            raise TaskConfigError(f"bad task config: {exc}") from None


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite")
    return float(value)


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer")
    return value


def _training(t: Any) -> TrainingSettings:
    if not isinstance(t, dict):
        raise TypeError("training must be an object")
    # Keys this client does not know are left out, as at the top level: a newer
    # coordinator's setting must not make every older client refuse its tasks.
    known = {k: v for k, v in t.items() if k in TrainingSettings.model_fields}
    try:
        # Strict: JSON gives exact types, so "2" or true is not an epoch count.
        return TrainingSettings.model_validate(known, strict=True)
    except ValidationError as exc:
        raise ValueError(validation_message(exc, "training:")) from None


def _from_dict(data: dict[str, Any]) -> TaskConfig:
    training = _training(data.get("training") or {})
    c = data.get("compression") or {}
    params = c.get("params") or {}
    if not isinstance(params, dict):
        raise TypeError("compression params must be an object")
    compression = CompressionSpec(str(c.get("name", "identity")), dict(params))
    p = data.get("privacy")
    privacy = None
    if p is not None:
        mode = p["mode"]
        if mode not in ("local", "central"):
            raise ValueError(f"unknown privacy mode {mode!r}")
        privacy = PrivacySpec(
            mode,
            _number(p["clip_norm"], "clip_norm"),
            _number(p["noise_multiplier"], "noise_multiplier"),
        )
    sa = data.get("secagg")
    secagg = None
    if sa is not None:
        if not isinstance(sa.get("config"), dict):
            raise TypeError("secagg config must be an object")
        adaptive = sa.get("adaptive", False)
        if not isinstance(adaptive, bool):
            raise TypeError("secagg adaptive must be a boolean")
        secagg = SecAggSpec(
            dict(sa["config"]), _integer(sa["party"], "secagg party"), adaptive
        )
    return TaskConfig(
        training=training,
        compression=compression,
        compression_seed=_integer(data.get("compression_seed", 0), "compression_seed"),
        privacy=privacy,
        seed=_integer(data.get("seed", 0), "seed"),
        secagg=secagg,
    )


__all__ = [
    "CompressionSpec",
    "PrivacySpec",
    "SecAggSpec",
    "TaskConfig",
    "TaskConfigError",
    "TrainingSettings",
]
