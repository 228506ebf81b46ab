"""A client whose training hangs (simulates a device that dies mid-round)."""

from __future__ import annotations

import sys
import time

import torch
from fedplat.client import Client, FitResult

from fedplat.models import create_model


def main() -> None:
    address, seconds, token = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    model = create_model("mlp", (1, 8, 8), 10, hidden=(64,))

    def train(model: torch.nn.Module, config: object) -> FitResult:
        print("training started", flush=True)
        time.sleep(seconds)
        return FitResult(10)

    Client(
        address,
        model,
        train,
        num_examples=10,
        name="slow",
        insecure=True,
        enrolment_token=token,
    ).run()


if __name__ == "__main__":
    main()
