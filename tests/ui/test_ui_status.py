"""The monitor's displayed states of runs and clients, from hand-made records at a
pinned time."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fedplat.ui import status

from fedplat.store import ClientRecord, RunRecord

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def s_ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def run(status_: str = "running", **kw: Any) -> RunRecord:
    config = kw.pop(
        "config",
        {
            "selection": {"min_available": 8},
            "deadlines": {"liveness_seconds": 30, "wait_for_clients_seconds": None},
        },
    )
    base = RunRecord(
        "r1", "run", status_, config, {}, 10, 2, None, s_ago(600), s_ago(600), None
    )
    return replace(base, **kw)


def client(last_seen: datetime | None, **kw: Any) -> ClientRecord:
    base = ClientRecord("r1", "c1", "phone", "active", s_ago(600), last_seen, 10, {})
    return replace(base, **kw)


# --------------------------------------------------------------------------- #
# Runs                                                                         #
# --------------------------------------------------------------------------- #


def test_a_beating_coordinator_is_running() -> None:
    view = status.run_view(
        run(heartbeat_at=s_ago(3), phase="training", live_clients=8), NOW
    )
    assert (view.state, view.label, view.alive_until) == (
        "running",
        "running (training)",
        NOW,
    )


def test_a_stale_heartbeat_is_an_interrupted_run_not_a_running_one() -> None:
    beat = s_ago(status.STALE_AFTER_SECONDS + 1)
    view = status.run_view(run(heartbeat_at=beat, phase="aggregating"), NOW)
    assert (view.state, view.label) == ("interrupted", "interrupted")
    assert view.alive_until == beat
    assert view.detail is not None
    assert "No heartbeat from the coordinator for 21s while aggregating" in view.detail
    # Just inside the window it is still running.
    fresh = s_ago(status.STALE_AFTER_SECONDS - 1)
    assert status.run_view(run(heartbeat_at=fresh), NOW).state == "running"


def test_a_clean_stop_is_interrupted_at_once_and_says_it_can_resume() -> None:
    view = status.run_view(run(heartbeat_at=s_ago(1), phase="stopped"), NOW)
    assert view.state == "interrupted"
    assert view.detail is not None and "stopped 1s ago" in view.detail
    assert "resumes from the last checkpoint" in view.detail


def test_waiting_for_clients_names_the_count_and_the_deadline() -> None:
    r = run("pending", heartbeat_at=s_ago(1), phase="waiting_for_clients")
    view = status.run_view(replace(r, live_clients=3), NOW)
    assert (view.state, view.label) == ("waiting", "waiting for clients: 3/8")
    assert view.detail is not None and "indefinitely" in view.detail
    timed = replace(
        r,
        live_clients=3,
        config={
            "selection": {"min_available": 8},
            "deadlines": {"wait_for_clients_seconds": 120},
        },
    )
    assert "within 120 s" in (status.run_view(timed, NOW).detail or "")


def test_ended_runs_keep_their_state_whatever_the_heartbeat() -> None:
    done = status.run_view(
        run("completed", finished_at=s_ago(50), heartbeat_at=s_ago(3600)), NOW
    )
    assert (done.state, done.detail, done.alive_until) == ("completed", None, s_ago(50))
    failed = run("failed", reason="round 3 failed 2 times", finished_at=s_ago(5))
    assert status.run_view(failed, NOW).detail == "round 3 failed 2 times"
    # A store written before runs kept a reason: the caller's fallback.
    old = replace(failed, reason=None)
    assert status.run_view(old, NOW, "from an event").detail == "from an event"


def test_runs_without_any_heartbeat() -> None:
    assert status.run_view(run("pending"), NOW).state == "pending"
    gossip = status.run_view(run("running"), NOW)
    assert gossip.state == "running"
    assert gossip.detail is not None and "no heartbeat" in gossip.detail
    starting = status.run_view(run("pending", heartbeat_at=NOW, phase="starting"), NOW)
    assert (starting.state, starting.label) == ("pending", "starting")


def test_liveness_window_comes_from_the_run_config() -> None:
    assert status.liveness_seconds(run()) == 30
    assert (
        status.liveness_seconds(run(config={"deadlines": {"liveness_seconds": 5}})) == 5
    )
    for bad in ({}, {"deadlines": {"liveness_seconds": "x"}}, {"deadlines": 3}):
        assert (
            status.liveness_seconds(run(config=bad)) == status.DEFAULT_LIVENESS_SECONDS
        )


# --------------------------------------------------------------------------- #
# Clients                                                                      #
# --------------------------------------------------------------------------- #

LIVE = status.run_view(run(heartbeat_at=s_ago(1), phase="training"), NOW)


@pytest.mark.parametrize(
    ("seen_s", "expected"),
    [(0, "active"), (status.ACTIVE_SECONDS, "active"), (11, "idle"), (30, "idle")],
)
def test_clients_of_a_live_run_by_age(seen_s: float, expected: str) -> None:
    assert status.client_state(client(s_ago(seen_s)), LIVE) == expected


def test_a_client_silent_past_the_liveness_window_is_lost() -> None:
    assert status.client_state(client(s_ago(31)), LIVE) == "lost"
    # Whatever the store's own status column still says.
    assert status.client_state(client(s_ago(31), status="active"), LIVE) == "lost"


def test_an_ended_run_finishes_its_clients_but_keeps_the_lost_ones_lost() -> None:
    ended = status.run_view(run("completed", finished_at=s_ago(100)), NOW)
    assert status.client_state(client(s_ago(102)), ended) == "finished"
    # Died 5 minutes before the run ended: lost, though the run is over.
    assert status.client_state(client(s_ago(400)), ended) == "lost"


def test_clients_of_an_interrupted_run_are_not_blamed_for_it() -> None:
    beat = s_ago(600)
    crashed = status.run_view(run(heartbeat_at=beat, phase="training"), NOW)
    assert crashed.state == "interrupted"
    # Heard 2 s before the coordinator died: interrupted, not lost 10 min later.
    assert status.client_state(client(beat - timedelta(seconds=2)), crashed) == (
        "interrupted"
    )
    assert status.client_state(client(beat - timedelta(minutes=5)), crashed) == "lost"


def test_operator_decisions_outrank_liveness() -> None:
    assert status.client_state(client(NOW, revoked_at=s_ago(5)), LIVE) == "revoked"
    assert status.client_state(client(s_ago(999), status="revoked"), LIVE) == (
        "revoked"
    )
    assert status.client_state(client(NOW, status="banned"), LIVE) == "banned"


def test_a_client_never_seen_counts_from_its_enrolment() -> None:
    fresh = client(None, enrolled_at=s_ago(2))
    assert status.client_state(fresh, LIVE) == "active"
    assert status.client_state(client(None), LIVE) == "lost"  # enrolled 10 min ago


def test_ago_and_span() -> None:
    assert status.ago(None, NOW) == "never"
    assert status.ago(s_ago(5), NOW) == "5s ago"
    assert status.ago(s_ago(185), NOW) == "3m 5s ago"
    assert status.span(7500) == "2h 5m"
    assert status.span(90000) == "1d 1h"
    assert status.ago(NOW + timedelta(seconds=3), NOW) == "0s ago"  # clock skew


def test_badges_colour_states() -> None:
    assert status.badge("lost") == ":red-badge[lost]"
    # The label is escaped: it can carry the coordinator's phase.
    assert status.badge("waiting", "waiting for clients: 3/8") == (
        ":orange-badge[waiting for clients\\: 3\\/8]"
    )
    assert status.badge("running", "running (x](http://e.example))") == (
        ":blue-badge[running \\(x\\]\\(http\\:\u2060\\/\\/e\\.example\\)\\)]"
    )
    assert set(status.STATE_COLORS) >= set(status.RUN_STATES) | (
        set(status.CLIENT_STATES) - {"interrupted"}
    )
