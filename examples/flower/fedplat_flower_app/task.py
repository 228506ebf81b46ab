"""Model, data and training of the app: fedplat's 2NN MLP on Fashion-MNIST.

Each SuperNode holds the part ``partition-id`` of a Dirichlet(``alpha``) label
split of the training set into ``num-partitions`` parts (Hsu et al. 2019); the
ServerApp evaluates the global model on the test set.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn

from fedplat.compression import derive_seed
from fedplat.data import Dataset, dirichlet, load_dataset
from fedplat.models import EvalResult, TrainResult, create_model, evaluate, train_epochs

DATASET = "fashion_mnist"
INPUT_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
HIDDEN = (200, 200)  # the "2NN" of McMahan et al. 2017


def build_model(seed: int) -> nn.Module:
    """The MLP with initial weights drawn from ``seed``."""
    return create_model("mlp", INPUT_SHAPE, NUM_CLASSES, seed=seed, hidden=HIDDEN)


def load_arrays(model: nn.Module, arrays: ArrayRecord) -> None:
    """Copy a received ArrayRecord into ``model`` (shapes checked by torch)."""
    model.load_state_dict(arrays.to_torch_state_dict())


@functools.lru_cache(maxsize=2)
def split(name: str) -> Dataset:
    """The ``"train"`` or ``"test"`` split, loaded once per process (a
    simulation runs many ClientApps in one Ray worker)."""
    # No silent fallback to another dataset: the app is about Fashion-MNIST.
    return load_dataset(DATASET, name, fallback=False)


@functools.lru_cache(maxsize=4)
def _parts(num_partitions: int, alpha: float, seed: int) -> tuple[np.ndarray, ...]:
    labels = split("train").y.numpy()
    return tuple(dirichlet(labels, num_partitions, alpha, seed))


def local_data(
    partition_id: int, num_partitions: int, alpha: float, seed: int
) -> Dataset:
    """This node's share of the training set."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} not in [0, {num_partitions})")
    return split("train").subset(_parts(num_partitions, alpha, seed)[partition_id])


def train_local(
    model: nn.Module,
    data: Dataset,
    *,
    server_round: int,
    partition_id: int,
    seed: int,
    epochs: int,
    batch_size: int,
    lr: float,
    max_steps: int,
) -> TrainResult:
    """Local SGD; the shuffling is a pure function of (seed, round, partition),
    so two runs from the same global model train identically."""
    return train_epochs(
        model,
        data,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=derive_seed(seed, server_round, "client", partition_id) % (1 << 63),
        max_steps=max_steps or None,
    )


def central_evaluation(model: nn.Module) -> EvalResult:
    """Loss and accuracy on the Fashion-MNIST test set."""
    with torch.no_grad():
        return evaluate(model, split("test"))
