"""The ServerApp: fedplat's strategy (or Flower's own, for comparison) over all
connected SuperNodes, with the global model evaluated on the test set after
every round.

Run-config keys (pyproject.toml): ``aggregator`` and ``uplink`` are a fedplat
run file's sections as JSON; ``strategy = "flower"`` runs Flower's strategy for
the same rule instead; ``time-peer`` also times the other side's aggregation on
the same replies; ``results-path`` receives a JSON summary.
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
from flwr.serverapp.strategy import FedAvg

from fedplat.flower import FedplatStrategy, decisions_from_metrics

log = logging.getLogger("fedplat_flower_app")

app = ServerApp()


def _json(cfg: Any, key: str) -> dict[str, Any]:
    try:
        value = json.loads(str(cfg[key]))
    except json.JSONDecodeError as exc:
        raise ValueError(f"run config {key!r} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"run config {key!r} must be a JSON object")
    return value


def _strategies(cfg: Any, num_nodes: int) -> tuple[FedAvg, FedAvg | None]:
    """The strategy that drives the run, and (with ``time-peer``) the other."""
    section = AggregatorSection.model_validate(_json(cfg, "aggregator"))
    sampling = {
        "fraction_evaluate": 0.0,  # the server evaluates centrally
        "min_train_nodes": num_nodes,
        "min_available_nodes": num_nodes,
    }
    ours = FedplatStrategy(section, uplink=_json(cfg, "uplink"), **sampling)
    side = str(cfg["strategy"])
    if side not in ("fedplat", "flower"):
        raise ValueError(f"run config 'strategy' must be fedplat or flower: {side!r}")
    theirs = None
    if side == "flower" or bool(cfg["time-peer"]):
        theirs = flower_strategy(section, num_nodes, **sampling)
    if side == "flower":
        assert theirs is not None
        return theirs, ours if bool(cfg["time-peer"]) else None
    return ours, theirs


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    torch.manual_seed(int(cfg["seed"]))
    num_nodes = len(list(grid.get_node_ids()))
    primary, peer = _strategies(cfg, num_nodes)
    strategy = Timed(primary, peer)
    model = build_model(int(cfg["seed"]))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        load_arrays(model, arrays)
        ev = central_evaluation(model)
        return MetricRecord({"accuracy": ev.accuracy, "loss": ev.loss})

    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(cfg["num-server-rounds"]),
        evaluate_fn=evaluate,
    )
    path = str(cfg["results-path"])
    if path:
        _write(Path(path), cfg, strategy, result)


def _write(path: Path, cfg: Any, strategy: Timed, result: Any) -> None:
    """Accuracy, aggregation seconds and the fedplat decisions per round."""
    evals = result.evaluate_metrics_serverapp
    rounds = []
    for r in sorted(strategy.seconds):
        train = result.train_metrics_clientapp.get(r, MetricRecord())
        row: dict[str, Any] = {
            "round": r,
            "accuracy": evals[r]["accuracy"] if r in evals else None,
            "aggregation_s": strategy.seconds[r],
            "peer_aggregation_s": strategy.peer_seconds.get(r),
            "metrics": {k: v for k, v in train.items() if not isinstance(v, list)},
        }
        if "fedplat.node-id" in train:
            row["decisions"] = [
                {"selected": d.selected, "weight": d.weight, "flags": list(d.flags)}
                for d in decisions_from_metrics(train)
            ]
        rounds.append(row)
    data = {
        "strategy": str(cfg["strategy"]),
        "primary": type(strategy.primary).__name__,
        "peer": None if strategy.peer is None else type(strategy.peer).__name__,
        "aggregator": json.loads(str(cfg["aggregator"])),
        "initial_accuracy": evals[0]["accuracy"] if 0 in evals else None,
        "rounds": rounds,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    log.info("results written to %s", path)
