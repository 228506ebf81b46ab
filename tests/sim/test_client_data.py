"""The app's data for simulated clients (``data.clients``): examples/tabular
simulated in process and on Ray as its hospitals train it against a real
coordinator; a run missing the plug-in, or whose plug-in does not fit, is refused
with one line; a crash marks the run failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from fedplat.client import Client
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config

from fedplat.cli import main
from fedplat.cli.common import add_import_paths
from fedplat.store import Store
from tests.support import REPO, free_port, issue_tokens, wait_for

APP_DIR = REPO / "examples" / "tabular"
ROUNDS = 4


def tabular_config(tmp: Path, **data: Any) -> dict[str, Any]:
    """examples/tabular/run.yaml for ``ROUNDS`` rounds, writing into ``tmp``;
    ``data`` replaces keys of its data section (``None`` removes one)."""
    cfg: dict[str, Any] = yaml.safe_load((APP_DIR / "run.yaml").read_text())
    cfg["run"]["rounds"] = ROUNDS
    cfg["server"]["address"] = f"127.0.0.1:{free_port()}"
    cfg["store"]["url"] = str(tmp / "fedplat.db")
    cfg["checkpoints"]["dir"] = str(tmp / "ckpt")
    cfg["data"] = {k: v for k, v in {**cfg["data"], **data}.items() if v is not None}
    return cfg


def write(tmp: Path, cfg: dict[str, Any]) -> Path:
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def sim(path: Path, *extra: str, app_dir: Path = APP_DIR) -> list[str]:
    return [
        "sim",
        "--config",
        str(path),
        "--app-dir",
        str(app_dir),
        "--clients",
        "3",
        "--no-progress",
        *extra,
    ]


def run_cli(
    argv: list[str], backend: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """``fedplat sim`` on ``backend``: in this process, or on Ray in a process of
    its own (a local Ray on 127.0.0.1; the app is not on that process's path)."""
    argv = [*argv, "--backend", backend]
    if backend == "inprocess":
        code = main(argv)
        out = capsys.readouterr()
        return code, out.out, out.err
    proc = subprocess.run(
        [sys.executable, "-m", "fedplat.cli", *argv, "--hosts", "2"],
        cwd=REPO,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "TMPDIR": "/tmp"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


ON_RAY = pytest.param("ray", marks=pytest.mark.integration)


def run_status(cfg: dict[str, Any]) -> tuple[str, str | None]:
    with Store(cfg["store"]["url"], migrate=False) as store:
        run = store.get_run_by_name(cfg["run"]["name"])
        assert run is not None
        return run.status, run.reason


def coordinator_mode_accuracy(cfg: dict[str, Any]) -> float:
    """The same run served over gRPC to 3 SDK clients with the hospitals' own
    training function (``hospital.make_train``) and rows; its final accuracy.
    They are named as the simulated clients are, so their training seeds match."""
    add_import_paths(str(APP_DIR))
    import app  # examples/tabular/app.py
    import hospital  # examples/tabular/hospital.py

    tokens = issue_tokens(cfg, 3)
    srv = BackgroundServer(parse_config(cfg)).start()
    clients = [
        Client(
            cfg["server"]["address"],
            app.model_factory(),
            hospital.make_train(*app.load_rows("train", i)),
            num_examples=len(app.load_rows("train", i)[1]),
            name=f"sim-{i}",
            insecure=True,
            enrolment_token=tokens[i],
            poll_seconds=1,
        )
        for i in range(3)
    ]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: srv.coord.finished, 120, "the coordinator-mode run")
        record = srv.coord.run_record
        assert record.status == "completed"
        with Store(cfg["store"]["url"], migrate=False) as store:
            last = store.list_rounds(record.id)[-1]
    finally:
        for c in clients:
            c.stop()
        srv.stop()
    assert last.number == ROUNDS and last.accuracy is not None
    return float(last.accuracy)


def test_tabular_simulated_with_its_own_data_matches_coordinator_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sim").mkdir()
    (tmp_path / "grpc").mkdir()
    cfg = tabular_config(tmp_path / "sim")
    assert main(sim(write(tmp_path / "sim", cfg))) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rounds"] == ROUNDS and run_status(cfg)[0] == "completed"
    reference = coordinator_mode_accuracy(tabular_config(tmp_path / "grpc"))
    # Fashion-MNIST clients would leave the 171 test rows near chance, or crash.
    assert out["final_accuracy"] > 0.85
    assert abs(out["final_accuracy"] - reference) <= 0.01, (out, reference)


@pytest.mark.parametrize("backend", ["inprocess", "ray"])
def test_app_model_without_client_data_is_refused(
    tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tabular_config(tmp_path, clients=None)
    code, _, err = run_cli(sim(write(tmp_path, cfg)), backend, capsys)
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "names no data.clients" in err and "model.factory 'app:model_factory'" in err
    assert not Path(cfg["store"]["url"]).exists()  # refused before any run


def _plugin_app(tmp: Path, body: str) -> Path:
    """A folder with ``simapp_<test>.py``: the tabular app plus ``body``."""
    folder = tmp / "app"
    folder.mkdir()
    name = f"simapp_{tmp.name.replace('-', '_')}"
    (folder / f"{name}.py").write_text(
        f"import sys\nsys.path.insert(0, {str(APP_DIR)!r})\n"
        "from app import *  # noqa: F403\nfrom app import load_rows\n" + body
    )
    return folder


def _with_plugin(tmp: Path, folder: Path) -> dict[str, Any]:
    """The tabular run with every plug-in from the module in ``folder``."""
    name = next(folder.glob("simapp_*.py")).stem
    cfg = tabular_config(tmp, clients=f"{name}:client_data", eval=f"{name}:eval_data")
    cfg["model"]["factory"] = f"{name}:model_factory"
    cfg["evaluation"]["metrics"] = ["auc"]
    return cfg


def test_client_data_that_does_not_fit_the_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _plugin_app(
        tmp_path,
        "def client_data(index, num_clients):\n"
        "    x, y = load_rows('train', index)\n"
        "    return x[:, :7], y\n",
    )
    cfg = _with_plugin(tmp_path, folder)
    assert main(sim(write(tmp_path, cfg), app_dir=folder)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "failed on a batch of data.clients" in err and "[16, 7]" in err


@pytest.mark.parametrize("backend", ["inprocess", ON_RAY])
def test_a_crash_in_a_simulation_marks_the_run_failed(
    tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if backend == "ray":
        pytest.importorskip("ray")
    # Client 0 is fine (it is the one checked before the run); client 2's labels
    # are out of the model's range, so its training raises in round 1.
    folder = _plugin_app(
        tmp_path,
        "def client_data(index, num_clients):\n"
        "    x, y = load_rows('train', index)\n"
        "    return x, y + 5 * (index == 2)\n",
    )
    cfg = _with_plugin(tmp_path, folder)
    code, _, err = run_cli(sim(write(tmp_path, cfg), app_dir=folder), backend, capsys)
    assert code == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "IndexError" in last
    assert "'tabular' failed (marked failed in" in last
    status, reason = run_status(cfg)
    assert status == "failed" and reason is not None
    assert reason.startswith("the simulation crashed: IndexError")


def test_a_failing_client_data_call_is_one_line_and_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _plugin_app(
        tmp_path,
        "def client_data(index, num_clients):\n"
        "    if index == 1:\n"
        "        raise FileNotFoundError('hospital 1 has no rows today')\n"
        "    return load_rows('train', index)\n",
    )
    cfg = _with_plugin(tmp_path, folder)
    assert main(sim(write(tmp_path, cfg), app_dir=folder)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "for client 1 of 3 failed: FileNotFoundError: hospital 1" in err
    assert run_status(cfg)[0] == "failed"


@pytest.mark.integration
def test_tabular_on_ray_gives_the_in_process_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    results = {}
    for backend in ("inprocess", "ray"):
        (tmp_path / backend).mkdir()
        cfg = tabular_config(tmp_path / backend)
        code, out, err = run_cli(sim(write(tmp_path / backend, cfg)), backend, capsys)
        assert code == 0, err[-3000:]
        results[backend] = json.loads(out.strip().splitlines()[-1])
        assert run_status(cfg)[0] == "completed"
    ray, local = results["ray"], results["inprocess"]
    assert ray["backend"] == "ray" and ray["rounds"] == ROUNDS
    assert abs(ray["final_accuracy"] - local["final_accuracy"]) <= 0.01
