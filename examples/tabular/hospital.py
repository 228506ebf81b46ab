"""One hospital of the tabular example: the fedplat client SDK around its own rows.

    python examples/tabular/hospital.py --address 127.0.0.1:50052 --insecure --client 0

It trains the app's model (``app.model_factory``) on the rows of ``breast_cancer.csv``
whose ``client`` column is ``--client``, with the epochs, batch size and learning
rate the coordinator sends each round.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from app import load_rows, model_factory  # this folder is on sys.path as a script
from fedplat.client import Client, FitResult
from torch import nn

from fedplat.protocol.errors import FedplatError


def make_train(x: torch.Tensor, y: torch.Tensor):  # type: ignore[no-untyped-def]
    """The local training function the SDK calls each round."""

    def train(model: nn.Module, config: Mapping[str, Any]) -> FitResult:
        gen = torch.Generator().manual_seed(int(config.get("seed", 0)))
        opt = torch.optim.SGD(
            model.parameters(),
            lr=float(config.get("lr", 0.05)),
            momentum=float(config.get("momentum", 0.0)),
        )
        bs, losses = int(config.get("batch_size", 16)), []
        for _ in range(int(config.get("epochs", 1))):
            for idx in torch.randperm(len(y), generator=gen).split(bs):
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return FitResult(len(y), {"train_loss": sum(losses) / len(losses)})

    return train


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", default="127.0.0.1:50052", help="coordinator")
    ap.add_argument("--insecure", action="store_true", help="plaintext gRPC")
    ap.add_argument("--ca", help="CA certificate PEM of the coordinator (TLS)")
    ap.add_argument("--token-file", help="enrolment token from the operator")
    ap.add_argument("--state-dir", help="where the client keeps its identity key")
    ap.add_argument("--client", type=int, required=True, help="0, 1 or 2")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    x, y = load_rows("train", args.client)
    client = Client(
        args.address,
        model_factory(),
        make_train(x, y),
        num_examples=len(y),
        name=f"hospital-{args.client}",
        insecure=args.insecure,
        root_certificates=Path(args.ca).read_bytes() if args.ca else None,
        enrolment_token=(
            Path(args.token_file).read_text().strip() if args.token_file else None
        ),
        state_dir=args.state_dir,
        give_up_after=60.0,
    )
    try:
        client.run()
    except (ConnectionError, FedplatError) as exc:
        logging.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
