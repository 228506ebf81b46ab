"""Enrolment floods through real gRPC on 127.0.0.1 (server/admission.py): made-up,
missing, revoked and other clients' credentials spend neither the admission
budget nor a database transaction per attempt, reveal nothing, and honest
devices still enrol at once. The database's work is counted statement by
statement on the coordinator's own engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config
from sqlalchemy import event

from fedplat.proto import common_pb2 as common
from fedplat.security.identity import Identity
from fedplat.store import Store
from fedplat.testing.protocol import RawClient
from tests.support import issue_tokens, run_config

FLOOD = 4 * 100  # attempts: 4 threads of 100
RELOADS = 10  # UsableTokens' reload burst (2 per second after it)
WRONG = common.Layout(tensors=[common.TensorSpec(name="w", shape=[3])])


@contextmanager
def served(tmp_path: Path, **admission: Any) -> Iterator[tuple[BackgroundServer, dict]]:
    # An admission budget of 2 that does not refill during a test: a flood that
    # spent it would leave nothing for the honest devices.
    raw = run_config(
        tmp_path,
        rounds=1,
        clients=2,
        quorum=2,
        admission={"enrol_per_second": 1e-3, "enrol_burst": 2, **admission},
    )
    srv = BackgroundServer(parse_config(raw)).start()
    try:
        yield srv, raw
    finally:
        srv.stop()


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """Every SQL statement the coordinator's store runs, as text."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        seen.append(text)

    engine = store._engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _on(table: str, seen: list[str]) -> list[str]:
    return [t for t in seen if f" {table}" in t or f'"{table}"' in t]


def flood(
    srv: BackgroundServer,
    attempt: Callable[[RawClient, int], None],
    *,
    admitted: bool = False,
) -> list:
    codes: list[grpc.StatusCode] = []
    details: list[str] = []

    def run() -> None:
        fake = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, name="sybil")
        for i in range(FLOOD // 4):
            with pytest.raises(grpc.RpcError) as info:
                attempt(fake, i)
            codes.append(info.value.code())
            details.append(info.value.details() or "")

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(codes) == FLOOD
    # The model's layout is revealed to no one whose credential was refused
    # (under open admission everyone is admitted, and may download the model).
    names = [s.name for s in srv.coord.layout.specs]
    assert admitted or not any(n in d for d in details for n in names)
    return codes


def honest_enrol_at_once(srv: BackgroundServer, tokens: list[str]) -> None:
    for i, token in enumerate(tokens):
        c = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, name=f"h{i}")
        c.token = token
        c.enroll()  # no retry: the budget is intact


def test_made_up_and_missing_tokens(tmp_path: Path) -> None:
    with served(tmp_path) as (srv, raw):
        tokens = issue_tokens(raw, 2)  # handed to the devices before the flood

        def attempt(fake: RawClient, i: int) -> None:
            fake.token = "" if i % 5 == 0 else f"fpt1.{i:012x}.made-up"
            fake.enroll()

        with statements(srv.server.store) as seen:
            t0 = time.monotonic()
            codes = flood(srv, attempt)
            seconds = time.monotonic() - t0
        assert set(codes) <= {
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        }
        # Token reads at the reload rate only (a reload, and the read that says
        # why after it); no write, nothing on the clients table.
        reads = _on("enrolment_tokens", seen)
        assert len(reads) <= 2 * (RELOADS + 2 * seconds + 1)
        assert not any(t.lstrip().upper().startswith("UPDATE") for t in reads)
        assert _on("clients", seen) == []
        honest_enrol_at_once(srv, tokens)


def test_a_revoked_token(tmp_path: Path) -> None:
    # A token that was valid and is revoked is still "usable" in the
    # coordinator's memory until it reads the store again: it must not get
    # past the store's check, spend the budget, or learn the layout.
    with served(tmp_path) as (srv, raw):
        tokens = issue_tokens(raw, 3)
        with Store(raw["store"]["url"], migrate=False) as store:
            store.revoke_token(tokens[2].split(".")[1])

        def attempt(fake: RawClient, i: int) -> None:
            fake.token = tokens[2]
            fake.enroll(layout=WRONG)

        with statements(srv.server.store) as seen:
            codes = flood(srv, attempt)
        assert set(codes) <= {
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        }
        assert codes.count(grpc.StatusCode.PERMISSION_DENIED) >= 1  # "was revoked"
        assert len(_on("enrolment_tokens", seen)) <= 2 * RELOADS + 20
        honest_enrol_at_once(srv, tokens[:2])


def test_another_clients_id(tmp_path: Path) -> None:
    with served(tmp_path) as (srv, raw):
        tokens = issue_tokens(raw, 2)
        victim = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, name="victim")
        victim.token = tokens[0]
        victim.enroll()

        def attempt(fake: RawClient, i: int) -> None:
            fake.identity = Identity.generate() if i % 10 == 0 else fake.identity
            fake.enroll(client_id=victim.client_id)

        with statements(srv.server.store) as seen:
            codes = flood(srv, attempt)
        # The same answer as for an id nobody has: an attempt learns nothing
        # about which ids exist.
        assert set(codes) == {grpc.StatusCode.NOT_FOUND}
        assert _on("clients", seen) == []  # refused from memory
        nobody = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, name="x")
        with pytest.raises(grpc.RpcError) as unknown:
            nobody.enroll(client_id="0123456789abcdef")
        with pytest.raises(grpc.RpcError) as known:
            nobody.enroll(client_id=victim.client_id)
        assert unknown.value.code() == known.value.code()
        assert unknown.value.details() == known.value.details()
        honest_enrol_at_once(srv, tokens[1:])
        victim.enroll(client_id=victim.client_id)  # the victim still re-enrols


def test_open_admission_with_a_wrong_model(tmp_path: Path) -> None:
    # Open admission: everyone is admissible, so only an admissible attempt
    # may spend the budget; a wrong model is refused without a database read.
    with served(tmp_path, mode="open", max_clients=10) as (srv, _raw):

        def attempt(fake: RawClient, i: int) -> None:
            fake.enroll(layout=WRONG)

        with statements(srv.server.store) as seen:
            codes = flood(srv, attempt, admitted=True)
        assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
        assert _on("clients", seen) == [] and _on("enrolment_tokens", seen) == []
        honest_enrol_at_once(srv, ["", ""])


def test_a_replayed_enrolment_is_refused(tmp_path: Path) -> None:
    with served(tmp_path) as (srv, raw):
        (token,) = issue_tokens(raw, 1)
        c = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, name="c")
        c.token = token
        first = c.enroll()
        again = c.enroll_request(first.client_id)
        c.stub.Enroll(again, timeout=10)  # a re-enrolment on a fresh challenge
        with pytest.raises(grpc.RpcError) as info:
            c.stub.Enroll(again, timeout=10)  # the same request, replayed
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "already used" in (info.value.details() or "")
