"""bench/fleet.py: how a benchmark run ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import PeakRss
from bench.fleet import serve_to_end


def _python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_failed_client_ends_the_run_at_once(tmp_path: Path) -> None:
    # A server that would wait for the client for a minute; the client fails.
    server = _python("import time; time.sleep(60)")
    client = _python("raise SystemExit(3)")
    peak = PeakRss(server.pid).start()
    with pytest.raises(RuntimeError, match="client process exited 3"):
        serve_to_end(server, [client], peak, 50.0, tmp_path / "server.log")
    assert server.poll() is not None  # stopped, not left behind


def test_a_clean_run_returns_the_server_peak(tmp_path: Path) -> None:
    server = _python("import time; time.sleep(2)")
    client = _python("pass")
    peak = PeakRss(server.pid).start()
    assert serve_to_end(server, [client], peak, 50.0, tmp_path / "server.log") > 0
