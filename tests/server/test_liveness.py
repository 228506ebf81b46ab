"""What the coordinator writes so readers can tell who is alive: clients' last
contact (long polls included), its own heartbeat and clean stop, and the stored
reason of a run that could not gather enough clients."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fedplat.server.config import parse_config
from fedplat.server.coordinator import Coordinator
from fedplat.server.recorder import Recorder

from fedplat.sim.simulation import admit
from fedplat.store import Store
from fedplat.transport.inmemory import InMemoryConnection
from tests.support import digits_client, run_config


def _coordinator(tmp: Path, **kw: Any) -> tuple[Coordinator, Store]:
    cfg = parse_config(run_config(tmp, **kw))
    store = Store(cfg.store.url)
    return Coordinator(cfg, Recorder(store)), store


def test_a_long_poll_keeps_the_stored_last_seen_fresh(tmp_path: Path) -> None:
    coord, store = _coordinator(tmp_path, rounds=1, clients=2)
    client = digits_client(0, lambda: InMemoryConnection(coord), 2)
    admit(store, coord.cfg, [client])
    client.enroll()
    rec = coord.ctx.recorder
    rec.flush()
    (enrolled,) = store.list_clients(coord.run_id)
    time.sleep(0.05)
    rec.flush()  # nothing heard: nothing written
    assert store.list_clients(coord.run_id)[0].last_seen == enrolled.last_seen

    # A client waiting in a long poll sends nothing, but the coordinator keeps
    # it live; the store must say so too, or the monitor would call it lost.
    state = coord.registry.get(enrolled.id)
    assert state is not None
    coord.registry.touch(state)
    rec.flush()
    (touched,) = store.list_clients(coord.run_id)
    assert touched.last_seen is not None and enrolled.last_seen is not None
    assert touched.last_seen > enrolled.last_seen
    store.close()


def test_heartbeat_then_a_clean_stop_is_recorded(tmp_path: Path) -> None:
    coord, store = _coordinator(tmp_path, rounds=1, clients=2)
    rec = coord.ctx.recorder
    rec.start()
    deadline = time.monotonic() + 30
    while (run := store.get_run(coord.run_id)) is None or run.heartbeat_at is None:
        assert time.monotonic() < deadline, "no heartbeat"
        time.sleep(0.1)
    assert run.phase == "starting" and run.live_clients == 0
    rec.stop()
    stopped = store.get_run(coord.run_id)
    assert stopped is not None and stopped.heartbeat_at is not None
    assert (stopped.phase, stopped.live_clients) == ("stopped", 0)
    assert stopped.heartbeat_at >= run.heartbeat_at
    store.close()


def test_a_run_without_enough_clients_fails_with_a_stored_reason(
    tmp_path: Path,
) -> None:
    coord, store = _coordinator(
        tmp_path, rounds=1, clients=2, deadlines={"wait_for_clients_seconds": 1.0}
    )
    driver = threading.Thread(target=coord.driver.run, args=(threading.Event(),))
    driver.start()
    driver.join(30)
    assert not driver.is_alive()
    run = store.get_run(coord.run_id)
    assert run is not None and run.status == "failed"
    assert run.reason == "fewer than 2 clients live for 1 s"
    assert run.finished_at is not None
    assert [e.message for e in store.list_events(run.id, kind="run_failed")] == [
        run.reason
    ]
    store.close()
