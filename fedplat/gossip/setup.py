"""What every node of a scenario starts from: its data share, the model, the test set.

Shared by the simulation and the real peer processes so that node ``i`` of a
scenario trains on the same examples in both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedplat.data import Dataset, load_dataset, partition
from fedplat.gossip.scenario import DataSpec, ModelSpec
from fedplat.models import create_model

__all__ = ["NodeData", "build_model", "load_node_data", "test_subset"]


@dataclass(frozen=True)
class NodeData:
    """Training shares of all nodes and the shared test split.

    Attributes
    ----------
    train : list of Dataset
        ``n`` local datasets (empty for relay-only nodes).
    test : Dataset
        The dataset's test split.
    """

    train: list[Dataset]
    test: Dataset

    @property
    def sizes(self) -> torch.Tensor:
        """float64 ``[n]`` local dataset sizes (DecAvg weights)."""
        return torch.tensor([len(d) for d in self.train], dtype=torch.float64)


def load_node_data(
    spec: DataSpec, n: int, seed: int, relay: set[int] | frozenset[int] = frozenset()
) -> NodeData:
    """Partition the training split among ``n`` nodes; relays get no data.

    A relay's share is dropped rather than handed to others, so the data the
    other nodes hold does not depend on who is a relay (Palmieri et al. 2023
    compare nodes with and without data at equal shares; not checked against
    the paper's text).
    """
    train = load_dataset(spec.dataset, "train")
    test = load_dataset(spec.dataset, "test")
    params: dict[str, float | int] = {}
    if spec.partition == "dirichlet":
        params["alpha"] = spec.alpha if spec.alpha is not None else 0.5
    if spec.partition == "shards":
        params["shards_per_client"] = spec.shards_per_client or 2
    parts = partition(spec.partition, train.y.numpy(), n, seed, **params)
    empty = np.zeros(0, dtype=np.int64)
    return NodeData(
        [train.subset(empty if i in relay else p) for i, p in enumerate(parts)],
        test,
    )


def test_subset(test: Dataset, size: int | None, seed: int) -> Dataset:
    """A fixed random subset of the test split (the whole split if ``size`` is None)."""
    if size is None or size >= len(test):
        return test
    idx = np.sort(np.random.default_rng(seed).permutation(len(test))[:size])
    return test.subset(idx)


def build_model(
    spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int, seed: int
) -> nn.Module:
    """The scenario's model; every node starts from the same seeded weights.

    A common initialisation is the usual setting of decentralised learning
    experiments; independent inits average poorly in the first rounds.
    """
    return create_model(spec.name, input_shape, num_classes, seed=seed, **spec.params)
