"""The ServerApp: fedplat's strategy (or Flower's own, for comparison) over the
SuperNodes, with the global model evaluated on the test set after every round.

Run-config keys (pyproject.toml): ``aggregator`` and ``uplink`` are a fedplat
run file's sections as JSON; ``strategy = "flower"`` runs Flower's strategy for
the same rule instead; ``num-nodes`` is how many SuperNodes to wait for (0:
those connected at the start); ``results-path`` receives a JSON summary.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from fedplat.server.config import AggregatorSection
from fedplat_flower_app.peers import Timed, flower_strategy
from fedplat_flower_app.task import build_model, central_evaluation, load_arrays
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result

from fedplat.flower import FedplatStrategy, decisions_from_metrics

log = logging.getLogger("fedplat_flower_app")

app = ServerApp()


def run_json(cfg: Any, key: str) -> Any:
    """A run-config value holding JSON."""
    try:
        return json.loads(str(cfg[key]))
    except json.JSONDecodeError as exc:
        raise ValueError(f"run config {key!r} is not JSON: {exc}") from exc


def sampling(cfg: Any, grid: Grid) -> dict[str, Any]:
    """Every round trains on every node; the server evaluates centrally."""
    n = int(cfg["num-nodes"]) or len(list(grid.get_node_ids()))
    return {"fraction_evaluate": 0.0, "min_train_nodes": n, "min_available_nodes": n}


def make_strategy(
    side: str, section: AggregatorSection, uplink: Any, kw: dict[str, Any]
) -> FedAvg:
    """fedplat's strategy for ``section``, or Flower's own for the same rule."""
    if side == "fedplat":
        return FedplatStrategy(section, uplink=uplink, **kw)
    if side == "flower":
        return flower_strategy(section, kw["min_train_nodes"], **kw)
    raise ValueError(f"strategy must be 'fedplat' or 'flower', got {side!r}")


def train(cfg: Any, grid: Grid, strategy: Timed) -> Result:
    """``strategy`` from the seeded initial model, evaluated every round."""
    torch.manual_seed(int(cfg["seed"]))
    model = build_model(int(cfg["seed"]))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        load_arrays(model, arrays)
        ev = central_evaluation(model)
        return MetricRecord({"accuracy": ev.accuracy, "loss": ev.loss})

    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(cfg["num-server-rounds"]),
        evaluate_fn=evaluate,
    )


def summary(strategy: Timed, result: Result) -> dict[str, Any]:
    """Accuracy, aggregation seconds and fedplat's decisions per round."""
    evals = result.evaluate_metrics_serverapp
    rounds = []
    for r in sorted(strategy.seconds):
        train_metrics = result.train_metrics_clientapp.get(r, MetricRecord())
        row: dict[str, Any] = {
            "round": r,
            "accuracy": evals[r]["accuracy"] if r in evals else None,
            "aggregation_s": strategy.seconds[r],
            "peer_aggregation_s": strategy.peer_seconds.get(r),
            "metrics": {
                k: v for k, v in train_metrics.items() if not isinstance(v, list)
            },
        }
        if "fedplat.node-id" in train_metrics:
            row["decisions"] = [
                {"selected": d.selected, "weight": d.weight, "flags": list(d.flags)}
                for d in decisions_from_metrics(train_metrics)
            ]
        rounds.append(row)
    return {
        "primary": type(strategy.primary).__name__,
        "peer": None if strategy.peer is None else type(strategy.peer).__name__,
        "initial_accuracy": evals[0]["accuracy"] if 0 in evals else None,
        "rounds": rounds,
    }


def write(path: str, data: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
        log.info("results written to %s", path)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    section = AggregatorSection.model_validate(run_json(cfg, "aggregator"))
    kw = sampling(cfg, grid)
    side = str(cfg["strategy"])
    strategy = Timed(make_strategy(side, section, run_json(cfg, "uplink"), kw))
    result = train(cfg, grid, strategy)
    data = {
        "strategy": side,
        "aggregator": section.model_dump(),
        **summary(strategy, result),
    }
    write(str(cfg["results-path"]), data)
