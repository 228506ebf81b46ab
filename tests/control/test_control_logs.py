"""A run's event log through the control API: `fedplat runs logs [--follow]`
(fedplat/control/logs.py), the pages and follow loop on a real store, and the
stream over real gRPC with mutual TLS."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from fedplat.control.client import ControlClient, ControlError, load_profile, pb
from fedplat.control.logs import LogStart, start_after, stream
from fedplat.store import Store
from tests.support import wait_for
from tests.support.control import cli, make_pki, profile, serve


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ops = {"viewer-1": "viewer", "operator-1": "operator"}
    return make_pki(tmp_path_factory.mktemp("pki"), ops)


def _collect(store: Store, start: LogStart, follow: bool) -> list[pb.LogEvent]:
    async def go() -> list[pb.LogEvent]:
        return [e async for e in stream(store, start, follow, poll=0.02, limit=30)]

    return asyncio.run(go())


def test_pages_start_after_an_id_or_at_the_tail(tmp_path: Path) -> None:
    with Store(str(tmp_path / "s.db")) as store:
        run = store.create_run("r", {}, {}, 3)
        for i in range(7):
            store.add_event(run.id, "note", f"event {i}", round_number=i or None)
        other = store.create_run("other", {}, {}, 1)
        store.add_event(other.id, "note", "not r's")
        ids = [e.id for e in reversed(store.list_events(run.id))]
        # The tail-th newest event and everything after it, oldest first.
        tail3 = _collect(
            store, LogStart(run.id, start_after(store, run.id, 0, 3)), False
        )
        assert [e.message for e in tail3] == ["event 4", "event 5", "event 6"]
        assert start_after(store, run.id, 0, 50) == 0  # fewer than 50: all
        assert start_after(store, run.id, 0, 7) == ids[0] - 1
        assert start_after(store, run.id, ids[3], 2) == ids[3]  # after_id wins
        after = _collect(store, LogStart(run.id, ids[1]), False)
        assert [e.id for e in after] == ids[2:]
        assert after[0].round == 2 and after[0].kind == "note"
        # A run's log never shows another run's events (nor audit entries,
        # which are filed with no run).
        everything = _collect(store, LogStart(run.id, 0), False)
        assert len(everything) == 7 and "not r's" not in {e.message for e in everything}


def test_an_event_committed_late_is_sent_once() -> None:
    """Ids are given at insert, not at commit: a read may meet an id below the
    last one sent (another writer's later commit) and ids it already sent."""
    from datetime import UTC, datetime

    from fedplat.control.logs import LATE_IDS, _Window
    from fedplat.store import EventRecord

    def ev(i: int) -> EventRecord:
        now = datetime.now(UTC)
        return EventRecord(i, "r", None, None, "note", "info", f"e{i}", {}, now)

    w = _Window(after=10)
    assert w.low == 10  # never below where the stream started
    assert [e.id for e in w.fresh([ev(i) for i in (11, 12, 14)])] == [11, 12, 14]
    # 13 commits after 14 was sent: the next read (from 14 - LATE_IDS) meets it
    # and the ids already sent again; only 13 is new.
    assert [e.id for e in w.fresh([ev(i) for i in (11, 12, 13, 14, 15)])] == [13, 15]
    assert w.after == 15 and w.low == max(10, 15 - LATE_IDS)
    w.after = LATE_IDS + 100
    assert w.low == 100
    far = _Window(after=LATE_IDS + 100)
    assert far.fresh([ev(50), ev(LATE_IDS + 101)])[0].id == LATE_IDS + 101
    assert far.sent <= {i for i in far.sent if i > far.low}


def test_why_a_stream_ends() -> None:
    import asyncio
    import time as clock

    from fedplat.control.logs import _why_cut, _why_stop

    later, past = clock.monotonic() + 60, clock.monotonic() - 1
    closing = asyncio.Event()
    assert _why_stop(False, False, "", later, None) == "caught-up"
    assert _why_stop(True, False, "ended", later, closing) is None  # one more look
    assert _why_stop(True, True, "ended", later, closing) == "run-ended"
    assert _why_stop(True, True, "interrupted", later, closing) == "interrupted"
    # Seen interrupted, then live again (its coordinator restarted): goes on.
    assert _why_stop(True, True, "live", later, closing) is None
    assert _why_stop(True, False, "live", past, closing) == "time-limit"
    closing.set()  # the service stops: the run's end, if it came, is said
    assert _why_stop(True, False, "ended", later, closing) == "run-ended"
    assert _why_stop(True, False, "live", later, closing) == "closing"
    closing.clear()
    assert _why_cut(later, closing) is None
    closing.set()
    assert _why_cut(later, closing) == "closing"


def test_more_than_one_page_is_sent_whole(tmp_path: Path) -> None:
    from fedplat.control.logs import PAGE

    with Store(str(tmp_path / "s.db")) as store:
        run = store.create_run("r", {}, {}, 1)
        for i in range(PAGE + 3):
            store.add_event(run.id, "note", f"e{i}")
        got = _collect(store, LogStart(run.id, 0), False)
        assert [e.message for e in got] == [f"e{i}" for i in range(PAGE + 3)]


def test_follow_sends_new_events_and_ends_after_the_run_ends(tmp_path: Path) -> None:
    with Store(str(tmp_path / "s.db")) as store:
        run = store.create_run("r", {}, {}, 2)
        store.add_event(run.id, "run_created", "made")

        def later() -> None:
            time.sleep(0.2)
            store.add_event(run.id, "round_completed", "round 1", round_number=1)
            time.sleep(0.2)
            store.update_run(run.id, status="running")
            store.update_run(run.id, status="completed")
            # Recorded just after the status changed: still sent (one last poll).
            store.add_event(run.id, "run_completed", "done")

        writer = threading.Thread(target=later)
        writer.start()
        got = _collect(store, LogStart(run.id, 0), True)
        writer.join()
        assert [e.kind for e in got] == [
            "run_created",
            "round_completed",
            "run_completed",
        ]


@pytest.mark.integration
def test_runs_logs_over_the_control_api(
    tmp_path: Path, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv, raw, control = serve(tmp_path, pki)
    viewer = profile(tmp_path, pki, "viewer-1", control)
    operator = profile(tmp_path, pki, "operator-1", control)
    name = raw["run"]["name"]
    stopped = False
    try:
        wait_for(
            lambda: cli(capsys, viewer, "runs", "logs", name)[1] != "", 30, "events"
        )
        rc, out, _ = cli(capsys, viewer, "runs", "logs", name)
        assert rc == 0 and "run_created" in out and f"run '{name}'" in out
        rc, out, _ = cli(capsys, viewer, "runs", "logs", name, "--tail", "1")
        assert rc == 0 and out.count("\n") == 1
        rc, _, err = cli(capsys, viewer, "runs", "logs", "no-such-run")
        assert rc == 2 and err.startswith("fedplat: NOT_FOUND: no run named")
        rc, _, err = cli(capsys, viewer, "runs", "logs", name, "--tail", "0")
        assert rc == 2 and err == "fedplat: --tail must be 1 to 10,000\n"
        rc, out, _ = cli(capsys, viewer, "runs", "logs", name, "--all", "--tail", "1")
        assert rc == 0 and out.splitlines()[0].split()[3] == "run_created:"

        with ControlClient(load_profile(viewer)) as c:
            with pytest.raises(ControlError, match="INVALID_ARGUMENT: after_id"):
                list(c.stream("StreamLog", pb.LogRequest(run=name, after_id=2**40)))
            # Followers hold slots of their own, two per certificate: a third
            # is refused while two are open, and other calls still go through.
            held = [
                c._stub.StreamLog(pb.LogRequest(run=name, follow=True))
                for _ in range(2)
            ]
            for h in held:
                next(h)  # open: the first event came
            with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED"):
                list(c.stream("StreamLog", pb.LogRequest(run=name, follow=True)))
            assert c.call("GetRun", pb.RunRef(run=name)).name == name
            for h in held:
                h.cancel()

        # A follower (a real process) sees the run end: an operator stops it,
        # the coordinator ends the run and stops, and the follower's last lines
        # say so before it exits 0.
        follower = subprocess.Popen(
            [sys.executable, "-m", "fedplat.cli", "runs", "logs", name, "--follow",
             "--profile", viewer],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert follower.stdout is not None
        first = follower.stdout.readline()  # it follows: the first event came
        assert "run_created" in first
        rc, _, _ = cli(capsys, operator, "runs", "stop", name)
        assert rc == 0
        srv.stop()
        stopped = True
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert "stopped by operator operator-1" in out
    finally:
        if not stopped:
            srv.stop()
    with Store(raw["store"]["url"]) as store:
        audit = [e.details for e in store.list_events(kind="audit")]
    logs = [d for d in audit if d["method"] == "StreamLog"]
    assert any(d["result"] == "ok" and d["target"] == name for d in logs)
    # The refused third follower is audited with its reason.
    assert any("calls in flight" in d["result"] for d in logs), logs


def test_a_cancelled_follow_gives_its_slot_back(tmp_path: Path, pki: Path) -> None:
    srv, raw, control = serve(tmp_path, pki)
    viewer = profile(tmp_path, pki, "viewer-1", control)
    name = raw["run"]["name"]
    try:
        with ControlClient(load_profile(viewer)) as c:
            for _ in range(4):  # more than the 2 slots, one after another
                h = c._stub.StreamLog(pb.LogRequest(run=name, follow=True))
                next(h)
                h.cancel()
                with pytest.raises(grpc.RpcError):
                    next(h)
            wait_for(
                lambda: next(c._stub.StreamLog(pb.LogRequest(run=name))) is not None,
                10,
                "a slot",
            )
    finally:
        srv.stop()
