"""bench/load.py: its summary and goals on hand-made client reports, and the
tiny mode checking the direction of its claims (every client connected, every
round complete, no failure, tasks handed out by waking the selected clients,
not at their next poll)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import REPO, run_bench


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))


def test_summary_counts_failures_from_clients_and_the_store() -> None:
    from bench.fleet import RoundRow
    from bench.load import TINY, Watcher, goals, summarize

    fleets = [
        {"latencies": [0.01, 0.02], "failures": [], "enrolled": 20, "finished": 20},
        {"latencies": [0.03, 2.0], "failures": ["client 7: boom"], "enrolled": 20,
         "finished": 19},
    ]  # fmt: skip
    rows = [
        RoundRow(1, "completed", 100.0, 101.0, 10, 10, 5, 5),
        RoundRow(2, "completed", 101.0, 103.0, 10, 9, 5, 5),
        RoundRow(3, "failed", 103.0, 104.0, 10, 0, 0, 0),
    ]
    watch = Watcher(port=1, pid=1)
    watch.peak_connections, watch.peak_threads = 40, 45
    r = summarize(TINY, 500.0, watch, fleets, rows)
    assert r["connected"] == 39  # one client did not see the run finish
    assert r["rounds_completed"] == 2
    assert r["failures"] == 1 + 1 + 10
    assert r["updates_per_s"] == pytest.approx(19 / 3.0, abs=0.1)
    assert r["task_latency_p50_s"] == pytest.approx(0.025)
    assert r["task_latency_max_s"] == 2.0
    g = goals(r, TINY)
    assert not g["all_connected_met"] and not g["all_rounds_met"]
    assert not g["no_failures_met"] and not g["p99_under_1s_met"]
    assert g["coordinator_under_1gb_met"]
    assert r["coordinator_peak_threads"] == 45
    assert not g["fewer_threads_than_clients_met"]  # 45 threads, 40 clients


def test_established_connections_are_read_from_proc(tmp_path: Path) -> None:
    import socket

    from bench.load import _established

    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        a = socket.create_connection(("127.0.0.1", port))
        b = socket.create_connection(("127.0.0.1", port))
        conns = [srv.accept()[0], srv.accept()[0]]
        assert _established(port) == 2
        for s in (a, b, *conns):
            s.close()


@pytest.mark.integration
def test_tiny_fleet_connects_and_is_woken(tmp_path: Path) -> None:
    data = run_bench("bench.load", tmp_path / "load.json", timeout=600)
    s = data["setup"]
    assert data["connected"] == s["clients"]
    # One TCP connection per client (gRPC channels pooled would share one).
    assert data["max_established_connections"] >= s["clients"]
    assert data["rounds_completed"] == s["rounds"]
    assert data["failures"] == 0, data["failure_examples"]
    assert data["tasks_received"] == s["rounds"] * s["per_round"]
    # Selected clients are woken when the round opens, not answered at their
    # next long poll: tasks reach polls that were already waiting. How many
    # depends on scheduling (a client that just uploaded polls after the next
    # round opened; on a loaded machine 20 of 80 did, where 2,000 of 2,000 did
    # in the committed run), so only the mechanism is asserted here; the wake-up
    # itself is tested deterministically in tests/server/test_waiting.py.
    assert data["tasks_woken_mid_poll"] > 0
    assert data["coordinator_peak_rss_mb"] > 0
    # grpc.aio: every client connected and waiting, yet fewer threads than
    # clients (a thread per long poll would need at least one each).
    assert 0 < data["coordinator_threads_at_max_connections"] < s["clients"]
    assert data["goals"]["fewer_threads_than_clients_met"]
