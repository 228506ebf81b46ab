"""Client SDK: backoff, middleware, reconnect to a late or restarted coordinator."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import torch
from fedplat.client import (
    Backoff,
    ByteCounter,
    Client,
    ClipNorm,
    FitResult,
    OutgoingUpdate,
)
from fedplat.client.middleware import chain
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config

from fedplat.models import create_model
from fedplat.protocol.messages import Task, TaskKind, UploadAck
from tests.support import free_port, issue_tokens, run_config, wait_for


def test_backoff_full_jitter_bounds() -> None:
    b = Backoff(base=0.5, cap=4.0, rng=random.Random(0))
    for attempt in range(10):
        hi = min(4.0, 0.5 * 2**attempt)
        samples = [b.delay(attempt) for _ in range(200)]
        assert all(0 <= s <= hi for s in samples)
        assert max(samples) > 0.5 * hi  # actually spreads over the range


def test_middleware_order_and_clipping() -> None:
    seen: list[str] = []

    def layer(tag: str):  # type: ignore[no-untyped-def]
        def mw(u: OutgoingUpdate, send):  # type: ignore[no-untyped-def]
            seen.append(f"in:{tag}")
            ack = send(u)
            seen.append(f"out:{tag}")
            return ack

        return mw

    sent: list[OutgoingUpdate] = []

    def terminal(u: OutgoingUpdate) -> UploadAck:
        sent.append(u)
        return UploadAck(True, "ok", 12)

    counter = ByteCounter()
    send = chain([counter, layer("a"), ClipNorm(1.0), layer("b")], terminal)
    task = Task(TaskKind.TRAIN, task_id="t", round=1)
    send(OutgoingUpdate(task, torch.tensor([3.0, 4.0]), 1))
    assert seen == ["in:a", "in:b", "out:b", "out:a"]
    assert torch.allclose(sent[0].vector, torch.tensor([0.6, 0.8]))
    assert sent[0].metrics["clipped_from_norm"] == 5.0
    assert counter.bytes_sent == 12 and counter.updates_sent == 1


def _client(address: str, name: str, tmp: Path, token: str = "") -> Client:
    model = create_model("mlp", (1, 8, 8), 10, hidden=(64,))

    def train(m: torch.nn.Module, config: object) -> FitResult:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01)
        return FitResult(5)

    return Client(
        address,
        model,
        train,
        num_examples=5,
        name=name,
        insecure=True,
        enrolment_token=token,
        state_dir=tmp / name,
        backoff=Backoff(base=0.1, cap=0.5),
        poll_seconds=1,
    )


def test_client_started_before_coordinator_connects_and_survives_restart(
    tmp_path: Path,
) -> None:
    port = free_port()
    raw = run_config(
        tmp_path,
        rounds=4,
        clients=2,
        address=f"127.0.0.1:{port}",
        deadlines={"round_seconds": 20},
    )
    tokens = issue_tokens(raw, 2)
    clients = [
        _client(f"127.0.0.1:{port}", f"c{i}", tmp_path, tokens[i]) for i in range(2)
    ]
    for c in clients:
        c.start()
    time.sleep(1.0)  # clients are retrying against a closed port
    srv = BackgroundServer(parse_config(raw)).start()
    try:
        wait_for(lambda: srv.coord.completed_rounds >= 2, 60, "two rounds")
    finally:
        srv.stop()
    ids_before = {c.client_id for c in clients}
    # Restart on the same port and store: clients re-enrol with their saved ids
    # and keys (their tokens are spent: the identity key is what admits them).
    srv = BackgroundServer(parse_config(raw)).start()
    try:
        wait_for(lambda: srv.coord.finished, 60, "the resumed run to finish")
        wait_for(lambda: all(c.finished for c in clients), 30, "clients to finish")
    finally:
        srv.stop()
        for c in clients:
            c.stop()
    assert {c.client_id for c in clients} == ids_before
    assert all((tmp_path / c.name / "client.json").exists() for c in clients)
    from fedplat.store import Store

    store = Store(raw["store"]["url"], migrate=False)
    r = store.get_run_by_name("test")
    assert r is not None and r.status == "completed" and r.current_round == 4
    assert len(store.list_clients(r.id)) == 2


def test_client_gives_up_when_unreachable(tmp_path: Path) -> None:
    c = _client(f"127.0.0.1:{free_port()}", "lonely", tmp_path)
    c.give_up_after = 0.5
    err: list[BaseException] = []

    def go() -> None:
        try:
            c.run()
        except ConnectionError as exc:
            err.append(exc)

    t = threading.Thread(target=go)
    t.start()
    t.join(20)
    assert err and "unreachable" in str(err[0])
