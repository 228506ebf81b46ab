"""The monitor tells the truth about failures, in a real browser.

A coordinator and 3 client processes train on 127.0.0.1 (3 clients needed live,
2 updates enough to close a round). One client process is SIGKILLed: the monitor
must show it lost and the run waiting for clients (``2/3``: the run file sets no
``wait_for_clients_seconds``, so the coordinator waits). Then the coordinator is
SIGKILLed: the run must show as interrupted, not running. Screenshots of each
state go to ``$FEDPLAT_SCREENSHOTS_DIR`` (``bench/results/screenshots`` for the
committed ones).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from fedplat.store import Store
from fedplat.transport.health import wait_healthy
from tests.support import Procs, issue_tokens, run_config, wait_for, write_config
from tests.support.browser import (
    BROWSER_TEST,
    grid,
    no_exception,
    screenshots_dir,
    start_monitor,
)

CLIENTS = 3
RUN = "browser-faults"

pytestmark = BROWSER_TEST
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs the playwright package (dev extra)"
)


def _header(page: Any) -> Any:
    """The run page's title line, with its state badge."""
    return page.locator("h2").filter(has_text=RUN)


def _row(page: Any, text: str) -> Any:
    return grid(page).locator('[role="row"]').filter(has_text=text)


def test_a_dead_client_and_a_dead_coordinator_in_chromium(
    tmp_path: Path, procs: Procs, browser: Any
) -> None:
    shots = screenshots_dir(tmp_path)
    cfg = run_config(
        tmp_path,
        name=RUN,
        rounds=200,  # it must not end on its own during the test
        clients=CLIENTS,
        quorum=2,
        deadlines={"round_seconds": 8, "liveness_seconds": 10},
        server={"long_poll_seconds": 3},
    )
    db = cfg["store"]["url"]
    coord = procs.coordinator(write_config(tmp_path, cfg))
    wait_healthy(cfg["server"]["address"], 180)
    tokens = issue_tokens(cfg, CLIENTS)
    clients = [
        procs.client(cfg["server"]["address"], i, CLIENTS, token=tokens[i])
        for i in range(CLIENTS)
    ]
    base = start_monitor(procs, db)
    store = Store(db, migrate=False)
    run = wait_for(lambda: store.get_run_by_name(RUN), 60, "the run")

    def progress() -> int:
        now = store.get_run(run.id)
        return now.current_round if now is not None else 0

    wait_for(lambda: progress() >= 2, 240, "two rounds", procs=procs)
    page = browser.new_page(viewport={"width": 1500, "height": 1800})
    page.goto(f"{base}/run?run={run.id}")
    sync_api.expect(_header(page)).to_contain_text("running", timeout=60_000)
    no_exception(page)

    # A device dies: no goodbye, no more polls.
    clients[2].send_signal(signal.SIGKILL)
    clients[2].wait(timeout=30)

    def waiting() -> bool:
        now = store.get_run(run.id)
        return now is not None and now.phase == "waiting_for_clients"

    # Its round closes at the deadline with the 2 others; then the coordinator
    # waits for a third live client, which never comes.
    wait_for(waiting, 120, "the coordinator to wait for clients", procs=procs)
    header = _header(page)
    sync_api.expect(header).to_contain_text("waiting for clients: 2/3", timeout=60_000)
    lost = page.locator('[data-testid="stAlert"]').filter(has_text="Lost")
    sync_api.expect(lost).to_contain_text("client-2", timeout=30_000)
    sync_api.expect(lost).not_to_contain_text("client-0")
    warning = page.locator('[data-testid="stAlert"]').filter(
        has_text="Waiting for clients: 2/3"
    )
    sync_api.expect(warning).to_contain_text("waits indefinitely")
    no_exception(page)
    page.screenshot(path=str(shots / "dead_client_run.png"), full_page=True)

    page.goto(f"{base}/clients?run={run.id}")
    grid(page).wait_for(state="attached", timeout=60_000)
    sync_api.expect(_row(page, "client-2")).to_contain_text("lost", timeout=30_000)
    for i in range(2):
        sync_api.expect(_row(page, f"client-{i}")).not_to_contain_text("lost")
    no_exception(page)
    page.screenshot(path=str(shots / "dead_client_clients.png"), full_page=True)

    # The coordinator dies the same way: the store still says "running".
    coord.send_signal(signal.SIGKILL)
    coord.wait(timeout=30)
    page.goto(f"{base}/run?run={run.id}")
    header = _header(page)
    # Its heartbeat goes stale (fedplat.ui.status.STALE_AFTER_SECONDS).
    sync_api.expect(header).to_contain_text("interrupted", timeout=120_000)
    sync_api.expect(header).not_to_contain_text("running")
    sync_api.expect(header).not_to_contain_text("waiting")
    crashed = store.get_run(run.id)
    assert crashed is not None and crashed.status == "running"  # the stored word
    alert = page.locator('[data-testid="stAlert"]').filter(has_text="Interrupted")
    sync_api.expect(alert).to_contain_text("No heartbeat from the coordinator")
    sync_api.expect(page.get_by_role("heading", name="Summary so far")).to_have_count(1)
    no_exception(page)
    page.screenshot(path=str(shots / "crash_run.png"), full_page=True)

    page.goto(f"{base}/")
    runs = grid(page)
    runs.wait_for(state="attached", timeout=60_000)
    sync_api.expect(_row(page, RUN)).to_contain_text("interrupted", timeout=30_000)
    sync_api.expect(_row(page, RUN)).not_to_contain_text("running")
    no_exception(page)
    page.screenshot(path=str(shots / "crash_runs.png"), full_page=True)
    store.close()
