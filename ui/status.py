"""What the monitor says a run and its clients are doing: the one place where the
store's raw statuses and heartbeats become the states on screen.

A run's stored ``status`` says what its coordinator last wrote; it cannot say
that the coordinator has since died. The coordinator's heartbeat can: it stamps
``runs.heartbeat_at`` (with its ``phase`` and the number of live clients) every
:data:`~fedplat.store.HEARTBEAT_SECONDS` while it runs, and writes phase
``"stopped"`` when it stops cleanly. Clients' ``last_seen`` is stamped while
they are connected (every call, and every few seconds of a long poll), so
their age against the run's liveness window
(``deadlines.liveness_seconds`` in the run's config) is the driver's own test
of who is live.

Run states: ``pending`` (no round yet), ``waiting`` (for ``min_available``
live clients), ``running``, ``completed``, ``failed`` (with the stored
reason), ``interrupted`` (not ended, but its coordinator stopped or died).
Client states: ``active`` (heard within :data:`ACTIVE_SECONDS`), ``idle``
(quiet, still within the liveness window: training locally, or backing off),
``lost`` (silent for longer than the liveness window while the run was alive),
``finished`` (the run ended), ``interrupted`` (the run's coordinator is gone,
so nobody is listening), ``revoked`` and ``banned`` (by the operator).

Free of Streamlit and pandas; every function takes ``now`` so tests pin time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from fedplat.ui.markup import plain

from fedplat.store import HEARTBEAT_SECONDS, ClientRecord, RunRecord

RunState = Literal[
    "pending", "waiting", "running", "completed", "failed", "interrupted"
]
ClientState = Literal[
    "active", "idle", "lost", "finished", "interrupted", "revoked", "banned"
]
RUN_STATES: tuple[RunState, ...] = get_args(RunState)
CLIENT_STATES: tuple[ClientState, ...] = get_args(ClientState)

#: A heartbeat older than this means the coordinator no longer runs: ten missed
#: beats, so a store briefly busy with a large round's write is not a death.
#: Not derived from the run's config: ``deadlines.liveness_seconds`` measures
#: clients' silence, and nothing in a run file bounds how long the recorder's
#: beat can wait behind a round's closing transaction (the beat's period is the
#: store's fixed constant), so no run setting would allow a shorter wait without
#: painting a busy coordinator "interrupted".
STALE_AFTER_SECONDS = 10 * HEARTBEAT_SECONDS
#: A client heard within this many seconds is active. A connected client waiting
#: for a task is heard at least every 5 s (the coordinator touches long polls
#: that often), plus the recorder's batching; a client training locally is
#: quiet until it uploads.
ACTIVE_SECONDS = 10.0
#: ``deadlines.liveness_seconds`` of a run config that does not state it (the
#: coordinator's default).
DEFAULT_LIVENESS_SECONDS = 30.0

ENDED: tuple[RunState, ...] = ("completed", "failed")

#: Badge colour of each state (Streamlit's colour names).
STATE_COLORS: dict[str, str] = {
    "pending": "gray",
    "waiting": "orange",
    "running": "blue",
    "completed": "green",
    "failed": "red",
    "interrupted": "violet",
    "active": "green",
    "idle": "blue",
    "lost": "red",
    "finished": "gray",
    "revoked": "violet",
    "banned": "violet",
}


def config_section(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The table ``name`` of a run config (empty if absent or not a table)."""
    section = config.get(name)
    return section if isinstance(section, dict) else {}


def _positive(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def liveness_seconds(run: RunRecord) -> float:
    """The run's liveness window (``deadlines.liveness_seconds``)."""
    found = _positive(config_section(run.config, "deadlines").get("liveness_seconds"))
    return found if found is not None else DEFAULT_LIVENESS_SECONDS


def span(seconds: float) -> str:
    """``5`` -> ``"5s"``, ``185`` -> ``"3m 5s"``, ``7500`` -> ``"2h 5m"``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60}m"
    return f"{s // 86400}d {(s % 86400) // 3600}h"


def ago(when: datetime | None, now: datetime) -> str:
    """``"12s ago"``, ``"3m 5s ago"``; ``"never"`` for ``None``."""
    if when is None:
        return "never"
    return f"{span((now - when).total_seconds())} ago"


@dataclass(frozen=True)
class RunView:
    """A run as the monitor shows it.

    ``label`` is the short text of the badge ("waiting for clients: 3/8"),
    ``detail`` a sentence saying why (or ``None``), ``alive_until`` the last
    moment the run is known to have been driven (now while it is; the last
    heartbeat of an interrupted run; the end of an ended one), against which
    clients' silence is measured.
    """

    state: RunState
    label: str
    detail: str | None
    alive_until: datetime
    liveness_s: float

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def _waiting(run: RunRecord) -> tuple[str, str]:
    cfg = run.config
    need = config_section(cfg, "selection").get("min_available")
    live = run.live_clients if run.live_clients is not None else "?"
    label = f"waiting for clients: {live}/{need if need is not None else '?'}"
    wait = _positive(config_section(cfg, "deadlines").get("wait_for_clients_seconds"))
    if wait is None:
        detail = (
            "The coordinator waits for enough live clients before it opens a round; "
            "it waits indefinitely (deadlines.wait_for_clients_seconds is not set)."
        )
    else:
        detail = (
            "The coordinator waits for enough live clients before it opens a round; "
            f"the run fails if they are not there within {wait:g} s."
        )
    return label, detail


def _interrupted(run: RunRecord, now: datetime) -> RunView:
    hb = run.heartbeat_at
    assert hb is not None
    liveness = liveness_seconds(run)
    if run.phase == "stopped":
        detail = (
            f"The coordinator stopped {ago(hb, now)} before the run ended. "
            "Starting it again with the same run file resumes from the last "
            "checkpoint."
        )
    else:
        doing = f" while {run.phase.replace('_', ' ')}" if run.phase else ""
        detail = (
            f"No heartbeat from the coordinator for "
            f"{span((now - hb).total_seconds())}{doing}: "
            "it died or was killed. Starting it again with the same run file "
            "resumes from the last checkpoint."
        )
    return RunView("interrupted", "interrupted", detail, hb, liveness)


def run_view(run: RunRecord, now: datetime, reason: str | None = None) -> RunView:
    """The displayed state of ``run`` at ``now``.

    ``reason`` is the caller's fallback for a failed run without a stored
    ``reason`` (the newest error event, for runs written before it was stored).
    """
    liveness = liveness_seconds(run)
    hb = run.heartbeat_at
    if run.status == "completed":
        return RunView("completed", "completed", None, run.finished_at or now, liveness)
    if run.status == "failed":
        why = run.reason or reason
        return RunView("failed", "failed", why, run.finished_at or hb or now, liveness)
    if hb is not None and (
        run.phase == "stopped" or (now - hb).total_seconds() > STALE_AFTER_SECONDS
    ):
        return _interrupted(run, now)
    if hb is None:
        # No heartbeat at all: a writer that keeps none (gossip runs), or a
        # coordinator that has not started its recorder yet.
        detail = (
            None
            if run.status == "pending"
            else "This run's writer records no heartbeat, so whether it is still "
            "running cannot be told."
        )
        state: RunState = "pending" if run.status == "pending" else "running"
        return RunView(state, state, detail, now, liveness)
    if run.phase == "waiting_for_clients":
        label, detail = _waiting(run)
        return RunView("waiting", label, detail, now, liveness)
    if run.status == "pending":
        return RunView("pending", "starting", None, now, liveness)
    phase = (run.phase or "running").replace("_", " ")
    return RunView("running", f"running ({phase})", None, now, liveness)


def client_state(client: ClientRecord, run: RunView) -> ClientState:
    """The displayed state of one client of a run in state ``run``.

    Silence is measured up to the last moment the run was alive, so a device
    that died during a run stays "lost" after the run ends, and clients are not
    blamed for a coordinator that died.
    """
    if client.revoked_at is not None or client.status == "revoked":
        return "revoked"
    if client.status == "banned":
        return "banned"
    seen = client.last_seen or client.enrolled_at
    if (run.alive_until - seen).total_seconds() > run.liveness_s:
        return "lost"
    if run.ended:
        return "finished"
    if run.state == "interrupted":
        return "interrupted"
    if (run.alive_until - seen).total_seconds() <= ACTIVE_SECONDS:
        return "active"
    return "idle"


def badge(state: str, label: str | None = None) -> str:
    """Streamlit markdown badge of a run or client state. The label is escaped:
    it can carry the coordinator's phase, read from the store."""
    return f":{STATE_COLORS.get(state, 'gray')}-badge[{plain(label or state)}]"


__all__ = [
    "ACTIVE_SECONDS",
    "CLIENT_STATES",
    "DEFAULT_LIVENESS_SECONDS",
    "RUN_STATES",
    "STALE_AFTER_SECONDS",
    "STATE_COLORS",
    "ClientState",
    "RunState",
    "RunView",
    "ago",
    "badge",
    "client_state",
    "config_section",
    "liveness_seconds",
    "run_view",
    "span",
]
