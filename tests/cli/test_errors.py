"""Every CLI and configuration error is one line on standard error and exit
status 2, never a traceback (and never gRPC's own C++ log lines).

Each case runs the real command in-process (``fedplat.cli.main``) with file
descriptor 2 captured, so what gRPC's C core writes is seen too. Restarts of a
run (corrupted checkpoints, a changed ``run.rounds``) start from a run that
completed two rounds in simulation.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fedplat.server.config import parse_config

from fedplat.cli import main
from fedplat.security.certs import create_ca, issue
from fedplat.sim import simulate
from fedplat.store import Store
from tests.support import digits_client, run_config

#: gRPC's C core logs as "E1124 06:07:13.190762 23509 file.cc:83] ...".
_CORE_LOG = re.compile(r"^[EWID]\d{4} \d\d:\d\d:\d\d")
#: Our own log lines (logging.basicConfig's format in fedplat.cli.common).
_OUR_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """``main`` configures logging on the stream of the current capture; restore
    the root logger afterwards so no later test writes to a closed stream."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []
    yield
    root.handlers = saved


def one_line_error(argv: list[str], capfd: pytest.CaptureFixture[str]) -> str:
    """Run ``fedplat argv``; it must exit 2 with exactly one ``fedplat:`` line,
    no traceback and no gRPC core log. Returns that line."""
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert not [ln for ln in lines if _CORE_LOG.match(ln)], err
    ours = [ln for ln in lines if ln.startswith("fedplat: ")]
    others = [ln for ln in lines if not ln.startswith("fedplat: ")]
    assert len(ours) == 1, err
    assert all(_OUR_LOG.match(ln) for ln in others), err
    return ours[0]


def _config(tmp: Path, **sections: Any) -> Path:
    cfg = run_config(tmp, rounds=2, clients=2)
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _coordinator(path: Path, *extra: str) -> list[str]:
    return ["coordinator", "--config", str(path), *extra]


# ------------------------------------------------------------ run files


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"run": {"seed": "abc"}}, "run.seed: Input should be a valid integer"),
        ({"run": {"rounds": "many"}}, "run.rounds: Input should be a valid integer"),
        ({"data": {"dataset": "cifar10"}}, "unknown dataset 'cifar10'"),
        ({"server": {"address": "nonsense"}}, "server.address: 'nonsense' is not HOST"),
    ],
)
def test_bad_values_in_the_run_file(
    tmp_path: Path,
    sections: dict[str, Any],
    message: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    path = _config(tmp_path, **sections)
    for argv in (_coordinator(path), ["sim", "--config", str(path)]):
        assert message in one_line_error(argv, capfd)


# ------------------------------------------------------------ stores


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("{tmp}/afile/fedplat.db", "exists and is not a folder"),
        ("{tmp}", "unable to open database file"),
        ("{tmp}/afile", "file is not a database"),
        ("nosuchdb://x", "cannot open store 'nosuchdb://x'"),
        ("postgresql+psycopg://u:secret@127.0.0.1:{port}/db", "Connection refused"),
    ],
)
def test_bad_store_paths_and_urls(
    tmp_path: Path, store: str, message: str, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("not a database")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = store.format(tmp=tmp_path, port=port)
    path = _config(tmp_path)
    line = one_line_error(_coordinator(path, "--db", url), capfd)
    assert message in line and "secret" not in line
    # The operator commands on a store say so on one line too ("store check"
    # may refuse earlier: a path that is not a file holds no store).
    for argv in (["store", "check"], ["tokens", "create", "--count", "1"]):
        line = one_line_error([*argv[:2], "--db", url, *argv[2:]], capfd)
        assert "secret" not in line


# ------------------------------------------------------------ listening


def test_address_in_use(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        path = _config(tmp_path)
        line = one_line_error(_coordinator(path, "--address", address), capfd)
    assert "already in use" in line
    assert not (tmp_path / "fedplat.db").exists()  # refused before the store


def test_unknown_host_and_foreign_address(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path)
    line = one_line_error(
        _coordinator(path, "--address", "no-such-host.invalid:1"), capfd
    )
    assert "unknown host" in line
    # 192.0.2.1 (TEST-NET-1) is not an address of this machine.
    line = one_line_error(_coordinator(path, "--address", "192.0.2.1:50051"), capfd)
    assert "cannot listen on 192.0.2.1:50051" in line


# ------------------------------------------------------------ TLS files


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_ca(d)
    issue(d, "server", server=True, sans=("127.0.0.1",))
    issue(d, "other", server=True, sans=("127.0.0.1",))
    (d / "junk.pem").write_text("hello\n")
    (d / "fake.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    return d


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ({"cert": "missing.pem", "key": "server.key"}, "missing.pem: No such file"),
        ({"cert": "server.pem", "key": "missing.key"}, "missing.key: No such file"),
        ({"cert": "junk.pem", "key": "server.key"}, "not a PEM certificate"),
        ({"cert": "fake.pem", "key": "server.key"}, "not a PEM certificate"),
        ({"cert": "server.pem", "key": "junk.pem"}, "not an unencrypted PEM"),
        ({"cert": "server.pem", "key": "other.key"}, "does not belong to the cert"),
        (
            {"cert": "server.pem", "key": "server.key", "client_ca": "fake.pem"},
            "server.tls.client_ca",
        ),
    ],
)
def test_bad_tls_files(
    tmp_path: Path,
    pki: Path,
    tls: dict[str, str],
    message: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    files = {k: str(pki / v) for k, v in tls.items()}
    path = _config(tmp_path, server={"insecure": False, "tls": files})
    assert message in one_line_error(_coordinator(path), capfd)


def test_client_with_bad_tls_files(
    tmp_path: Path, pki: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    base = ["client", "--address", "127.0.0.1:1", "--dataset", "digits"]
    base += ["--partition-id", "0", "--give-up-after", "1"]
    line = one_line_error([*base, "--root-cert", str(pki / "junk.pem")], capfd)
    assert "--root-cert" in line and "not a PEM certificate" in line
    line = one_line_error(
        [
            *base,
            "--root-cert",
            str(pki / "ca.pem"),
            "--cert",
            str(pki / "server.pem"),
            "--key",
            str(pki / "other.key"),
        ],
        capfd,
    )
    assert "does not belong to the certificate" in line
    argv = [*base, "--insecure", "--num-partitions", "4", "--partition-id", "9"]
    assert "partition_id must be in [0, 4)" in one_line_error(argv, capfd)


def test_certs_in_an_unwritable_place(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("x")
    line = one_line_error(["certs", "ca", "--dir", str(tmp_path / "afile/ca")], capfd)
    assert "cannot write certificates" in line


# ------------------------------------------------------------ checkpoints


def test_unwritable_checkpoint_folder_is_refused_at_start(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("x")
    path = _config(tmp_path, checkpoints={"dir": str(tmp_path / "afile" / "ckpt")})
    line = one_line_error(_coordinator(path), capfd)
    assert "checkpoints.dir" in line and "afile" in line


@pytest.fixture
def finished_run(tmp_path: Path) -> tuple[Path, Store, str]:
    """A run that completed its two rounds (in simulation): its run file,
    store and id."""
    path = _config(tmp_path)
    cfg = parse_config(yaml.safe_load(path.read_text()))
    store = Store(cfg.store.url)
    res = simulate(cfg, lambda i, f: digits_client(i, f, 2), 2, store=store)
    assert len(res.rounds) == 2 and all(r.completed for r in res.rounds)
    return path, store, res.run_id


def _last_checkpoint(store: Store, run_id: str) -> Path:
    last = store.last_completed_round(run_id)
    assert last is not None and last.checkpoint_path is not None
    return Path(last.checkpoint_path)


Tamper = Callable[[Path], None]


def _flip_bytes(p: Path) -> None:
    with p.open("r+b") as f:
        f.seek(100)
        f.write(b"XXXX")


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:50])


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_flip_bytes, "does not match its recorded SHA-256"),
        (_truncate, "does not match its recorded SHA-256"),
        (Path.unlink, "is missing"),
    ],
)
def test_restart_on_a_tampered_checkpoint_is_refused(
    finished_run: tuple[Path, Store, str],
    tamper: Tamper,
    message: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    path, store, run_id = finished_run
    ckpt = _last_checkpoint(store, run_id)
    tamper(ckpt)
    capfd.readouterr()
    over = path.with_name("more.yaml")  # a restart that would go on training
    cfg = yaml.safe_load(path.read_text())
    cfg["run"]["rounds"] = 3
    over.write_text(yaml.safe_dump(cfg))
    line = one_line_error(_coordinator(over), capfd)
    assert message in line and str(ckpt) in line
    run = store.get_run(run_id)
    assert run is not None and run.total_rounds == 2  # nothing was changed


def test_an_unreadable_checkpoint_without_a_recorded_hash_is_refused(
    finished_run: tuple[Path, Store, str], tmp_path: Path
) -> None:
    from fedplat.server.checkpoint import CheckpointError, load_checkpoint

    _, store, run_id = finished_run
    ckpt = _last_checkpoint(store, run_id)
    _truncate(ckpt)
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(ckpt)


def test_fewer_rounds_than_completed_is_refused(
    finished_run: tuple[Path, Store, str], capfd: pytest.CaptureFixture[str]
) -> None:
    path, store, run_id = finished_run
    capfd.readouterr()
    cfg = yaml.safe_load(path.read_text())
    cfg["run"]["rounds"] = 1
    path.write_text(yaml.safe_dump(cfg))
    line = one_line_error(_coordinator(path), capfd)
    assert "already completed 2 rounds; run.rounds 1 would cut it short" in line
    run = store.get_run(run_id)
    assert run is not None and run.total_rounds == 2 and run.status == "completed"
