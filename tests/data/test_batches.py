"""Held-out data of any kind as bounded, ordered batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from fedplat.data import load_digits
from fedplat.data.batches import BatchError, Batches

X = torch.arange(20.0).view(10, 2)
Y = torch.arange(10)


class _Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(zip(X, Y, strict=True))


@pytest.mark.parametrize(
    "obj",
    [
        (X, Y),
        (X.numpy(), Y.numpy()),
        TensorDataset(X, Y),
        DataLoader(TensorDataset(X, Y), batch_size=3),
        _Stream(),
    ],
)
def test_every_kind_yields_the_examples_in_order(obj: object) -> None:
    b = Batches.of(obj, "test data")
    for limit in (None, 7):
        pairs = list(b.iterate(4, limit))
        x = torch.cat([p[0] for p in pairs])
        y = torch.cat([p[1] for p in pairs])
        n = 10 if limit is None else 7
        assert torch.equal(x, X[:n]) and torch.equal(y, Y[:n])
        assert all(p[0].shape[0] <= 4 for p in pairs)


def test_a_bundled_dataset_keeps_its_class_count() -> None:
    b = Batches.of(load_digits("test"), "digits")
    assert b.num_classes == 10 and b.first(5)[0].shape == (5, 1, 8, 8)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ("text", "must be a torch Dataset, a DataLoader or a pair"),
        ((X, Y[:3]), "must share their first"),
        (
            DataLoader(TensorDataset(X), batch_size=2),
            "must be an .inputs, targets. pair",
        ),
        ((X, ["a"] * 10), "cannot be made a tensor"),
    ],
)
def test_bad_data_is_named(obj: object, message: str) -> None:
    with pytest.raises(BatchError, match=message):
        list(Batches.of(obj, "test data").iterate(4))


def test_empty_data_has_no_first_batch() -> None:
    with pytest.raises(BatchError, match="is empty"):
        Batches.of((np.zeros((0, 2)), np.zeros(0)), "nothing").first(4)
