"""Hierarchical aggregation: edge coordinators that are clients of a root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from fedplat.server.checkpoint import load_checkpoint
from fedplat.server.config import ConfigError, parse_config
from fedplat.server.context import ModelCache
from fedplat.server.runstate import RunState
from fedplat.server.upstream import UpstreamModelCache, check_edge_config

from fedplat.store import Store
from fedplat.testing.hierarchy import reference_clients, run_hierarchy
from fedplat.transport.health import wait_healthy
from fedplat.vectors import Layout, TensorSpec
from tests.support import Procs, free_port, issue_tokens, run_config, wait_for


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"server_optimizer": {"name": "fedadam"}}, "server_optimizer fedavg"),
        ({"server_optimizer": {"lr": 0.5}}, "lr 1.0"),
        (
            {
                "privacy": {"mode": "central", "noise_multiplier": 1.0},
                "aggregator": {"name": "fedavg", "weighted": False},
                "selection": {"sampling": "poisson", "rate": 0.5, "quorum": 1},
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
    hier = run_hierarchy(tmp_path / "hier", run, 6, 2, reference_clients(6))
    (tmp_path / "flat").mkdir()
    run["store"] = {"url": str(tmp_path / "flat" / "fedplat.db")}
    run["checkpoints"] = {"dir": str(tmp_path / "flat" / "ckpt")}
    flat = run_hierarchy(tmp_path / "flat", run, 6, 0, reference_clients(6))
    assert float((hier.weights - flat.weights).abs().max()) <= 1e-6
    assert not torch.equal(hier.weights, torch.zeros_like(hier.weights))
    # One upload per edge instead of one per client, each a client's size
    # plus the edge's summary in its header.
    pairs = zip(flat.root_bytes_in, hier.root_bytes_in, strict=True)
    assert all(2.9 < f / h <= 3 for f, h in pairs)
    m = hier.edge_metrics
    assert m["client.edge.selected"] == 6 and m["client.edge.kept"] == 6
    assert m["client.edge.succeeded"] == 6 and m["client.edge.bytes_up"] > 0


def _yaml(path: Path, run: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(run))
    return path


@pytest.mark.integration
def test_root_two_edges_six_clients_as_processes(tmp_path: Path, procs: Procs) -> None:
    """``fedplat coordinator --upstream`` for real: a root, 2 edge coordinators
    and 6 reference clients as processes; the root's model equals the flat run's
    on the same seeded data within 1e-6."""
    root_addr = f"127.0.0.1:{free_port()}"
    root = run_config(tmp_path / "root", name="root", rounds=2, address=root_addr)
    root = {**root, "selection": {"clients_per_round": 2, "min_available": 2}}
    root_path = _yaml(tmp_path / "root" / "run.yaml", root)
    edge_tokens = issue_tokens(root, 2)  # before the processes open the store
    procs.coordinator(root_path, "root")
    wait_healthy(root_addr, 120)  # edges and clients would back off otherwise
    for e, token in enumerate(edge_tokens):
        d = tmp_path / f"edge-{e}"
        edge = run_config(d, name=f"edge-{e}", rounds=10, clients=3)
        edge_path = _yaml(d / "run.yaml", edge)
        (d / "token").write_text(token)
        client_tokens = issue_tokens(edge, 3)
        procs.start(
            f"edge-{e}",
            ["-m", "fedplat.cli", "coordinator", "--config", str(edge_path),
             "--upstream", root_addr, "--upstream-insecure",
             "--upstream-token-file", str(d / "token"),
             "--upstream-state-dir", str(d / "upstream"),
             "--upstream-name", f"edge-{e}"],
        )  # fmt: skip
        wait_healthy(edge["server"]["address"], 120)
        for j, tok in enumerate(client_tokens):
            procs.client(edge["server"]["address"], 3 * e + j, 6, token=tok)
    wait_for(
        lambda: (
            procs.procs[0].poll() not in (None, 0)
            or all(p.poll() is not None for p in procs.procs)
        ),
        240,
        "every process to exit",
        procs=procs,
    )
    assert [p.returncode for p in procs.procs] == [0] * 9, [
        p.returncode for p in procs.procs
    ]
    with Store(root["store"]["url"]) as store:
        run = store.get_run_by_name("root")
        assert run is not None and run.status == "completed"
        last = store.last_completed_round(run.id)
        assert last is not None and last.number == 2
        hier = load_checkpoint(
            last.checkpoint_path, expected_sha256=last.checkpoint_sha256
        )
        edges = {c.name for c in store.list_clients(run.id)}
        kept = [m for m in store.list_metrics(run.id, "client.edge.kept")]
    assert edges == {"edge-0", "edge-1"}
    assert sorted(m.value for m in kept) == [3.0] * 4
    for e in range(2):
        with Store(str(tmp_path / f"edge-{e}" / "fedplat.db")) as store:
            run = store.get_run_by_name(f"edge-{e}")
            assert run is not None and run.status == "completed"
            mapped = store.list_events(run.id, kind="upstream_round")
            assert len(mapped) == 2
    flat_run = run_config(tmp_path / "flat", name="root", rounds=2)
    flat = run_hierarchy(tmp_path / "flat", flat_run, 6, 0, reference_clients(6))
    assert float((hier.weights - flat.weights).abs().max()) <= 1e-6


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--upstream-token-file", "t"], "--upstream-token-file needs --upstream"),
        (["--upstream", "127.0.0.1:1", "--upstream-insecure"], "--upstream-state-dir"),
        (["--upstream", "127.0.0.1:1", "--upstream-state-dir", "s"], "root-cert"),
        (
            ["--upstream", "h:1", "--upstream-state-dir", "s", "--upstream-insecure",
             "--upstream-root-cert", "ca.pem"],
            "--upstream-insecure cannot be combined",
        ),
    ],
)  # fmt: skip
def test_upstream_flags_are_checked(
    tmp_path: Path,
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fedplat.cli import main

    path = _yaml(tmp_path / "run.yaml", run_config(tmp_path))
    assert main(["coordinator", "--config", str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_edge_refuses_a_run_file_that_would_not_forward_a_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedplat.cli import main

    run = run_config(tmp_path, server_optimizer={"name": "fedadam"})
    path = _yaml(tmp_path / "run.yaml", run)
    argv = ["coordinator", "--config", str(path), "--upstream", "127.0.0.1:1"]
    argv += ["--upstream-insecure", "--upstream-state-dir", str(tmp_path / "s")]
    assert main(argv) == 2
    assert "server_optimizer fedavg" in capsys.readouterr().err
