"""Browser tests of the monitor: Debian's Chromium driven by Playwright (never
``playwright install``), and ``fedplat monitor`` started on a free port.

The ``browser`` fixture (tests/conftest.py) launches Chromium; test modules skip
themselves with :data:`BROWSER_TEST` and ``pytest.importorskip``.
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import free_port
from tests.support.procs import Procs, wait_for

CHROMIUM = shutil.which("chromium")

#: From ENVIRONMENT.md: Debian's Chromium, headless, as root in a container.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs Debian's chromium for the browser test "
    "(apt-get install chromium; `make setup` installs it)",
)

#: Marks of a browser test module: a real browser and real processes.
BROWSER_TEST = [pytest.mark.integration, pytest.mark.timeout(600), NEEDS_CHROMIUM]


def screenshots_dir(tmp_path: Path) -> Path:
    """``$FEDPLAT_SCREENSHOTS_DIR`` (``bench/results/screenshots`` for the
    committed ones), else a folder of the test's own."""
    shots = Path(os.environ.get("FEDPLAT_SCREENSHOTS_DIR") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def start_monitor(procs: Procs, db: str, refresh: float = 1.0) -> str:
    """``fedplat monitor`` on ``db``; returns its base URL once it answers."""
    port = free_port()
    procs.start(
        "monitor",
        [
            "-m",
            "fedplat.cli",
            "monitor",
            "--db",
            db,
            "--port",
            str(port),
            "--refresh",
            str(refresh),
        ],
    )
    base = f"http://127.0.0.1:{port}"
    wait_for(
        lambda: _healthy(f"{base}/_stcore/health"), 180, "the monitor", procs=procs
    )
    return base


def metric(page: Any, label: str) -> Any:
    """The ``st.metric`` whose label contains ``label``. Stale elements are left
    out: while a live panel re-runs with a new layout (a line of client states
    appears above the metrics), the old metric lingers, marked stale, beside the
    new one."""
    return page.locator(
        '[data-testid="stElementContainer"]:not([data-stale="true"]) '
        '[data-testid="stMetric"]'
    ).filter(has_text=label)


def grid(page: Any) -> Any:
    """The first data grid: drawn on a canvas, its accessible table holds the
    text."""
    return page.locator('[data-testid="stDataFrame"] [role="grid"]').first


def no_exception(page: Any) -> None:
    """No Python exception on the page, no "page not found", no Deploy button
    (the monitor runs with ``client.toolbarMode = viewer``)."""
    assert page.locator('[data-testid="stException"]').count() == 0, page.content()
    assert page.get_by_text("Page not found").count() == 0, page.url
    assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
    assert page.get_by_role("button", name="Deploy").count() == 0


__all__ = [
    "BROWSER_TEST",
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "NEEDS_CHROMIUM",
    "grid",
    "metric",
    "no_exception",
    "screenshots_dir",
    "start_monitor",
]
