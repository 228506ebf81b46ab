"""Run configuration: a validated TOML or YAML file (pydantic, unknown keys rejected).

Example (YAML)::

    run: {name: demo, rounds: 20, seed: 0}
    model: {name: mlp}                 # or {factory: "my_app.model:build"}
    data: {dataset: fashion_mnist}     # or {eval: "my_app.data:held_out"}
    evaluation: {metrics: [accuracy, f1, "my_app.metrics:recall_at_5"]}
    selection: {clients_per_round: 10, min_available: 10, quorum: 8}
    deadlines: {round_seconds: 120}
    aggregator: {name: fedavg}
    server_optimizer: {name: fedavg, lr: 1.0}
    server: {address: "127.0.0.1:50051", insecure: true}
"""

from __future__ import annotations

import math
import os
from typing import Any, Literal

from fedplat.server.aggregator_section import AggregatorSection
from fedplat.server.server_section import (
    AdmissionSection,
    ControlSection,
    ServerSection,
)
from pydantic import Field, ValidationError, field_validator, model_validator

from fedplat.config import (
    Strict,
    deep_merge,
    env_overrides,
    read_mapping,
    validation_message,
)
from fedplat.contribution.config import ContributionSection
from fedplat.privacy.config import PrivacySection
from fedplat.protocol.task import TrainingSettings


class ConfigError(ValueError):
    """The run configuration is missing, unreadable or invalid."""


class RunSection(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    rounds: int = Field(ge=1, le=1_000_000)
    # torch.manual_seed takes 0 <= seed < 2**64; the store keeps it in JSON.
    seed: int = Field(default=0, ge=0, le=2**63 - 1)


class ModelSection(Strict):
    """The run's model: ``name`` or ``factory``, not both (``name: mlp`` if neither).

    ``name`` is a model registered in :mod:`fedplat.models` (``fedplat list
    models``), called as ``factory(input_shape, num_classes, **params)``; an import
    path there is called the same way. ``factory`` is the public plug-in: an import
    path ``"package.module:fn"`` to the app's own function, called as
    ``fn(**params)``, with ``input_shape`` and ``num_classes`` added when its
    signature names them. Both are built with the torch RNG seeded by ``run.seed``.
    """

    name: str | None = None
    factory: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    input_shape: tuple[int, ...] | None = None
    num_classes: int | None = Field(default=None, ge=2)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("name") and not data.get("factory"):
            return {**data, "name": "mlp"}
        return data

    @model_validator(mode="after")
    def _one_of(self) -> ModelSection:
        if self.name is not None and self.factory is not None:
            raise ValueError("give model.name or model.factory, not both")
        if self.factory is not None:
            _check_import_path(self.factory, "model.factory")
        if self.name is not None and ":" not in self.name:
            from fedplat.models import available_models

            if self.name.strip().lower() not in available_models():
                raise ValueError(
                    f"unknown model {self.name!r}; available: "
                    f"{', '.join(available_models())} (or model.factory: "
                    "'package.module:fn')"
                )
        return self

    @property
    def label(self) -> str:
        """The model as the run file names it."""
        return str(self.name if self.name is not None else self.factory)


def _check_import_path(spec: str, what: str) -> None:
    module, sep, attr = spec.partition(":")
    if not sep or not module.strip() or not attr.strip():
        raise ValueError(f"{what} {spec!r} must look like 'package.module:function'")


class DataSection(Strict):
    """Where the data comes from.

    ``dataset`` names a bundled dataset (``fedplat list datasets``): the reference
    clients train on its train split and the coordinator evaluates on
    ``eval_split``. ``eval`` is the public plug-in for the coordinator's held-out
    data: an import path ``"package.module:fn"`` called as ``fn(**eval_params)``
    that returns a ``torch.utils.data.Dataset`` of ``(input, target)`` items, a
    ``DataLoader`` of ``(inputs, targets)`` batches, or a pair of tensors (or
    arrays) ``(x [N, ...], y [N, ...])`` of any shape. It replaces ``dataset`` for
    evaluation.

    ``clients``: the simulated clients' training data (``fedplat sim``; a
    coordinator never reads it), an import path called as ``fn(index,
    num_clients)`` returning what ``eval`` may, with integer labels ``y [N]``
    (:mod:`fedplat.sim.client_data`). It replaces ``dataset`` for training.
    """

    dataset: str = "fashion_mnist"
    eval: str | None = None
    clients: str | None = None
    eval_params: dict[str, Any] = Field(default_factory=dict)
    eval_split: Literal["train", "test"] = "test"
    eval_every: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> DataSection:
        from fedplat.data import available_datasets

        if self.dataset.replace("-", "_") not in available_datasets():
            raise ValueError(
                f"unknown dataset {self.dataset!r}; available: "
                f"{', '.join(available_datasets())} (or data.eval: "
                "'package.module:fn' for your own evaluation data)"
            )
        if self.eval is not None:
            _check_import_path(self.eval, "data.eval")
        elif self.eval_params:
            raise ValueError("data.eval_params needs data.eval")
        if self.clients is not None:
            _check_import_path(self.clients, "data.clients")
        return self


class EvaluationSection(Strict):
    """Server-side evaluation of the global model.

    ``task``: ``classification`` (logits ``[N, C]`` against class indices ``[N]``,
    cross-entropy loss, accuracy always reported), ``regression`` (outputs shaped
    like the targets, mean squared error loss, MAE always reported) or ``auto``
    (integer targets: classification; floating targets: regression). ``metrics``
    are names from ``fedplat list metrics`` or import paths ``"package.module:fn"``
    to functions ``fn(outputs, targets) -> {name: float}`` over the whole evaluation
    set. ``batch_size`` bounds one forward pass; ``max_examples`` evaluates the
    first examples only.
    """

    task: Literal["auto", "classification", "regression"] = "auto"
    metrics: list[str] = Field(default_factory=list)
    batch_size: int = Field(default=1024, ge=1, le=1 << 20)
    max_examples: int | None = Field(default=None, ge=1)

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, value: list[str]) -> list[str]:
        from fedplat.metrics import available_metrics, is_registered

        if len(set(value)) != len(value):
            raise ValueError(f"duplicate metrics in {value}")
        for name in value:
            if ":" in name:
                _check_import_path(name, "metric")
            elif not is_registered(name):
                raise ValueError(
                    f"unknown metric {name!r}; available: "
                    f"{', '.join(available_metrics())} (or 'package.module:fn')"
                )
        return value


class SelectionSection(Strict):
    """Which live clients train in a round.

    ``sampling: fixed`` (default) picks ``clients_per_round`` (or ``fraction`` of
    the live clients) uniformly without replacement. ``sampling: poisson`` takes
    each live client independently with probability ``rate``
    (:func:`fedplat.privacy.poisson_sample`, a keyed hash of the round and the
    client): the number per round is random (binomial, possibly zero), which is
    the sampling DP-FedAvg's accountant assumes; ``clients_per_round`` and
    ``fraction`` are not used. ``quorum`` is the number of accepted updates a
    round needs to complete; under central DP it is not consulted (a round
    releases at its deadline whatever arrived; see docs/privacy.md).
    """

    sampling: Literal["fixed", "poisson"] = "fixed"
    rate: float | None = Field(default=None, gt=0.0, le=1.0)
    clients_per_round: int = Field(default=10, ge=1)
    fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    min_available: int = Field(default=2, ge=1)
    quorum: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> SelectionSection:
        if self.sampling == "poisson":
            if self.rate is None:
                raise ValueError("selection.sampling poisson needs a rate in (0, 1]")
            if self.fraction is not None:
                raise ValueError(
                    "selection.fraction is for fixed sampling; poisson uses rate"
                )
        elif self.rate is not None:
            raise ValueError("selection.rate needs sampling: poisson")
        if self.sampling == "fixed" and self.quorum > self.clients_per_round:
            raise ValueError(
                f"quorum ({self.quorum}) cannot exceed clients_per_round "
                f"({self.clients_per_round})"
            )
        if self.min_available < self.quorum:
            raise ValueError(
                f"min_available ({self.min_available}) must be >= "
                f"quorum ({self.quorum})"
            )
        return self


class DeadlineSection(Strict):
    round_seconds: float = Field(default=120.0, gt=0)
    # A run that cannot gather ``min_available`` live clients within this many
    # seconds fails with a stored reason (None: wait indefinitely, visibly, as
    # "waiting for clients: 3/8" on the monitor).
    wait_for_clients_seconds: float | None = Field(default=None, gt=0)
    # A round closes early once every selected client answered; with this set it
    # also closes as soon as quorum is reached and this many seconds passed.
    close_after_quorum_seconds: float | None = Field(default=None, ge=0)
    liveness_seconds: float = Field(default=30.0, gt=0)
    max_round_attempts: int = Field(default=5, ge=1)


class ServerOptimizerSection(Strict):
    name: Literal["fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad"] = "fedavg"
    lr: float = Field(default=1.0, gt=0)
    # "cosine": lr_min + (lr - lr_min) (1 + cos(pi (t - 1) / T)) / 2 in round t of
    # T = run.rounds (Loshchilov & Hutter's annealing without restarts).
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_min: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _lr_min_below_lr(self) -> ServerOptimizerSection:
        if self.lr_min > self.lr:
            raise ValueError(f"lr_min ({self.lr_min}) must not exceed lr ({self.lr})")
        return self

    momentum: float = Field(default=0.9, ge=0, lt=1)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.99, ge=0, lt=1)
    tau: float = Field(default=1e-3, gt=0)


class CompressionSection(Strict):
    """Uplink compression, applied by every client as a middleware layer.

    ``name`` is a compressor from ``fedplat.compression`` (identity, fp16, topk,
    dgc, countsketch, gaussian_sketch, ams_sketch) with its ``params``.
    """

    name: str = "identity"
    params: dict[str, Any] = Field(default_factory=dict)


class StoreSection(Strict):
    url: str = "runs/fedplat.db"


class CheckpointSection(Strict):
    dir: str = "runs/checkpoints"
    keep_last: int = Field(default=3, ge=1)


class RunConfig(Strict):
    run: RunSection
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    evaluation: EvaluationSection = EvaluationSection()
    selection: SelectionSection = SelectionSection()
    deadlines: DeadlineSection = DeadlineSection()
    client_training: TrainingSettings = TrainingSettings()
    aggregator: AggregatorSection = AggregatorSection()
    server_optimizer: ServerOptimizerSection = ServerOptimizerSection()
    compression: CompressionSection = CompressionSection()
    privacy: PrivacySection = PrivacySection()
    contribution: ContributionSection = ContributionSection()
    store: StoreSection = StoreSection()
    checkpoints: CheckpointSection = CheckpointSection()
    # No server section: TLS is still required to serve (checked when serving,
    # so simulations need none); plaintext only with server.insecure: true.
    server: ServerSection = Field(
        default_factory=lambda: ServerSection.model_construct()
    )
    admission: AdmissionSection = AdmissionSection()
    control: ControlSection | None = None

    @property
    def admission_mode(self) -> Literal["tokens", "mtls", "open"]:
        if self.admission.mode is not None:
            return self.admission.mode
        tls = self.server.tls
        return "mtls" if tls is not None and tls.client_ca else "tokens"

    @model_validator(mode="after")
    def _check_privacy(self) -> RunConfig:
        if self.control is not None and self.server.tls is None:
            raise ValueError(
                "control needs server.tls: operators' calls never travel plaintext"
            )
        if self.admission.mode == "mtls" and (
            self.server.tls is None or not self.server.tls.client_ca
        ):
            raise ValueError(
                "admission.mode mtls needs server.tls.client_ca (mutual TLS)"
            )
        if self.privacy.mode == "central" and (
            self.aggregator.name != "fedavg"
            or self.aggregator.is_weighted
            or self.aggregator.pre
        ):
            raise ValueError(
                "privacy.mode central needs aggregator fedavg with weighted: false and "
                "no pre-aggregators: the noise is calibrated to an unweighted mean of "
                "clipped updates"
            )
        if self.privacy.mode == "central":
            sel = self.selection
            if sel.sampling != "poisson":
                raise ValueError(
                    "privacy.mode central needs selection.sampling: poisson with a "
                    "rate: the accountant assumes each client takes part "
                    "independently with probability rate (DP-FedAvg)"
                )
            if self.contribution.enabled:
                raise ValueError(
                    "contribution scoring reads each client's update and publishes "
                    "per-client scores, which central DP does not cover; turn one off"
                )
            if self.privacy.secure_aggregation is not None:
                from fedplat.secagg import SecAggError, check_secagg_compatible

                try:
                    check_secagg_compatible(
                        aggregator=self.aggregator.name,
                        weighted=self.aggregator.is_weighted,
                        pre_aggregators=[p.name for p in self.aggregator.pre],
                        compression=self.compression.name,
                        contribution_scoring=self.contribution.enabled,
                    )
                except SecAggError as exc:
                    raise ValueError(f"privacy.secure_aggregation: {exc}") from None
            if sel.quorum > 1:
                raise ValueError(
                    "selection.quorum is not used under central DP (every round "
                    "releases at its deadline, an empty one too: refusing a round "
                    "for having few updates would reveal the count); leave it at 1"
                )
        return self

    def clients_this_round(self, available: int) -> int:
        """How many clients to select given ``available`` live clients."""
        k = self.selection.clients_per_round
        if self.selection.fraction is not None:
            k = max(
                self.selection.quorum, math.ceil(self.selection.fraction * available)
            )
        return min(k, available)


def parse_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        header = f"invalid run configuration in {source}:"
        raise ConfigError(validation_message(exc, header)) from None


def load_config(
    path: str | os.PathLike[str],
    *,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> RunConfig:
    """Read a TOML (``.toml``) or YAML (``.yaml``/``.yml``) run file and validate it."""
    data = read_mapping(path, "config", ConfigError)
    data = deep_merge(
        data, env_overrides(dict(os.environ if environ is None else environ))
    )
    if overrides:
        data = deep_merge(data, overrides)
    return parse_config(data, str(path))
