"""The typed contract of a training task: what the coordinator asks of a client.

:class:`TaskConfig` travels as JSON in every task (``Task.config_json`` on the
wire) and is parsed here, in one place, on both sides: the client's training
settings, the uplink's compression and privacy, and the seeds. A client's
``train_fn`` sees :meth:`TaskConfig.train_config` (epochs, batch size, learning
rate, optimizer, momentum, step cap and the per-round seed).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


class TaskConfigError(ValueError):
    """A task config is not valid JSON of the expected shape."""


@dataclass(frozen=True)
class TrainingSettings:
    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = 0.0
    max_steps: int | None = None


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
        return {**asdict(self.training), "seed": self.seed}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

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


def _from_dict(data: dict[str, Any]) -> TaskConfig:
    t = data.get("training") or {}
    optimizer = t.get("optimizer", "sgd")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"unknown optimizer {optimizer!r}")
    max_steps = t.get("max_steps")
    training = TrainingSettings(
        epochs=_integer(t.get("epochs", 1), "epochs"),
        batch_size=_integer(t.get("batch_size", 32), "batch_size"),
        lr=_number(t.get("lr", 0.05), "lr"),
        optimizer=optimizer,
        momentum=_number(t.get("momentum", 0.0), "momentum"),
        max_steps=None if max_steps is None else _integer(max_steps, "max_steps"),
    )
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
