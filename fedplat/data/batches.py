"""Held-out data of any shape as a re-iterable source of ``(inputs, targets)`` batches.

The coordinator evaluates a model on what an app's ``data.eval`` function returns
(see :mod:`fedplat.server.config`): a bundled :class:`~fedplat.data.Dataset`, a pair
of tensors or arrays ``(x [N, ...], y [N, ...])``, a map-style or iterable
``torch.utils.data.Dataset`` of ``(input, target)`` items, or a ``DataLoader`` of
``(inputs, targets)`` batches. :class:`Batches` hides the difference; it never
shuffles, so the first ``max_examples`` are the same on every pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from fedplat.data.datasets import Dataset


class BatchError(ValueError):
    """Evaluation data of an unsupported kind, or a batch that is not a pair."""


def _tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray | list | tuple | int | float):
        try:
            return torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError) as exc:
            raise BatchError(f"{what} cannot be made a tensor: {exc}") from None
    raise BatchError(f"{what} must be a tensor or array, got {type(value).__name__}")


def _pair(batch: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        raise BatchError(
            f"{what} must be an (inputs, targets) pair, got {type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, tuple | list) else "")
        )
    x, y = _tensor(batch[0], f"{what} inputs"), _tensor(batch[1], f"{what} targets")
    if x.dim() == 0 or y.dim() == 0 or x.shape[0] != y.shape[0]:
        raise BatchError(
            f"{what}: inputs {list(x.shape)} and targets {list(y.shape)} must share "
            "their first (example) dimension"
        )
    return x, y


@dataclass(frozen=True, eq=False)
class Batches:
    """Evaluation data as ``(inputs [B, ...], targets [B, ...])`` batches.

    Attributes
    ----------
    description : str
        What the data is, for messages (``"digits test split"``).
    tensors : tuple of two tensors, optional
        The whole set in memory, ``x [N, ...]`` and ``y [N, ...]``.
    loader : callable, optional
        ``batch_size -> iterable of pairs`` for data that streams.
    num_classes : int, optional
        Known for bundled datasets; ``None`` otherwise.
    """

    description: str
    tensors: tuple[torch.Tensor, torch.Tensor] | None = None
    loader: Callable[[int], Iterable[Any]] | None = None
    num_classes: int | None = None

    @classmethod
    def of(cls, obj: Any, description: str) -> Batches:
        """Wrap what an evaluation-data function returned (see module docstring)."""
        if isinstance(obj, Dataset):
            return cls(description, (obj.x, obj.y), num_classes=obj.num_classes)
        if isinstance(obj, DataLoader):
            return cls(description, loader=lambda _bs: obj)
        if isinstance(obj, TorchDataset):
            ds = obj
            return cls(
                description,
                loader=lambda bs: DataLoader(ds, batch_size=bs, shuffle=False),
            )
        if isinstance(obj, tuple | list):
            return cls(description, _pair(obj, description))
        raise BatchError(
            f"{description} must be a torch Dataset, a DataLoader or a pair of "
            f"tensors (x, y); got {type(obj).__name__}"
        )

    def iterate(
        self, batch_size: int, max_examples: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of at most ``batch_size`` (a DataLoader keeps its own size),
        stopping after ``max_examples`` examples in total."""
        if batch_size < 1:
            raise BatchError(f"batch_size must be >= 1, got {batch_size}")
        left = max_examples
        for x, y in self._raw(batch_size):
            if left is not None:
                if left <= 0:
                    return
                x, y = x[:left], y[:left]
                left -= int(x.shape[0])
            if x.shape[0] > 0:
                yield x, y

    def first(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first batch; an empty source is an error."""
        for pair in self.iterate(batch_size):
            return pair
        raise BatchError(f"{self.description} is empty")

    def _raw(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.tensors is not None:
            x, y = self.tensors
            for start in range(0, int(x.shape[0]), batch_size):
                yield x[start : start + batch_size], y[start : start + batch_size]
            return
        assert self.loader is not None
        for i, batch in enumerate(self.loader(batch_size)):
            yield _pair(batch, f"batch {i} of {self.description}")


__all__ = ["BatchError", "Batches"]
