"""The tabular app's plug-ins: its model, its held-out data, a custom metric, and
each simulated hospital's training rows.

The coordinator imports them by the paths the run file gives (``app:model_factory``,
``app:eval_data``, ``app:sensitivity``, with ``--app-dir examples/tabular``); the
client script (``hospital.py``) uses the same model and reads its own rows;
``fedplat sim`` calls ``app:client_data`` (the run file's ``data.clients``) for
each simulated client. Nothing here imports fedplat: an exported model loads with
this file and plain torch.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

CSV = Path(__file__).with_name("breast_cancer.csv")
HOSPITALS = 3  # the CSV's ``client`` column: 0, 1, 2
NUM_FEATURES = 30
MALIGNANT = 0  # label 0 = malignant, 1 = benign (scikit-learn's coding)


@lru_cache(maxsize=1)
def _table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    with CSV.open(newline="") as f:
        rows = list(csv.DictReader(f))
    x = np.array([[float(r[f"f{i}"]) for i in range(NUM_FEATURES)] for r in rows])
    y = np.array([int(r["label"]) for r in rows])
    split = np.array([r["split"] for r in rows])
    client = np.array([int(r["client"]) for r in rows])
    return x.astype(np.float32), y, split, client


def load_rows(
    split: str, client: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x float32 [N, 30]`` and ``y int64 [N]`` of one split (and one client)."""
    x, y, s, c = _table()
    keep = s == split
    if client is not None:
        keep &= c == client
    return torch.from_numpy(x[keep]), torch.from_numpy(y[keep])


def model_factory(hidden: Sequence[int] = (64, 32)) -> nn.Module:
    """MLP 30 -> 64 -> 32 -> 2 (4,130 parameters), logits for (malignant, benign)."""
    widths = [NUM_FEATURES, *hidden]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], 2))
    return nn.Sequential(*layers)


def client_data(index: int, num_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training rows of simulated client ``index`` of ``num_clients``.

    With 3 clients, hospital ``index``'s own rows (what ``hospital.py --client
    index`` trains on: the CSV's Dirichlet label split). With any other count, the
    398 training rows shuffled with a fixed seed and cut into ``num_clients``
    near-equal shares (an IID split: the hospitals' label skew is not kept);
    more clients than rows is an error.
    """
    if num_clients == HOSPITALS:
        return load_rows("train", index)
    x, y = load_rows("train")
    if not 1 <= num_clients <= len(y):
        raise ValueError(f"{num_clients} clients for {len(y)} training rows")
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    share = order.tensor_split(num_clients)[index]
    return x[share], y[share]


def eval_data() -> tuple[torch.Tensor, torch.Tensor]:
    """The coordinator's held-out set: the 171 test rows."""
    return load_rows("test")


def sensitivity(outputs: torch.Tensor, targets: torch.Tensor) -> Mapping[str, float]:
    """Share of malignant tumours the model calls malignant (recall of class 0),
    the number a screening clinic watches; ``outputs`` are logits ``[N, 2]``."""
    malignant = targets == MALIGNANT
    found = (outputs.argmax(1) == MALIGNANT) & malignant
    return {"sensitivity": float(found.sum()) / max(1, int(malignant.sum()))}
