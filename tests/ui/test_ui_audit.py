"""The monitor's Audit page (AppTest): the control API's calls, who made them and
how they ended, refused ones on demand, caller-chosen text shown as text."""

from __future__ import annotations

from pathlib import Path

import pytest
from fedplat.ui import DB_ENV
from fedplat.ui.audit import audit_frame

from fedplat.control.audit import AuditTrail, Caller
from fedplat.store import Store
from tests.support.ui_pages import open_page

pytestmark = pytest.mark.timeout(120)

ADMIN = Caller("alice", "admin", "a" * 64)
DEVICE = Caller("**bold** [x](http://evil)", "none: not an operator", "b" * 64)


@pytest.fixture
def audit_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = tmp_path / "audit.db"
    with Store(str(path)) as store:
        run = store.create_run("flights", {}, {}, 3)
        trail = AuditTrail(store)
        trail.record(ADMIN, "CreateTokens", "count=3", "ok")
        trail.record(ADMIN, "StopRun", "flights", "ok", run.id)
        trail.record(DEVICE, "ListRuns", "", "not an operator certificate")
    monkeypatch.setenv(DB_ENV, str(path))
    return str(path)


def test_audit_frame_by_hand(audit_db: str) -> None:
    with Store(audit_db, migrate=False) as store:
        events = store.list_events(kind="audit")
        names = {r.id: r.name for r in store.list_runs()}
    frame = audit_frame(events, names)
    assert list(frame["method"]) == ["ListRuns", "StopRun", "CreateTokens"]
    assert list(frame["run"]) == ["", "flights", ""]
    assert list(frame["result"]) == ["not an operator certificate", "ok", "ok"]
    assert frame["fingerprint"].iloc[1] == "a" * 16


def test_audit_page_lists_calls_and_filters_refusals(audit_db: str) -> None:
    at = open_page("audit")
    (table,) = at.dataframe
    shown = table.value
    assert len(shown) == 3
    # The caller's name is a table cell, never rendered as Markdown.
    assert DEVICE.name in set(shown["operator"])
    assert not any("evil" in str(m.value) for m in at.markdown)
    at.toggle(key="audit_refused").set_value(True).run()
    (table,) = at.dataframe
    assert list(table.value["method"]) == ["ListRuns"]


def test_audit_page_without_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "empty.db"
    Store(str(path)).close()
    monkeypatch.setenv(DB_ENV, str(path))
    at = open_page("audit")
    assert "No control API call is recorded" in at.info[0].value
