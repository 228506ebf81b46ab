"""Run configurations for tests: a small digits run writing into a temp folder."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_config(
    tmp: Path,
    *,
    name: str = "test",
    rounds: int = 3,
    clients: int = 4,
    quorum: int | None = None,
    min_available: int | None = None,
    address: str | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A small digits run writing into ``tmp``; ``sections`` override whole sections."""
    cfg: dict[str, Any] = {
        "run": {"name": name, "rounds": rounds, "seed": 0},
        "model": {"name": "mlp", "params": {"hidden": [64]}},
        "data": {"dataset": "digits"},
        "selection": {
            "clients_per_round": clients,
            "min_available": min_available or clients,
            "quorum": quorum or clients,
        },
        "deadlines": {"round_seconds": 60},
        "client_training": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "store": {"url": str(tmp / "fedplat.db")},
        "checkpoints": {"dir": str(tmp / "ckpt")},
        "server": {"address": address or f"127.0.0.1:{free_port()}", "insecure": True},
    }
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    return cfg


def write_config(tmp: Path, cfg: dict[str, Any]) -> Path:
    p = tmp / "run.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def dp_fedavg_config(
    tmp: Path, *, rate: float, privacy: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    """:func:`run_config` for user-level DP-FedAvg: unweighted FedAvg, Poisson
    sampling at ``rate`` with a quorum of 1, and ``privacy`` (mode central)."""
    return run_config(
        tmp,
        aggregator={"name": "fedavg", "weighted": False},
        selection={"sampling": "poisson", "rate": rate, "quorum": 1},
        privacy={"mode": "central", **privacy},
        **kw,
    )
