"""bench/fleet.py: how a benchmark run ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import PeakRss
from bench.fleet import serve_to_end
from bench.round_overhead import SLACK, SLACK_MB


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


#: A server that touches ``ALLOC_MB`` of fresh memory, frees it, writes its own
#: high-water mark (VmHWM, kB) to argv[1], and stays alive for several of
#: PeakRss's 0.2 s samples before exiting.
ALLOCATING_SERVER = """
import sys, time
from pathlib import Path
block = b"\\x01" * ({alloc} * 1000 * 1000)  # every page written: resident
del block  # freed: the current RSS drops, the peak does not
hwm = next(ln for ln in Path("/proc/self/status").read_text().splitlines()
           if ln.startswith("VmHWM:"))
Path(sys.argv[1]).write_text(hwm.split()[1])
time.sleep(1.5)
"""
ALLOC_MB = 120


def test_a_clean_run_returns_the_server_peak(tmp_path: Path) -> None:
    hwm = tmp_path / "hwm"
    code = ALLOCATING_SERVER.format(alloc=ALLOC_MB)
    server = subprocess.Popen([sys.executable, "-c", code, str(hwm)])
    client = _python("pass")
    peak = PeakRss(server.pid).start()
    mb = serve_to_end(server, [client], peak, 50.0, tmp_path / "server.log")
    # The model of this server: its peak is its interpreter plus the block it
    # held, and the process reports that peak itself (VmHWM, kB -> MB of 1e6
    # bytes as PeakRss). The value returned is the server's own high-water mark,
    # not its RSS at the end (the block is freed by then) and not the client's:
    # equal to what it reported, within the 0.1 MB rounding and a page or two
    # touched after writing it.
    own = int(hwm.read_text()) * 1024 / 1e6
    assert own >= ALLOC_MB  # the block was resident
    assert mb == pytest.approx(own, abs=0.5)
    # And within the benchmarks' memory model (bench/round_overhead.py: a peak
    # fits when peak <= predicted x SLACK + SLACK_MB) with predicted = the
    # block; the bare interpreter (~10 MB) is within SLACK_MB.
    assert ALLOC_MB <= mb <= ALLOC_MB * SLACK + SLACK_MB
