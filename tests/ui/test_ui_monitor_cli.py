"""``fedplat monitor``: loopback unless there is a login (or an explicit flag),
Streamlit started hardened, and the password file checked before it starts.

The unit tests replace ``subprocess.Popen`` and read the command line and the
environment ``fedplat monitor`` would start Streamlit with; the integration test
starts the real server and checks its Host allow-list against DNS rebinding.
"""

from __future__ import annotations

import base64
import http.client
import io
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fedplat.ui import PASSWORD_FILE_ENV
from fedplat.ui.auth import load_password_file

from fedplat.cli import main, monitor
from tests.support import Procs
from tests.support.ui_fixture import build_empty_db, serve_monitor

PASSWORD = "s3cret monitor password"


class FakePopen:
    """Records what would have been started; the server "exits" at once."""

    started: ClassVar[list[FakePopen]] = []

    def __init__(self, cmd: list[str], env: dict[str, str], **_: Any) -> None:
        self.cmd, self.env = cmd, env
        FakePopen.started.append(self)

    def options(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        args = self.cmd[self.cmd.index("run") + 2 :]
        for flag, value in zip(args[::2], args[1::2], strict=True):
            out.setdefault(flag.removeprefix("--"), []).append(value)
        return out

    def wait(self) -> int:
        return 0

    def send_signal(self, signum: int) -> None:  # pragma: no cover
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> type[FakePopen]:
    FakePopen.started = []
    monkeypatch.setattr(monitor.subprocess, "Popen", FakePopen)
    # cmd_monitor forwards SIGTERM/SIGINT to the server: not pytest's handlers.
    monkeypatch.setattr(monitor.signal, "signal", lambda *a: None)
    monkeypatch.delenv(PASSWORD_FILE_ENV, raising=False)
    # The tests name the store "x.db": it must exist (a missing one is refused).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.db").touch()
    return FakePopen


def _pw_file(tmp_path: Path) -> Path:
    path = tmp_path / "monitor.pw"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


def test_loopback_is_served_without_a_login(
    fake: type[FakePopen], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["monitor", "--db", "x.db"]) == 0
    (proc,) = fake.started
    opts = proc.options()
    assert opts["server.address"] == ["127.0.0.1"]
    assert opts["server.allowedHosts"] == ["localhost", "127.0.0.1", "::1"]
    assert PASSWORD_FILE_ENV not in proc.env
    assert "no login" in capsys.readouterr().out


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.0.2.7", "monitor.lan"])
def test_other_addresses_are_refused_without_a_login(
    fake: type[FakePopen], capsys: pytest.CaptureFixture[str], address: str
) -> None:
    assert main(["monitor", "--db", "x.db", "--address", address]) == 2
    assert not fake.started
    err = capsys.readouterr().err
    assert "REFUSING" in err and "--password-file" in err
    assert "--insecure-no-login" in err


def test_insecure_no_login_serves_with_a_loud_warning(
    fake: type[FakePopen], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["monitor", "--db", "x.db", "--address", "0.0.0.0", "--insecure-no-login"]
    assert main(argv) == 0
    (proc,) = fake.started
    assert proc.options()["server.address"] == ["0.0.0.0"]
    assert "server.allowedHosts" not in proc.options()  # wildcard: names unknown
    assert "WITHOUT A LOGIN" in capsys.readouterr().err


def test_a_password_file_allows_other_addresses(
    fake: type[FakePopen], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pw = _pw_file(tmp_path)
    argv = ["monitor", "--db", "x.db", "--address", "192.0.2.7"]
    argv += ["--password-file", str(pw), "--allowed-host", "monitor.example.org"]
    assert main(argv) == 0
    (proc,) = fake.started
    # The path travels in the environment; the password never leaves the file.
    assert proc.env[PASSWORD_FILE_ENV] == str(pw.resolve())
    assert PASSWORD not in " ".join(proc.cmd) + " ".join(proc.env.values())
    assert proc.options()["server.allowedHosts"] == [
        "localhost",
        "127.0.0.1",
        "::1",
        "monitor.example.org",
        "192.0.2.7",
    ]
    captured = capsys.readouterr()
    assert "REFUSING" not in captured.err and "WITHOUT A LOGIN" not in captured.err
    assert "TLS reverse proxy" in captured.err  # the password crosses in clear
    assert "password" in captured.out


def test_bad_password_files_stop_the_start(
    fake: type[FakePopen], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.pw"
    empty.write_text("")
    for path in (empty, tmp_path / "missing.pw"):
        assert main(["monitor", "--db", "x.db", "--password-file", str(path)]) == 2
    assert not fake.started
    err = capsys.readouterr().err
    assert "is empty" in err and "cannot read" in err


def test_a_readable_password_file_is_warned_about(
    fake: type[FakePopen], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pw = _pw_file(tmp_path)
    pw.chmod(0o644)
    assert main(["monitor", "--db", "x.db", "--password-file", str(pw)]) == 0
    assert "readable by other users" in capsys.readouterr().err


def test_streamlit_runs_hardened_with_options_it_knows(fake: type[FakePopen]) -> None:
    from streamlit import config

    assert main(["monitor", "--db", "x.db"]) == 0
    opts = fake.started[0].options()
    want = {
        "server.enableXsrfProtection": "true",
        "server.enableCORS": "true",
        "client.showErrorDetails": "type",
        "client.toolbarMode": "viewer",
        "server.enableStaticServing": "false",
        "server.enableAgentApi": "false",
        "server.fileWatcherType": "none",
        "browser.gatherUsageStats": "false",
        "server.headless": "true",
    }
    assert {k: opts[k] for k in want} == {k: [v] for k, v in want.items()}
    for key in opts:  # a misspelt option would stop Streamlit at start
        config.get_option(key)


def test_options_an_older_streamlit_lacks_are_left_out_and_named(
    fake: type[FakePopen],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from streamlit import config

    known = config.get_option

    def older(key: str) -> Any:
        if key in ("server.allowedHosts", "server.enableAgentApi"):
            raise RuntimeError(f'Config key "{key}" not defined.')
        return known(key)

    monkeypatch.setattr(config, "get_option", older)
    assert main(["monitor", "--db", "x.db"]) == 0
    opts = fake.started[0].options()
    assert "server.allowedHosts" not in opts and "server.enableAgentApi" not in opts
    assert opts["server.enableXsrfProtection"] == ["true"]
    err = capsys.readouterr().err
    assert "lacks server.enableAgentApi, server.allowedHosts" in err


@pytest.mark.parametrize("form", ["path", "url"])
def test_a_missing_sqlite_store_is_refused_at_the_cli(
    fake: type[FakePopen],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    form: str,
) -> None:
    missing = tmp_path / "nowhere" / "missing.db"
    db = str(missing) if form == "path" else f"sqlite:///{missing}"
    assert main(["monitor", "--db", db]) == 2
    assert not fake.started
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no store at {missing}" in err
    assert not missing.parent.exists()  # nothing created on the way


def test_a_missing_store_from_the_environment_is_refused_too(
    fake: type[FakePopen],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fedplat.ui import DB_ENV

    monkeypatch.setenv(DB_ENV, "missing.db")
    assert main(["monitor"]) == 2
    assert not fake.started
    assert "no store at missing.db" in capsys.readouterr().err


def test_a_server_database_is_not_checked_at_the_cli(
    fake: type[FakePopen], capsys: pytest.CaptureFixture[str]
) -> None:
    from fedplat.ui import DB_ENV

    url = "postgresql://monitor:s3cret@db.invalid/fedplat"
    assert main(["monitor", "--db", url]) == 0
    (proc,) = fake.started
    assert proc.env[DB_ENV] == url  # the page reports an unreachable server
    assert "s3cret" not in capsys.readouterr().out  # the URL is shown masked


def test_hash_password_prints_a_line_for_the_password_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["monitor", "--hash-password"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("scrypt$") and PASSWORD not in line
    path = tmp_path / "hashed.pw"
    path.write_text(line + "\n")
    assert load_password_file(path).matches(PASSWORD)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert main(["monitor", "--hash-password"]) == 2


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("10.0.0.1", False),
        ("host.example", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert monitor.is_loopback(address) is loopback


def _websocket_status(port: int, host: str) -> int:
    """The answer to a WebSocket handshake on Streamlit's stream with ``Host``
    (and a same-origin ``Origin``) set to ``host``, as a rebinding page sends."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            "GET",
            "/_stcore/stream",
            headers={
                "Host": f"{host}:{port}",
                "Origin": f"http://{host}:{port}",
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
                "Sec-WebSocket-Version": "13",
            },
        )
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_server_refuses_websockets_for_other_host_names(
    tmp_path: Path, procs: Procs
) -> None:
    db = tmp_path / "m.db"
    build_empty_db(db)
    base = serve_monitor(procs, db, "--allowed-host", "monitor.example.org")
    port = int(base.rsplit(":", 1)[1])
    for good in ("127.0.0.1", "localhost", "monitor.example.org"):
        assert _websocket_status(port, good) == 101, good
    # A page on evil.example whose name now resolves to 127.0.0.1.
    assert _websocket_status(port, "evil.example") == 403


def test_the_installed_websockets_is_one_streamlit_serves_safely() -> None:
    """websockets 16.1 and >= 17 decode headers as ISO-8859-1, and with uvicorn
    before 0.52 a proxy's non-ASCII header aborts the monitor's stream handshake
    (Streamlit warns at every start). Flower pins uvicorn below 0.50, so the ui
    extra pins websockets to a release that decodes them right."""
    from importlib.metadata import version

    from packaging.version import Version

    ws, uv = Version(version("websockets")), Version(version("uvicorn"))
    latin1 = ws >= Version("17") or Version("16.1") <= ws < Version("16.1.1")
    assert not (latin1 and uv < Version("0.52")), (ws, uv)
