"""Plug-ins a run file names by import path (``tests.apps.plugins:...``): models,
evaluation data of several kinds and shapes, and a custom metric."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_diabetes, load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def digits_table(
    kind: str = "tensors", n: int = 200
) -> tuple[torch.Tensor, torch.Tensor] | TensorDataset | DataLoader[Any]:
    """The first ``n`` digits as a flat table ``x [n, 64]``, ``y [n]``."""
    x, y = load_digits(return_X_y=True)
    xt = torch.tensor(x[:n] / 16.0, dtype=torch.float32)
    yt = torch.tensor(y[:n], dtype=torch.int64)
    if kind == "dataset":
        return TensorDataset(xt, yt)
    if kind == "loader":
        return DataLoader(TensorDataset(xt, yt), batch_size=50)
    if kind == "float64":
        return xt.double(), yt
    return xt, yt


def diabetes_table() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's diabetes regression set: ``x [442, 10]``, ``y [442]`` (float32
    arrays, the target scaled to unit variance)."""
    x, y = load_diabetes(return_X_y=True)
    return x.astype(np.float32), (y / y.std()).astype(np.float32)


def table_mlp(
    input_shape: tuple[int, ...], num_classes: int, hidden: int = 16
) -> nn.Module:
    """A flat MLP whose input width and classes come from the run."""
    return nn.Sequential(
        nn.Linear(input_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
    )


def two_logits(width: int = 64) -> nn.Module:
    """Always two outputs: wrong for a 10-class task."""
    return nn.Linear(width, 2)


def regressor(width: int = 10) -> nn.Module:
    return nn.Sequential(nn.Linear(width, 8), nn.ReLU(), nn.Linear(8, 1))


class _Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w(x)  # inputs are 64 wide: a matmul shape error


def broken() -> nn.Module:
    return _Broken()


def top2_accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> Mapping[str, float]:
    """A custom metric: the target among the two largest logits."""
    top2 = outputs.topk(2, dim=1).indices
    return {"top2": float((top2 == targets[:, None]).any(1).double().mean())}
