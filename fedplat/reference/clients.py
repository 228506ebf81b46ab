"""The reference client: trains a registered model on one partition of a real dataset.

Used by ``fedplat client``, ``fedplat sim`` and ``fedplat demo``. Every process computes
the same deterministic partition from ``seed`` and takes its own share, so client
processes need no coordination beyond their ``partition_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from fedplat.client.client import FitResult
from fedplat.protocol.task import TrainingSettings


@dataclass(frozen=True)
class ReferenceSpec:
    dataset: str = "fashion_mnist"
    model: str = "mlp"
    model_params: Mapping[str, Any] = field(default_factory=dict)
    num_partitions: int = 10
    partition_id: int = 0
    partition: str = "iid"
    partition_params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    # Data-level Byzantine behaviour for robustness evaluation: y -> C - 1 - y.
    label_flip: bool = False

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError("num_partitions must be >= 1")
        if not 0 <= self.partition_id < self.num_partitions:
            raise ValueError(f"partition_id must be in [0, {self.num_partitions})")


@lru_cache(maxsize=8)
def _partition_indices(
    dataset: str, partition: str, params: tuple[tuple[str, Any], ...], n: int, seed: int
) -> tuple[np.ndarray, ...]:
    from fedplat.data import load_dataset
    from fedplat.data import partition as make_partition

    ds = load_dataset(dataset, "train")
    parts = make_partition(partition, ds.y.numpy(), n, seed, **dict(params))
    return tuple(parts)


@dataclass
class ReferenceParts:
    model: torch.nn.Module
    data: Any  # fedplat.data.Dataset
    num_examples: int

    def train(self, model: torch.nn.Module, config: Mapping[str, Any]) -> FitResult:
        return train_reference(model, self.data, config)


def train_reference(
    model: torch.nn.Module, data: Any, config: Mapping[str, Any]
) -> FitResult:
    """Train ``model`` in place on ``data`` (a :class:`fedplat.data.Dataset`, or
    any :class:`fedplat.models.training.TrainData`) with the round's training
    settings."""
    from fedplat.models.training import train_epochs

    res = train_epochs(
        model,
        data,
        **TrainingSettings.from_train_config(config).model_dump(),
        seed=None if config.get("seed") is None else int(config["seed"]),
    )
    return FitResult(res.num_examples, {"train_loss": float(res.mean_loss)})


def partition_indices(spec: ReferenceSpec) -> np.ndarray:
    """The train-split indices of the spec's partition, ``int64 [n_i]`` (the
    whole partition is computed once per process and cached)."""
    parts = _partition_indices(
        spec.dataset,
        spec.partition,
        tuple(sorted(spec.partition_params.items())),
        spec.num_partitions,
        spec.seed,
    )
    return np.asarray(parts[spec.partition_id], dtype=np.int64)


def reference_data(spec: ReferenceSpec, train: Any = None) -> Any:
    """The client's share of the train split (labels flipped if the spec says);
    ``train``: the loaded train split, if the caller holds it already."""
    from fedplat.data import load_dataset

    ds = train if train is not None else load_dataset(spec.dataset, "train")
    local = ds.subset(torch.from_numpy(partition_indices(spec)))
    if spec.label_flip:
        from dataclasses import replace

        from fedplat.aggregators.attacks import flip_labels

        local = replace(local, y=flip_labels(local.y, local.num_classes))
    return local


def reference_parts(spec: ReferenceSpec) -> ReferenceParts:
    from fedplat.data import load_dataset
    from fedplat.models import create_model

    ds = load_dataset(spec.dataset, "train")
    local = reference_data(spec, ds)
    model = create_model(
        spec.model,
        ds.input_shape,
        ds.num_classes,
        seed=spec.seed,
        **dict(spec.model_params),
    )
    return ReferenceParts(model=model, data=local, num_examples=len(local))
