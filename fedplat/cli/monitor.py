"""``fedplat monitor``: the Streamlit monitor of a store, read-only."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Any


def _die_with_parent() -> None:
    """In the Streamlit child: get SIGTERM when ``fedplat monitor`` dies.

    A monitor killed outright (SIGKILL, the OOM killer, a test's teardown) cannot
    forward a signal; without this its Streamlit server lives on as an orphan,
    holding the port. Linux only (prctl); elsewhere nothing changes.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def cmd_monitor(args: argparse.Namespace) -> int:
    """Serve the Streamlit monitor (``fedplat.ui``) on a store, read-only."""
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        print(
            "fedplat: the monitor needs the ui extra: pip install 'fedplat[ui]'",
            file=sys.stderr,
        )
        return 2
    from fedplat.ui import APP_PATH, DB_ENV, REFRESH_ENV, display_url

    db = args.db or os.environ.get(DB_ENV)
    if not db:
        print(f"fedplat: give --db URL or set {DB_ENV}", file=sys.stderr)
        return 2
    # The URL travels in the environment, not argv: a PostgreSQL password would
    # otherwise be visible to every user through ps.
    env = {**os.environ, DB_ENV: db, REFRESH_ENV: str(args.refresh)}
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.headless",
        "true",
        "--server.address",
        args.address,
        "--server.port",
        str(args.port),
        "--browser.gatherUsageStats",
        "false",
        # A monitor is for watching runs: no Deploy button or developer menu,
        # whichever address the browser comes from.
        "--client.toolbarMode",
        "viewer",
    ]
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)

    def _forward(signum: int, frame: Any) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    print(
        f"monitor on http://{args.address}:{args.port} (store {display_url(db)})",
        flush=True,
    )
    return proc.wait()


def register(sub: Any) -> None:
    """Add ``fedplat monitor``."""
    m = sub.add_parser("monitor", help="web monitor of a store (Streamlit, read-only)")
    m.add_argument(
        "--db", help="store URL or SQLite path (default: $FEDPLAT_MONITOR_DB)"
    )
    m.add_argument("--port", type=int, default=8501, help="port to serve on")
    m.add_argument("--address", default="127.0.0.1", help="interface to bind")
    m.add_argument(
        "--refresh", type=float, default=3.0, help="seconds between live refreshes"
    )
    m.set_defaults(func=cmd_monitor)
