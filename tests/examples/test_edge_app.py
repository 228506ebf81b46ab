"""examples/edge_app.py against a real coordinator process."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedplat.store import Store
from fedplat.transport.health import wait_healthy
from tests.support import REPO, Procs, free_port, issue_tokens, wait_for

pytestmark = pytest.mark.integration  # starts real processes


def test_edge_app_example(tmp_path: Path, procs: Procs) -> None:
    cfg = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    address = f"127.0.0.1:{free_port()}"
    cfg["run"]["rounds"] = 3
    cfg["server"]["address"] = address
    cfg["store"]["url"] = str(tmp_path / "edge.db")
    cfg["checkpoints"]["dir"] = str(tmp_path / "ckpt")
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(cfg))
    coord = procs.coordinator(path)
    wait_healthy(address, 180)
    tokens = issue_tokens(cfg, 4)
    for i, t in enumerate(tokens):
        (tmp_path / f"token-{i}").write_text(t)
    apps = [
        procs.start(
            f"edge-{i}",
            [
                str(REPO / "examples/edge_app.py"),
                "--address",
                address,
                "--insecure",
                "--shard",
                str(i),
                "--token-file",
                str(tmp_path / f"token-{i}"),
                "--state-dir",
                str(tmp_path / f"edge-{i}"),
            ],
        )
        for i in range(4)
    ]
    wait_for(lambda: coord.poll() is not None, 240, "the run to finish", procs=procs)
    assert coord.returncode == 0, procs.log("coordinator")
    assert all(a.wait(timeout=60) == 0 for a in apps)
    store = Store(cfg["store"]["url"], migrate=False)
    run = store.get_run_by_name("edge-digits")
    assert run is not None and run.status == "completed"
    rounds = store.list_rounds(run.id)
    assert len(rounds) == 3 and rounds[-1].accuracy > rounds[0].accuracy
    store.close()
