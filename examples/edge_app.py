"""An edge app embedding the fedplat client SDK with its own model and data loader.

Run a coordinator first (``fedplat coordinator --config examples/digits.yaml``), then:

    python examples/edge_app.py --address 127.0.0.1:50051 --insecure --shard 0

The app owns its model and data; fedplat only needs the model object and a function
that trains it on local data.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fedplat.client import Client, FitResult
from sklearn.datasets import load_digits
from torch import nn


class TinyNet(nn.Module):
    """The app's own model: it must match the run's declared model layout."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def tiny_net(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Factory the coordinator imports as ``examples.edge_app:tiny_net``."""
    return TinyNet()


def local_data(shard: int, shards: int) -> torch.utils.data.DataLoader[Any]:
    """The app's data loader: its own slice of scikit-learn's digits."""
    x, y = load_digits(return_X_y=True)
    idx = np.arange(len(y))[shard::shards]
    ds = torch.utils.data.TensorDataset(
        torch.tensor(x[idx] / 16.0, dtype=torch.float32), torch.tensor(y[idx])
    )
    return torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", default="127.0.0.1:50051")
    ap.add_argument("--insecure", action="store_true", help="plaintext (local demo)")
    ap.add_argument("--ca", help="CA certificate PEM of the coordinator (TLS)")
    ap.add_argument(
        "--token-file", help="enrolment token from the operator (first start only)"
    )
    ap.add_argument(
        "--state-dir", help="where the app keeps its identity key and client id"
    )
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)

    loader = local_data(args.shard, args.shards)

    def train(model: nn.Module, config: Mapping[str, Any]) -> FitResult:
        opt = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.1)))
        losses = []
        for _ in range(int(config.get("epochs", 1))):
            for xb, yb in loader:
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return FitResult(len(loader.dataset), {"train_loss": float(np.mean(losses))})

    Client(
        args.address,
        TinyNet(),
        train,
        num_examples=len(loader.dataset),
        name=f"edge-{args.shard}",
        insecure=args.insecure,
        root_certificates=Path(args.ca).read_bytes() if args.ca else None,
        enrolment_token=(
            Path(args.token_file).read_text().strip() if args.token_file else None
        ),
        state_dir=args.state_dir,
    ).run()


if __name__ == "__main__":
    main()
