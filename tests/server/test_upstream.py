"""Hierarchical aggregation: edge coordinators that are clients of a root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fedplat.client import Client
from fedplat.server.config import ConfigError, parse_config
from fedplat.server.context import ModelCache
from fedplat.server.runstate import RunState
from fedplat.server.upstream import UpstreamModelCache, check_edge_config

from fedplat.reference.clients import ReferenceSpec, reference_parts
from fedplat.testing.hierarchy import run_hierarchy
from fedplat.vectors import Layout, TensorSpec
from tests.support import run_config


def digits_grpc_client(n: int) -> Any:
    """Client ``i`` of ``n`` on digits over gRPC (the test runs' 64-unit MLP)."""

    def make(i: int, address: str, token: str) -> Client:
        p = reference_parts(
            ReferenceSpec(
                dataset="digits",
                model="mlp",
                model_params={"hidden": [64]},
                num_partitions=n,
                partition_id=i,
            )
        )
        return Client(
            address,
            p.model,
            p.train,
            num_examples=p.num_examples,
            name=f"client-{i}",
            insecure=True,
            enrolment_token=token,
            poll_seconds=1.0,
        )

    return make


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"server_optimizer": {"name": "fedadam"}}, "server_optimizer fedavg"),
        ({"server_optimizer": {"lr": 0.5}}, "lr 1.0"),
        (
            {
                "privacy": {"mode": "central", "noise_multiplier": 1.0},
                "aggregator": {"name": "fedavg", "weighted": False},
            },
            "central DP",
        ),
    ],
)
def test_edge_run_files_that_would_not_forward_a_mean_are_refused(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    cfg = parse_config(run_config(tmp_path, **section))
    with pytest.raises(ConfigError, match=message):
        check_edge_config(cfg)
    check_edge_config(parse_config(run_config(tmp_path)))


def test_edge_download_follows_the_installed_root_model() -> None:
    """An edge round retried (same edge version) on a newer root model must not
    serve the older one: the base cache would, the edge's does not."""
    layout = Layout((TensorSpec("w", (4,)),))
    state = RunState(None, torch.zeros(4), 3, False)  # type: ignore[arg-type]
    base, edge = ModelCache(layout), UpstreamModelCache(layout)
    first = (base.prepare(state).sha256, edge.prepare(state).sha256)
    state.weights = torch.ones(4)
    edge.generation += 1
    assert base.prepare(state).sha256 == first[0]  # keyed by the version only
    assert edge.prepare(state).sha256 != first[1]


def test_two_edges_equal_the_flat_fedavg_run(tmp_path: Path) -> None:
    """Root + 2 edges + 6 clients over gRPC against the flat run on the same
    seeded data: the same model within 1e-6, a third of the root's bytes in."""
    run = run_config(tmp_path, name="root", rounds=2)
    hier = run_hierarchy(tmp_path / "hier", run, 6, 2, digits_grpc_client(6))
    (tmp_path / "flat").mkdir()
    run["store"] = {"url": str(tmp_path / "flat" / "fedplat.db")}
    run["checkpoints"] = {"dir": str(tmp_path / "flat" / "ckpt")}
    flat = run_hierarchy(tmp_path / "flat", run, 6, 0, digits_grpc_client(6))
    assert float((hier.weights - flat.weights).abs().max()) <= 1e-6
    assert not torch.equal(hier.weights, torch.zeros_like(hier.weights))
    # One upload per edge instead of one per client, each a client's size
    # plus the edge's summary in its header.
    pairs = zip(flat.root_bytes_in, hier.root_bytes_in, strict=True)
    assert all(2.9 < f / h <= 3 for f, h in pairs)
    m = hier.edge_metrics
    assert m["client.edge.selected"] == 6 and m["client.edge.kept"] == 6
    assert m["client.edge.succeeded"] == 6 and m["client.edge.bytes_up"] > 0
