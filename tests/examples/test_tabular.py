"""examples/tabular end to end through the CLI: a coordinator and 3 hospital
processes with the app's model, evaluation data and custom metric; then the model
is exported and, in plain torch without fedplat, reproduces the reported metric."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedplat.store import Store
from fedplat.transport.health import wait_healthy
from tests.support import (
    REPO,
    Procs,
    free_port,
    issue_tokens,
    run_without_fedplat,
    wait_for,
)

pytestmark = pytest.mark.integration  # starts real processes

APP_DIR = REPO / "examples" / "tabular"
HOSPITALS = 3


def launch(
    procs: Procs, run_file: Path, address: str, tokens: list[str]
) -> list[subprocess.Popen[bytes]]:
    """Coordinator + hospitals: every command line of the test, in one place."""
    coordinator = procs.start(
        "coordinator",
        [
            "-m",
            "fedplat.cli",
            "coordinator",
            "--config",
            str(run_file),
            "--app-dir",
            str(APP_DIR),
        ],
    )
    wait_healthy(address, 180)
    hospitals = [
        procs.start(
            f"hospital-{i}",
            [
                str(APP_DIR / "hospital.py"),
                "--address",
                address,
                "--insecure",
                "--client",
                str(i),
                "--token-file",
                str(_token_file(procs.logdir, i, tokens[i])),
            ],
        )
        for i in range(HOSPITALS)
    ]
    return [coordinator, *hospitals]


def _token_file(folder: Path, i: int, token: str) -> Path:
    path = folder / f"hospital-{i}.token"
    path.write_text(token)
    return path


def test_tabular_example_end_to_end(tmp_path: Path, procs: Procs) -> None:
    cfg = yaml.safe_load((APP_DIR / "run.yaml").read_text())
    address = f"127.0.0.1:{free_port()}"
    cfg["run"]["rounds"] = 4
    cfg["server"]["address"] = address
    cfg["store"]["url"] = str(tmp_path / "tabular.db")
    cfg["checkpoints"]["dir"] = str(tmp_path / "ckpt")
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(cfg))

    coordinator, *hospitals = launch(
        procs, run_file, address, issue_tokens(cfg, HOSPITALS)
    )
    wait_for(lambda: coordinator.poll() is not None, 240, "the run", procs=procs)
    assert coordinator.returncode == 0, procs.log("coordinator")
    assert all(h.wait(timeout=60) == 0 for h in hospitals)

    with Store(cfg["store"]["url"], migrate=False) as store:
        run = store.get_run_by_name("tabular")
        assert run is not None and run.status == "completed"
        last = store.list_rounds(run.id)[-1]
        reported = {
            name: [m.value for m in store.list_metrics(run.id, f"eval.{name}")][-1]
            for name in ("sensitivity", "auc", "f1", "accuracy")
        }
    assert last.number == 4 and last.accuracy == reported["accuracy"]
    assert 0.8 < reported["accuracy"] <= 1.0 and 0.0 < reported["sensitivity"] <= 1.0

    # The coordinator ends with a summary and the command that exports the model;
    # that command, as printed, writes the file.
    log = procs.log("coordinator")
    assert "run 'tabular' completed: 4/4 rounds" in log
    assert f"accuracy: final {reported['accuracy']:.2%} (round 4)" in log
    assert f"model: {last.checkpoint_path} (round 4)" in log
    printed = log.split("export the final model with:\n", 1)[1].splitlines()[0]
    command = shlex.split(printed)
    assert command[:2] == ["fedplat", "export"]
    out = tmp_path / "tabular.safetensors"
    export = subprocess.run(
        [sys.executable, "-m", "fedplat.cli", *command[1:]],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert export.returncode == 0, export.stderr
    assert "round 4" in export.stdout and out.is_file()

    # Plain torch and the app's own module; any fedplat import would fail here.
    printed = run_without_fedplat(
        f"import sys, json\nsys.path.insert(0, {str(APP_DIR)!r})\n"
        "from safetensors.torch import load_file\n"
        "import app\n"
        "model = app.model_factory()\n"
        f"model.load_state_dict(load_file({str(out)!r}))\n"
        "x, y = app.eval_data()\n"
        "logits = model.eval()(x).detach()\n"
        "acc = float((logits.argmax(1) == y).double().mean())\n"
        "print(json.dumps({**app.sensitivity(logits, y), 'accuracy': acc}))\n",
        tmp_path,
    )
    again = json.loads(printed)
    assert again["sensitivity"] == pytest.approx(reported["sensitivity"], abs=1e-12)
    assert again["accuracy"] == pytest.approx(reported["accuracy"], abs=1e-12)
