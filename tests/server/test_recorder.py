"""The recorder, the coordinator's only store writer: nothing a caller sent can
make a write fail, and refusals cost the store a bounded amount per identity."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fedplat.server.recorder import EnrolmentRefused, Recorder, sanitized
from fedplat.server.refusals import Rejection

from fedplat.store import EventRow, ParticipationRow, RoundClose, Store
from fedplat.store.check import check_store
from tests.support.store import ok, run_with_clients


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(str(tmp_path / "r.db"))
    yield s
    s.close()


def _kinds(store: Store, run_id: str) -> list[str]:
    return [e.kind for e in store.list_events(run_id)]


def test_an_unstorable_refusal_becomes_an_event_saying_why(store: Store) -> None:
    run_id = run_with_clients(store, 1)
    rec = Recorder(store, run_id)
    rec.rejection(Rejection("gettask_refused", "bad", client_id=""))  # the old bug
    rec.rejection(Rejection("x" * 200, "kind too long", client_id="c0"))
    rec.event("ok", "fine", client_id="c0")
    rec.flush()  # writes: nothing raised
    kinds = _kinds(store, run_id)
    assert kinds.count("event_refused") == 2 and "ok" in kinds


def test_refusals_of_one_client_draw_on_its_own_budget(store: Store) -> None:
    run_id = run_with_clients(store, 2)
    clock = Clock()
    rec = Recorder(store, run_id, client_burst=3, client_per_hour=3600, clock=clock)
    for i in range(10):  # ten kinds, so only the client's budget binds
        rec.rejection(Rejection(f"kind{i}", "no", client_id="c0"))
    rec.rejection(Rejection("kind0", "no", client_id="c1"))
    clock.t = 100.0  # every window over: the counts are written as summaries
    rec.flush(final=True)
    events = store.list_events(run_id)
    full = [e for e in events if e.message.startswith("refused")]
    assert sorted(e.client_id or "" for e in full) == ["c0", "c0", "c0", "c1"]
    suppressed = sum(int(e.details.get("suppressed", 0)) for e in events)
    assert suppressed == 7
    # The budget refills at client_per_hour: one more after a second.
    clock.t = 101.0
    rec.rejection(Rejection("kind0", "no", client_id="c0"))
    rec.flush()
    assert len([e for e in store.list_events(run_id) if e.client_id == "c0"]) == 4


def test_bad_metrics_are_dropped_one_by_one(store: Store) -> None:
    run_id = run_with_clients(store, 1)
    rec = Recorder(store, run_id)
    rec.metrics({"client.a": 1.5, "client.b": float("nan")}, round_number=1,
                client_id="c0")  # fmt: skip
    rec.flush()
    assert [m.name for m in store.list_metrics(run_id)] == ["client.a"]
    assert "metric_refused" in _kinds(store, run_id)


def test_a_round_close_drops_the_record_the_store_refuses(store: Store) -> None:
    run_id = run_with_clients(store, 3)
    store.open_round(
        run_id, 1, num_selected=3, model_version=0,
        deadline_at=datetime.now(UTC) + timedelta(minutes=1),
    )  # fmt: skip
    close = RoundClose(
        status="failed",
        reason="no quorum",
        participations=(
            ok("c0", num_examples=10),
            ok("c1", num_examples=2**31),  # wider than the INTEGER column
            ParticipationRow("c2", "dropped", train_loss=float("inf")),
        ),
        client_metrics={"c0": {"client.loss": 0.1}, "c1": {"client.x": float("nan")}},
        events=(EventRow("round_completed", "done", "info", 1, ""),),
    )
    clean = sanitized(close, 1)
    statuses = [(p.client_id, p.status) for p in clean.participations]
    assert statuses == [("c0", "succeeded"), ("c1", "failed"), ("c2", "failed")]
    assert clean.client_metrics == {"c0": {"client.loss": 0.1}}
    Recorder(store, run_id).close_round(1, close)
    rnd = store.get_round(run_id, 1)
    assert rnd is not None and rnd.status == "failed"
    parts = {p.client_id: p for p in store.list_participations(run_id, 1)}
    assert "record refused by the store" in (parts["c1"].reason or "")
    assert parts["c0"].num_examples == 10
    kinds = _kinds(store, run_id)
    assert kinds.count("record_dropped") == 3 and "event_refused" in kinds
    assert check_store(store) == []


def test_a_recorder_writes_for_the_run_it_creates_and_ends_it_after_its_events(
    store: Store,
) -> None:
    rec = Recorder(store)
    with pytest.raises(RuntimeError, match="no run yet"):
        rec.run_id  # noqa: B018
    run = rec.create_run("r", {}, {}, 3)
    with pytest.raises(RuntimeError, match="writes for run"):
        rec.attach("another")
    rec.event("run_failed", "no clients came", level="error")
    ended = rec.finish_run("failed", "no clients came")
    assert ended.status == "failed" and ended.reason == "no clients came"
    (event,) = store.list_events(run.id)
    assert event.kind == "run_failed"  # flushed first: it precedes the status
    assert store.get_run(run.id) == ended


def test_an_enrolment_the_store_refuses_says_whether_the_token_was_why(
    store: Store,
) -> None:
    rec = Recorder(store)
    rec.create_run("r", {}, {}, 3)
    fields = dict(run_name="r", name="a", num_examples=1, info={})
    key = "ab" * 32
    with pytest.raises(EnrolmentRefused) as refused:
        rec.enrol_client("c0", token="fpt1.made.up", public_key=key,
                         cert_fingerprint=None, **fields)  # fmt: skip
    assert refused.value.token
    with pytest.raises(EnrolmentRefused) as refused:
        rec.enrol_client("c0", token=None, public_key="not hex",
                         cert_fingerprint=None, **fields)  # fmt: skip
    assert not refused.value.token and "public_key" in refused.value.reason
    added = rec.enrol_client("c0", token=None, public_key=key, cert_fingerprint=key,
                             **fields)  # fmt: skip
    assert added.status == "active" and added.cert_fingerprint == key
    assert rec.reads.get_client(rec.run_id, "c0") == added
