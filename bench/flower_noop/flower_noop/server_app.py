"""The ServerApp: Flower's FedAvg over every SuperNode for ``num-server-rounds``
rounds, no evaluation; the time each round's aggregation returned is written to
``results-path`` (the benchmark's round time is the gap between two of them)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


class TimedFedAvg(FedAvg):
    """FedAvg that notes when each round's aggregation returned."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.completed_at: list[float] = []

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        out = super().aggregate_train(server_round, replies)
        self.completed_at.append(time.time())
        return out


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    n = int(cfg["num-nodes"])
    strategy = TimedFedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=n,
        min_available_nodes=n,
    )
    initial = ArrayRecord([np.zeros(int(cfg["numel"]), dtype=np.float32)])
    strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(cfg["num-server-rounds"])
    )
    path = str(cfg["results-path"])
    if path:
        Path(path).write_text(json.dumps({"completed_at": strategy.completed_at}))
