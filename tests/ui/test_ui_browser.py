"""The monitor in a real browser, watching a real run end to end.

A coordinator and 3 client processes train the digits MLP on 127.0.0.1 while an
in-process gossip simulation writes a second run into the same store; ``fedplat
monitor`` serves that store and Playwright drives Debian's Chromium through every
page. The run page is opened before any client connects and never reloaded, so
reaching the last round on screen proves the live refresh.

Needs ``chromium`` (``apt-get install chromium``; ``make setup`` installs it) and
the ``playwright`` package; never ``playwright install``. Screenshots go to
``$FEDPLAT_SCREENSHOTS_DIR`` (``bench/results/screenshots`` for the committed
ones) or the test's temporary folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedplat.store import Store
from fedplat.transport.health import wait_healthy
from tests.support import (
    REPO,
    Procs,
    issue_tokens,
    run_config,
    wait_for,
    write_config,
)
from tests.support.browser import (
    BROWSER_TEST,
    grid,
    metric,
    no_exception,
    screenshots_dir,
    start_monitor,
)

ROUNDS = 3
CLIENTS = 3
SCENARIO = REPO / "examples" / "scenarios" / "ring_kill.toml"

pytestmark = BROWSER_TEST
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs the playwright package (dev extra)"
)


def test_monitor_follows_a_live_run_in_chromium(
    tmp_path: Path, procs: Procs, browser: Any
) -> None:
    shots = screenshots_dir(tmp_path)
    # Compression, DP and contribution accounting on, so every panel of the run
    # and contributions pages has real data to draw. (Local DP: central DP
    # refuses contribution scoring, whose per-client scores it does not cover.)
    cfg = run_config(
        tmp_path,
        name="browser-e2e",
        rounds=ROUNDS,
        clients=CLIENTS,
        aggregator={"name": "fedavg", "weighted": False},
        compression={"name": "countsketch", "params": {"rows": 1, "cols": 2400}},
        # Little noise (epsilon in the thousands): 3 clients cannot hide much, and
        # the accuracy curve should still rise on screen.
        privacy={"mode": "local", "noise_multiplier": 0.02, "clip_norm": 1.0},
        contribution={
            "enabled": True,
            "scorers": ["leave_one_out", "cosine"],
            "primary": "leave_one_out",
            "key_path": str(tmp_path / "ledger.pem"),
        },
    )
    db = cfg["store"]["url"]
    address = cfg["server"]["address"]
    coord = procs.coordinator(write_config(tmp_path, cfg))
    wait_healthy(address, 180)
    # The gossip run shares the store: two writers, one read-only monitor.
    gossip = procs.start(
        "gossip",
        [
            "-m",
            "fedplat.cli",
            "gossip",
            "sim",
            "--scenario",
            str(SCENARIO),
            "--store",
            db,
            "--no-progress",
            "--threads",
            "1",
        ],
    )
    base = start_monitor(procs, db)
    store = Store(db, migrate=False)
    run = wait_for(lambda: store.get_run_by_name("browser-e2e"), 60, "the run")

    page = browser.new_page(viewport={"width": 1500, "height": 2300})
    page.goto(f"{base}/run?run={run.id}")
    current = metric(page, "Current round")
    current.wait_for(timeout=60_000)
    assert f"0 / {ROUNDS}" in current.inner_text()  # no client yet

    tokens = issue_tokens(cfg, CLIENTS)
    for i in range(CLIENTS):
        procs.client(address, i, CLIENTS, token=tokens[i])
    # Same page, no reload: the live fragment must bring every round in.
    try:
        sync_api.expect(current).to_contain_text(
            f"{ROUNDS} / {ROUNDS}", timeout=300_000
        )
    except AssertionError as exc:  # say whether the run or the page stalled
        page.screenshot(path=str(shots / "stalled.png"), full_page=True)
        now = store.get_run(run.id)
        events = [(e.kind, e.message) for e in store.list_events(run.id, limit=15)]
        raise AssertionError(
            f"{exc}\nrun in the store: {now}\nnewest events: {events}"
        ) from None

    page.reload()  # the final state, as a new visitor sees it
    accuracy = page.locator('[data-testid="stVegaLiteChart"]').filter(
        has_text="Global accuracy"
    )
    accuracy.locator("svg.marks path").first.wait_for(timeout=60_000)
    points = accuracy.locator("g.mark-symbol path")
    sync_api.expect(points).to_have_count(ROUNDS, timeout=30_000)
    sync_api.expect(metric(page, "Current round")).to_contain_text(
        f"{ROUNDS} / {ROUNDS}"
    )
    sync_api.expect(
        page.locator('[data-testid="stVegaLiteChart"]').filter(
            has_text="Aggregator verdict"
        )
    ).to_have_count(1)
    for title in ("Compression ratio", "Privacy spent (ε) per round"):
        chart = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text=title)
        sync_api.expect(chart.locator("g.mark-symbol path")).to_have_count(ROUNDS)
    no_exception(page)
    page.screenshot(path=str(shots / "run.png"), full_page=True)

    page.goto(f"{base}/clients?run={run.id}")
    clients = grid(page)
    clients.wait_for(state="attached", timeout=60_000)
    for i in range(CLIENTS):
        sync_api.expect(clients).to_contain_text(f"client-{i}", timeout=30_000)
    sync_api.expect(metric(page, "Enrolled")).to_contain_text(str(CLIENTS))
    no_exception(page)
    page.screenshot(path=str(shots / "clients.png"), full_page=True)

    page.goto(f"{base}/contributions?run={run.id}")
    page.get_by_role("heading", name="Ledger").wait_for(timeout=60_000)
    sync_api.expect(page.get_by_text("Ledger verified")).to_have_count(
        1, timeout=60_000
    )
    grids = page.locator('[data-testid="stDataFrame"] [role="grid"]')
    sync_api.expect(grids).to_have_count(2, timeout=60_000)  # leaderboard, ledger
    for i in range(CLIENTS):
        sync_api.expect(grids.first).to_contain_text(f"client-{i}", timeout=30_000)
    no_exception(page)
    page.screenshot(path=str(shots / "contributions.png"), full_page=True)

    wait_for(lambda: gossip.poll() is not None, 240, "the gossip run", procs=procs)
    assert gossip.returncode == 0, procs.log("gossip")
    ring = store.get_run_by_name("ring-kill")
    assert ring is not None
    page.goto(f"{base}/gossip?run={ring.id}")
    topology = page.locator('[data-testid="stVegaLiteChart"]').filter(
        has_text="Topology"
    )
    topology.locator("svg.marks path").first.wait_for(timeout=60_000)
    # ring_kill: nodes 2 and 5 die after round 4, node 2 rejoins after round 10.
    sync_api.expect(metric(page, "Live nodes")).to_contain_text("7 / 8")
    no_exception(page)
    page.screenshot(path=str(shots / "gossip.png"), full_page=True)

    page.goto(f"{base}/")  # the default page: Runs
    runs = grid(page)
    runs.wait_for(state="attached", timeout=60_000)
    sync_api.expect(runs).to_contain_text("browser-e2e", timeout=30_000)
    sync_api.expect(runs).to_contain_text("ring-kill")
    no_exception(page)
    page.screenshot(path=str(shots / "runs.png"), full_page=True)

    wait_for(lambda: coord.poll() is not None, 120, "the run to end", procs=procs)
    assert coord.returncode == 0, procs.log("coordinator")
    assert store.get_run(run.id).status == "completed"  # type: ignore[union-attr]
    store.close()
