"""The attacks of the trust review, each through real gRPC on 127.0.0.1 against
the default (token) admission: the attack is refused with the right status, the
refusal is stored as an event, ``fedplat store check`` passes, and an honest
client still completes the round."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config

from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.store import Store
from fedplat.store.check import check_store
from fedplat.testing.protocol import RawClient, dense_payload_bytes
from tests.support import issue_tokens, run_config, wait_for

SMALL = 1e-3


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[BackgroundServer, dict[str, Any]]]:
    raw = run_config(
        tmp_path,
        rounds=1,
        clients=2,
        quorum=1,
        deadlines={"round_seconds": 30},
        server={"stream_idle_seconds": 2.0},
        admission={"enrol_per_second": 200.0, "enrol_burst": 400},
    )
    srv = BackgroundServer(parse_config(raw)).start()
    yield srv, raw
    srv.stop()


def _enrolled(
    srv: BackgroundServer, raw: dict[str, Any], *names: str
) -> list[RawClient]:
    out = []
    for name, token in zip(names, issue_tokens(raw, len(names)), strict=True):
        c = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, name=name, token=token)
        c.enroll()
        out.append(c)
    return out


def _payload(srv: BackgroundServer, value: float = SMALL) -> bytes:
    return dense_payload_bytes(np.full(srv.coord.layout.numel, value, dtype="<f4"))


def _finish(srv: BackgroundServer, raw: dict[str, Any], *honest: RawClient) -> Store:
    """Honest clients complete the round; the store holds and checks out."""
    for c in honest:
        assert c.upload(c.update(c.task(), _payload(srv))).accepted
    wait_for(lambda: srv.coord.finished, 60, "the round to complete")
    store = Store(raw["store"]["url"], migrate=False)
    rnd = store.get_round(srv.coord.run_id, 1)
    assert rnd is not None and rnd.status == "completed"
    assert check_store(store) == []
    return store


def _refusals(store: Store, run_id: str, text: str) -> list[str]:
    return [
        e.message
        for e in store.list_events(run_id)
        if e.message.startswith("refused") and text in e.message
    ]


def test_sybil_flood_without_tokens_is_refused_and_bounded(served: Any) -> None:
    srv, raw = served
    address = f"127.0.0.1:{srv.port}"
    fake = RawClient(address, srv.coord.layout, name="sybil")
    for _ in range(150):
        with pytest.raises(grpc.RpcError) as info:
            fake.enroll()
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "enrolment token" in info.value.details()
    honest = _enrolled(srv, raw, "honest-0", "honest-1")
    store = _finish(srv, raw, *honest)
    assert len(store.list_clients(srv.coord.run_id)) == 2  # no sybil got in
    refused = _refusals(store, srv.coord.run_id, "enrolment token")
    # Stored, but not one event per attempt: at most a burst plus a summary.
    assert 1 <= len(refused) <= 25
    assert any("more" in e.message for e in store.list_events(srv.coord.run_id))


def test_refusal_does_not_reveal_the_model_to_a_caller_without_a_token(
    served: Any,
) -> None:
    srv, raw = served
    c = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout)
    wrong = common.Layout(tensors=[common.TensorSpec(name="w", shape=[3])])
    with pytest.raises(grpc.RpcError) as info:
        c.enroll(layout=wrong)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    names = [s.name for s in srv.coord.layout.specs]
    assert not any(n in info.value.details() for n in names)
    # A token, an unknown token, a spent token, a token of another run.
    (token,) = issue_tokens(raw, 1)
    c.token = "fpt1.abc.def"
    with pytest.raises(grpc.RpcError, match="unknown enrolment token"):
        c.enroll()
    c.token = token
    c.enroll()
    again = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, token=token)
    with pytest.raises(grpc.RpcError, match="already used"):
        again.enroll()
    (other,) = _enrolled(srv, raw, "other")
    _finish(srv, raw, c, other)


def test_identity_takeover_is_refused(served: Any) -> None:
    srv, raw = served
    victim, other = _enrolled(srv, raw, "victim", "other")
    # The attacker knows the victim's id and name, and even holds a valid token.
    (token,) = issue_tokens(raw, 1)
    thief = RawClient(
        f"127.0.0.1:{srv.port}", srv.coord.layout, name="victim", token=token
    )
    with pytest.raises(grpc.RpcError) as info:
        thief.enroll(client_id=victim.client_id)
    # The answer an unknown id gets: nobody learns which ids exist.
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "id and key" in info.value.details()
    # A challenge issued for one id cannot be used to enrol as another.
    req = thief.enroll_request(client_id="")
    req.client_id = victim.client_id
    with pytest.raises(grpc.RpcError) as info:
        thief.stub.Enroll(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # The victim's session still works, and it completes the round.
    store = _finish(srv, raw, victim, other)
    takeovers = [
        e for e in store.list_events(srv.coord.run_id) if e.kind == "identity_refused"
    ]
    assert takeovers and "id and key" in takeovers[0].message


def test_a_client_cannot_buy_weight_with_its_declared_examples(
    tmp_path: Path,
) -> None:
    raw = run_config(
        tmp_path,
        rounds=1,
        clients=2,
        quorum=2,
        aggregator={"max_examples_per_client": 100},
    )
    srv = BackgroundServer(parse_config(raw)).start()
    try:
        honest, greedy = _enrolled(srv, raw, "honest", "greedy")
        w0 = srv.coord.weights.clone()
        assert honest.upload(
            honest.update(honest.task(), _payload(srv, 1.0), num_examples=100)
        ).accepted
        task = greedy.task()
        with pytest.raises(grpc.RpcError) as info:  # wider than the store's column
            greedy.upload(greedy.update(task, _payload(srv, -1.0), num_examples=2**31))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert greedy.upload(
            greedy.update(task, _payload(srv, -1.0), num_examples=2**31 - 1)
        ).accepted
        wait_for(lambda: srv.coord.finished, 60, "the round")
        # Both capped at 100 examples: the mean of +1 and -1 is 0, not -1.
        assert float((srv.coord.weights - w0).abs().max()) < 1e-6
        store = Store(raw["store"]["url"], migrate=False)
        weights = {
            p.client_id: p.verdict.weight
            for p in store.list_participations(srv.coord.run_id, 1)
        }
        assert weights[greedy.client_id] == pytest.approx(0.5)
        assert check_store(store) == []
    finally:
        srv.stop()


def test_huge_finite_rows_are_refused(served: Any) -> None:
    srv, raw = served
    bad, good = _enrolled(srv, raw, "bad", "good")
    with pytest.raises(grpc.RpcError) as info:
        bad.upload(bad.update(bad.task(), _payload(srv, 1e20)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "norm" in info.value.details()
    store = _finish(srv, raw, good)
    assert _refusals(store, srv.coord.run_id, "norm")


def test_idle_upload_streams_are_cut_and_do_not_stall_others(served: Any) -> None:
    srv, raw = served
    clients = _enrolled(srv, raw, "idle", "good")
    idle, good = clients
    task = idle.task()
    payload = _payload(srv)
    errors: list[grpc.StatusCode] = []
    gate = threading.Event()

    def stalled() -> Iterator[pb.UpdateChunk]:
        yield idle.header(task, payload)
        gate.wait(30)  # send nothing more

    def run() -> None:
        try:
            idle.stub.UploadUpdate(stalled(), metadata=idle.md, timeout=30)
        except grpc.RpcError as exc:
            errors.append(exc.code())

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    # Meanwhile the honest client is served normally.
    assert good.upload(good.update(good.task(), payload)).accepted
    assert time.monotonic() - t0 < 10
    for t in threads:
        t.join(20)
    gate.set()
    # One stream was admitted and cut for idling; the others were refused at
    # once (one upload in flight per client).
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in errors and len(errors) == 6
    wait_for(lambda: srv.coord.finished, 60, "the round")
    store = Store(raw["store"]["url"], migrate=False)
    assert check_store(store) == []
    assert _refusals(store, srv.coord.run_id, "idle")


def test_uploads_without_a_task_are_refused_before_the_body(served: Any) -> None:
    srv, raw = served
    a, b = _enrolled(srv, raw, "a", "b")
    ta = a.task()
    fake = pb.Task(task_id="0" * 16, round=1, nonce=b"x")
    sent = 0

    def stream() -> Iterator[pb.UpdateChunk]:
        nonlocal sent
        yield b.header(fake, b"\x00" * 10_000_000)
        for _ in range(1000):  # 1 GB the server must never read
            sent += 1
            yield pb.UpdateChunk(data=b"\x00" * 1_000_000)

    with pytest.raises(grpc.RpcError) as info:
        b.stub.UploadUpdate(stream(), metadata=b.md, timeout=30)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert sent < 100  # refused on the header, long before the body
    # Another client's task id is refused too, and is not burnt.
    with pytest.raises(grpc.RpcError) as info:
        b.upload(b.update(ta, _payload(srv)))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    _finish(srv, raw, a, b)


def test_metrics_only_for_rounds_the_client_took_part_in(served: Any) -> None:
    srv, raw = served
    a, b = _enrolled(srv, raw, "a", "b")
    ta = a.task()
    for task_id, rnd in (("nope", 1), (ta.task_id, 7)):
        with pytest.raises(grpc.RpcError) as info:
            b.stub.ReportMetrics(
                pb.MetricsReport(task_id=task_id, round=rnd, metrics={"acc": 1.0}),
                metadata=b.md,
                timeout=10,
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as info:
        b.stub.ReportMetrics(
            pb.MetricsReport(task_id="t", round=-3, metrics={"acc": 1.0}),
            metadata=b.md,
            timeout=10,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    store = _finish(srv, raw, a, b)
    assert store.list_metrics(srv.coord.run_id, "client.acc") == []


def test_oversized_layouts_and_strings_are_refused_cheaply(served: Any) -> None:
    srv, raw = served
    (token,) = issue_tokens(raw, 1)
    c = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, token=token)
    many = common.Layout(
        tensors=[common.TensorSpec(name=f"t{i}", shape=[1]) for i in range(100_000)]
    )
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        c.enroll(layout=many)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Refused on its size before it is parsed; the bound is the run's own
    # layout rounded up to a power of two, so the answer says no more.
    assert "exceeds its" in info.value.details()
    assert "tensor" not in info.value.details()
    assert time.monotonic() - t0 < 5
    # Larger than a message may be: gRPC refuses it before the handler runs.
    huge = common.Layout(
        tensors=[common.TensorSpec(name=f"t{i}" * 20, shape=[1]) for i in range(99)]
        * 2000
    )
    with pytest.raises(grpc.RpcError) as info:
        c.enroll(layout=huge)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for name in ("x" * 1000, "y" * 129, "   ", "tab\tname", "line\nbreak"):
        with pytest.raises(grpc.RpcError) as info:
            c.enroll(name=name)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    c.enroll()  # the token was not spent by the refusals
    (other,) = _enrolled(srv, raw, "other")
    store = _finish(srv, raw, c, other)
    text = " ".join(e.message for e in store.list_events(srv.coord.run_id))
    assert "t99999" not in text and "t98t98" not in text  # no attacker names stored


def test_replays_and_downloads_after_the_upload_never_touch_closed_rows(
    served: Any,
) -> None:
    srv, raw = served
    a, b = _enrolled(srv, raw, "a", "b")
    ta, tb = a.task(), b.task()
    payload = _payload(srv)
    assert a.upload(a.update(ta, payload)).accepted
    with pytest.raises(grpc.RpcError) as info:  # a download after its upload
        a.download(ta)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert b.upload(b.update(tb, payload)).accepted
    wait_for(lambda: srv.coord.finished, 60, "the round")
    store = Store(raw["store"]["url"], migrate=False)
    before = store.list_participations(srv.coord.run_id, 1)
    for c, t in ((a, ta), (b, tb)):  # replays of closed tasks
        with pytest.raises(grpc.RpcError) as info:
            c.upload(c.update(t, payload))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError):
            c.download(t)
    assert store.list_participations(srv.coord.run_id, 1) == before
    assert check_store(store) == []


def test_an_enrolment_the_store_refuses_keeps_its_token(served: Any) -> None:
    srv, raw = served
    (first,) = _enrolled(srv, raw, "first")
    (token,) = issue_tokens(raw, 1)
    # A new client presenting a key another client registered: refused by
    # the store, in the same transaction that would have spent the token.
    copycat = RawClient(
        f"127.0.0.1:{srv.port}", srv.coord.layout, name="copy", token=token,
        identity=first.identity,
    )  # fmt: skip
    with pytest.raises(grpc.RpcError) as info:
        copycat.enroll()
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    honest = RawClient(
        f"127.0.0.1:{srv.port}", srv.coord.layout, name="n" * 128, token=token
    )
    honest.enroll()  # the token was not spent; a 128-character name is fine
    _finish(srv, raw, first, honest)
