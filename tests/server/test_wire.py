"""The bounds of :mod:`fedplat.server.wire`: per-method sizes before parsing,
receive deadlines, calls and uploads per identity, the health service, the
open-file headroom and the connection cap (the last two with real processes)."""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fedplat.server.app import BackgroundServer
from fedplat.server.config import ConfigError, ServerSection, parse_config
from fedplat.server.servicer import SERVICE
from fedplat.server.wire import (
    FD_RESERVE,
    MessageLimits,
    check_fd_headroom,
    grpc_options,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto.streams import Malformed
from fedplat.store import Store
from fedplat.testing.protocol import RawClient, dense_payload_bytes
from tests.support import issue_tokens, run_config, wait_for, write_config
from tests.support.procs import Procs


def _server(**kw: Any) -> ServerSection:
    return ServerSection(insecure=True, **kw)


# ---------------------------------------------------------------- units
def test_message_bounds_follow_the_run_layout_rounded_up() -> None:
    small = common.Layout(tensors=[common.TensorSpec(name="w", shape=[10, 10])])
    big = common.Layout(
        tensors=[common.TensorSpec(name=f"layer{i}.w", shape=[64]) for i in range(500)]
    )
    a, b = MessageLimits(_server(), small), MessageLimits(_server(), big)
    # 2 x the layout + 4 KiB, rounded up to a power of two.
    assert a.layout_bytes == 8192
    assert b.layout_bytes & (b.layout_bytes - 1) == 0
    assert b.layout_bytes >= 2 * big.ByteSize() + 4096 > b.layout_bytes // 2
    assert a.by_method["GetTask"] == 1024
    parse = a.deserializer("Enroll", pb.EnrollRequest)
    huge = common.Layout(
        tensors=[common.TensorSpec(name=f"layer{i}.w", shape=[64]) for i in range(5000)]
    )
    too_big = pb.EnrollRequest(layout=huge).SerializeToString()
    out = parse(too_big)
    assert isinstance(out, Malformed) and "exceeds its" in out.reason
    assert isinstance(parse(pb.EnrollRequest(layout=small).SerializeToString()),
                      pb.EnrollRequest)  # fmt: skip
    assert isinstance(parse(b"\xff\xff"), Malformed)


def test_grpc_options_carry_the_caps() -> None:
    opts = dict(grpc_options(_server(max_connections=100, connection_idle_seconds=7)))
    assert opts["grpc.max_allowed_incoming_connections"] == 100
    assert opts["grpc.max_connection_idle_ms"] == 7000
    assert opts["grpc.max_concurrent_streams"] == 16
    assert opts["grpc.server_handshake_timeout_ms"] == 10_000


def test_fd_headroom_raises_the_soft_limit_or_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = {"soft": 1024, "hard": 4096}
    monkeypatch.setattr(
        resource, "getrlimit", lambda _: (limits["soft"], limits["hard"])
    )

    def setr(_: int, value: tuple[int, int]) -> None:
        if value[0] > limits["hard"]:
            raise ValueError("above the hard limit")
        limits["soft"] = value[0]

    monkeypatch.setattr(resource, "setrlimit", setr)
    assert check_fd_headroom(_server(max_connections=2048)) == 2048 + FD_RESERVE
    limits.update(soft=1024, hard=1024)
    with pytest.raises(ConfigError) as info:
        check_fd_headroom(_server(max_connections=2048))
    msg = str(info.value)
    assert "\n" not in msg and "open-file limit is 1024" in msg
    assert f"at most {1024 - FD_RESERVE}" in msg


def test_a_run_file_without_server_section_does_not_serve_plaintext(
    tmp_path: Path,
) -> None:
    raw = run_config(tmp_path)
    del raw["server"]
    cfg = parse_config(raw)
    assert not cfg.server.insecure and cfg.server.tls is None
    with pytest.raises(ConfigError, match="insecure: true to serve plaintext"):
        BackgroundServer(cfg).start()


def test_negative_seed_is_a_config_error(tmp_path: Path) -> None:
    raw = run_config(tmp_path)
    raw["run"]["seed"] = -1
    with pytest.raises(ConfigError, match=r"run\.seed"):
        parse_config(raw)


# ---------------------------------------------------------------- in process
@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[BackgroundServer, dict[str, Any]]]:
    raw = run_config(
        tmp_path,
        rounds=1,
        clients=2,
        quorum=1,
        deadlines={"round_seconds": 60, "close_after_quorum_seconds": 0.2},
        server={
            "stream_idle_seconds": 5.0,
            "receive_seconds": 1.0,
            "max_concurrent_uploads": 1,
            "min_upload_bytes_per_second": 100_000,
            "upload_grace_seconds": 1.0,
        },
        admission={"enrol_per_second": 200.0, "enrol_burst": 400},
    )
    srv = BackgroundServer(parse_config(raw)).start()
    yield srv, raw
    srv.stop()


def _enrolled(srv: BackgroundServer, raw: dict[str, Any], *names: str) -> list[Any]:
    out = []
    for name, token in zip(names, issue_tokens(raw, len(names)), strict=True):
        c = RawClient(f"127.0.0.1:{srv.port}", srv.coord.layout, name=name, token=token)
        c.enroll()
        out.append(c)
    return out


def _payload(srv: BackgroundServer) -> bytes:
    return dense_payload_bytes(np.full(srv.coord.layout.numel, 1e-3, dtype="<f4"))


def _trickle(c: RawClient, task: pb.Task, payload: bytes, pause: float) -> Any:
    """An upload that sends 256 bytes every ``pause`` seconds."""

    def chunks() -> Iterator[pb.UpdateChunk]:
        yield c.header(task, payload)
        for i in range(0, len(payload), 256):
            time.sleep(pause)
            yield pb.UpdateChunk(data=payload[i : i + 256])

    return c.stub.UploadUpdate(chunks(), metadata=c.md, timeout=60)


def test_a_trickling_upload_loses_its_slot_and_honest_uploads_go_on(
    served: tuple[BackgroundServer, dict[str, Any]],
) -> None:
    srv, raw = served
    slow, honest = _enrolled(srv, raw, "slow", "honest")
    payload = _payload(srv)
    slow_task, honest_task = slow.task(), honest.task()
    result: dict[str, Any] = {}

    def trickle() -> None:
        try:
            _trickle(slow, slow_task, payload, 0.2)
        except grpc.RpcError as exc:
            result["slow"] = exc

    t = threading.Thread(target=trickle)
    t.start()
    time.sleep(0.3)  # the trickler holds the only decoding slot
    # A second upload of the same identity, from a fresh session, is refused.
    slow.enroll(client_id=slow.client_id)
    with pytest.raises(grpc.RpcError) as info:
        slow.upload(slow.update(slow_task, payload))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "in progress" in info.value.details()
    assert honest.upload(honest.update(honest_task, payload)).accepted
    t.join(30)
    exc = result["slow"]
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "slower than 100000 bytes/s" in exc.details()
    wait_for(lambda: srv.coord.finished, 60, "the round")


def test_a_request_that_never_arrives_is_cut(
    served: tuple[BackgroundServer, dict[str, Any]],
) -> None:
    srv, raw = served
    (c,) = _enrolled(srv, raw, "c")

    def never() -> Iterator[bytes]:
        time.sleep(3)
        yield pb.GetTaskRequest().SerializeToString()

    ident: Any = lambda b: b  # noqa: E731
    call = c.channel.stream_unary(f"/{SERVICE}/GetTask", ident, ident)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        call(never(), metadata=c.md, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "did not arrive within 1 s" in info.value.details()
    assert time.monotonic() - t0 < 3


def test_calls_in_flight_per_client_are_capped(
    served: tuple[BackgroundServer, dict[str, Any]],
) -> None:
    srv, raw = served
    (c,) = _enrolled(srv, raw, "c")  # no round opens: long polls wait
    codes: list[Any] = []

    def poll() -> None:
        try:
            c.stub.GetTask(pb.GetTaskRequest(wait_seconds=3), metadata=c.md, timeout=10)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())

    threads = [threading.Thread(target=poll) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    # The caller got its 4 calls (max_calls_per_client); the rest were refused.
    assert codes.count(grpc.StatusCode.OK) == 4
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 4


def test_health_answers_malformed_bytes_with_invalid_argument(
    served: tuple[BackgroundServer, dict[str, Any]],
    capfd: pytest.CaptureFixture[str],
) -> None:
    srv, _ = served
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        ok = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert ok.status == health_pb2.HealthCheckResponse.SERVING
        ident: Any = lambda b: b  # noqa: E731
        check = ch.unary_unary("/grpc.health.v1.Health/Check", ident, ident)
        for garbage in (b"\xff\xff\xff\x0f", b"\x0a\xff\x01ab", b"\x0a" * 5000):
            with pytest.raises(grpc.RpcError) as info:
                check(garbage, timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
    assert "Traceback" not in capfd.readouterr().err


# ---------------------------------------------------------------- processes
@pytest.mark.integration
def test_an_open_file_limit_below_the_caps_refuses_to_start(
    tmp_path: Path, procs: Procs
) -> None:
    cfg = write_config(tmp_path, run_config(tmp_path))
    p = procs.coordinator(cfg, nofile=1024)
    assert p.wait(60) == 2
    lines = [ln for ln in procs.log("coordinator").splitlines() if ln.strip()]
    assert any("open-file limit is 1024" in ln for ln in lines), lines
    assert "Traceback" not in procs.log("coordinator")


def _flood(port: int, n: int, stop: threading.Event, opened: list[int]) -> None:
    """Keep ``n`` TCP connections open (reopening those the server closes):
    half stay silent, half send the HTTP/2 preface and then nothing."""
    socks: list[socket.socket] = []
    preface = (
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    )
    while not stop.is_set():
        socks = [s for s in socks if _alive(s)]
        while len(socks) < n and not stop.is_set():
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", port))
                if len(socks) % 2:
                    s.sendall(preface)
            except OSError:
                s.close()
                break
            s.setblocking(False)
            socks.append(s)
            opened[0] += 1
        stop.wait(0.5)
    for s in socks:
        s.close()


def _alive(s: socket.socket) -> bool:
    try:
        if s.recv(65536) == b"":
            s.close()
            return False
    except BlockingIOError:
        return True
    except OSError:
        s.close()
        return False
    return True


def _enrolled_count(url: str) -> int:
    try:
        store = Store(url, migrate=False)
        runs = store.list_runs()
        return len(store.list_clients(runs[0].id)) if runs else 0
    except Exception:  # the coordinator has not created the store yet
        return 0


@pytest.mark.integration
def test_a_connection_flood_at_1024_files_is_capped_and_the_run_completes(
    tmp_path: Path, procs: Procs
) -> None:
    address = run_config(tmp_path)["server"]["address"]
    raw = run_config(
        tmp_path,
        rounds=6,
        clients=2,
        address=address,
        server={
            "address": address,
            "insecure": True,
            "max_connections": 700,  # + FD_RESERVE fits the 1,024 limit
            "handshake_seconds": 2.0,
            "connection_idle_seconds": 3.0,
        },
    )
    tokens = issue_tokens(raw, 2)
    coord = procs.coordinator(write_config(tmp_path, raw), nofile=1024)
    clients = [procs.client(address, i, 2, token=tokens[i]) for i in range(2)]
    url = raw["store"]["url"]
    wait_for(lambda: _enrolled_count(url) == 2, 120, "enrolment", procs=procs)
    stop, opened = threading.Event(), [0]
    port = int(address.rsplit(":", 1)[1])
    flood = threading.Thread(target=_flood, args=(port, 1000, stop, opened))
    flood.start()
    peak = 0
    try:
        end = time.monotonic() + 300
        while coord.poll() is None and time.monotonic() < end:
            with contextlib.suppress(OSError):  # it may exit meanwhile
                peak = max(peak, len(list(Path(f"/proc/{coord.pid}/fd").iterdir())))
            time.sleep(0.2)
    finally:
        stop.set()
        flood.join(30)
    for c in clients:
        c.wait(60)
    log = procs.log("coordinator")
    assert coord.returncode == 0, log[-3000:]
    assert "Too many open files" not in log and "EMFILE" not in log
    assert opened[0] >= 700  # the flood filled the cap (and reopened)
    assert 700 <= peak < 1024
    run = Store(url, migrate=False).list_runs()[0]
    assert run.status == "completed" and run.current_round == 6
