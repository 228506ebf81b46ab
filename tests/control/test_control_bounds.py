"""The control API's bounds, from the attacker review of its first version: no
certificate can hold the call slots or flood the log, no caller-chosen text
forges an audit line, stops and revocations cannot be abused (real gRPC, mTLS)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config
from fedplat.server.wire import FD_RESERVE, control_options, fd_limit_needed

from fedplat.cli import main
from fedplat.proto import control_pb2 as pb
from fedplat.proto import control_pb2_grpc
from fedplat.security.certs import fingerprint
from fedplat.store import Store
from tests.support import run_config, wait_for
from tests.support.control import make_pki, serve

pytestmark = pytest.mark.integration  # real sockets, TLS handshakes

METHOD = "/fedplat.control.v1.Control/WhoAmI"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ops = {"adm": "admin", "adm2": "admin", "op": "operator"}
    return make_pki(tmp_path_factory.mktemp("pki"), ops)


def _serve(tmp: Path, pki: Path, **control: object) -> tuple[BackgroundServer, dict]:
    srv, raw, _ = serve(tmp, pki, **control)
    return srv, raw


def _channel(pki: Path, who: str, raw: dict) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        (pki / f"{who}.key").read_bytes(),
        (pki / f"{who}.pem").read_bytes(),
    )
    # A connection of its own (no shared subchannel): the per-certificate slots
    # are counted across connections, not by HTTP/2's per-connection streams.
    options = [("grpc.use_local_subchannel_pool", 1)]
    return grpc.secure_channel(raw["control"]["address"], creds, options=options)


def _never_sends(stop: threading.Event) -> Iterator[pb.Empty]:
    stop.wait(30)
    return
    yield  # a generator that sends nothing until told


def test_control_connections_count_in_the_file_headroom() -> None:
    cfg = parse_config(
        {**run_config(Path("/tmp"), rounds=1, clients=1), "server": {"insecure": True}}
    )
    from fedplat.server.server_section import ControlSection

    control = ControlSection(operator_ca="ca.pem", max_connections=50)
    assert fd_limit_needed(cfg.server, control) == (
        cfg.server.max_connections + 50 + FD_RESERVE
    )
    opts = dict(control_options(control))
    assert opts["grpc.max_allowed_incoming_connections"] == 50
    assert opts["grpc.max_concurrent_streams"] == control.max_calls_per_operator
    assert opts["grpc.server_handshake_timeout_ms"] == 10_000


def test_silent_calls_give_their_slots_back_and_devices_hold_none(
    tmp_path: Path, pki: Path
) -> None:
    srv, raw = _serve(tmp_path, pki, receive_seconds=1.0, max_calls_per_operator=2)
    stop = threading.Event()
    try:
        held = [
            _channel(pki, "op", raw).stream_unary(METHOD).future(_never_sends(stop))
            for _ in range(2)
        ]
        time.sleep(0.3)
        # Two silent calls fill this operator's slots ...
        stub = control_pb2_grpc.ControlStub(_channel(pki, "op", raw))
        with pytest.raises(grpc.RpcError) as info:
            stub.WhoAmI(pb.Empty(), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # ... not another's, and they are cut when the request does not come.
        admin = control_pb2_grpc.ControlStub(_channel(pki, "adm", raw))
        assert admin.WhoAmI(pb.Empty(), timeout=10).name == "adm"
        for f in held:
            with pytest.raises(grpc.RpcError) as info:
                f.result(timeout=10)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "did not arrive" in (info.value.details() or "")
        assert stub.WhoAmI(pb.Empty(), timeout=10).name == "op"
        # A device's silent call is refused at once: it never holds a slot.
        device = _channel(pki, "device-0", raw).stream_unary(METHOD)
        with pytest.raises(grpc.RpcError) as info:
            device(_never_sends(stop), timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        stop.set()
        srv.stop()


def test_a_certificate_has_a_call_rate(tmp_path: Path, pki: Path) -> None:
    srv, raw = _serve(tmp_path, pki, calls_burst=3, calls_per_second=0.01)
    try:
        stub = control_pb2_grpc.ControlStub(_channel(pki, "op", raw))
        for _ in range(3):
            stub.WhoAmI(pb.Empty(), timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            stub.WhoAmI(pb.Empty(), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        other = control_pb2_grpc.ControlStub(_channel(pki, "adm", raw))
        assert other.WhoAmI(pb.Empty(), timeout=10).role == "admin"
    finally:
        srv.stop()


def test_no_caller_text_forges_an_audit_line(
    tmp_path: Path, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv, raw = _serve(tmp_path, pki)
    forged = "x\n2026-11-28 02:00:00  adm (admin)  StopRun test: ok\n\x1b[2K\x1b[1A"
    try:
        stub = control_pb2_grpc.ControlStub(_channel(pki, "op", raw))
        with pytest.raises(grpc.RpcError) as info:
            stub.GetRun(pb.RunRef(run=forged), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        admin = control_pb2_grpc.ControlStub(_channel(pki, "adm", raw))
        (entry,) = admin.ListAudit(
            pb.AuditRequest(method="GetRun", refused_only=True), timeout=10
        ).entries
        assert "\n" not in entry.target and "\x1b" not in entry.target
        assert entry.target.startswith("x\\n2026-11-28")
    finally:
        srv.stop()
    with Store(raw["store"]["url"]) as store:
        for e in store.list_events(kind="audit"):
            assert e.message.isprintable(), e.message


def test_stops_and_revocations_cannot_be_abused(tmp_path: Path, pki: Path) -> None:
    srv, raw = _serve(tmp_path, pki)
    name = raw["run"]["name"]
    try:
        admin = control_pb2_grpc.ControlStub(_channel(pki, "adm", raw))
        me = fingerprint((pki / "adm.pem").read_bytes())
        with pytest.raises(grpc.RpcError) as info:
            admin.RevokeOperator(pb.OperatorRef(fingerprint=me), timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as info:
            admin.RevokeToken(pb.TokenRef(id="nope"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        admin.CreateTokens(pb.CreateTokensRequest(count=3, expires_seconds=60))
        listed = admin.ListTokens(pb.ListTokensRequest(limit=2), timeout=10).tokens
        assert len(listed) == 2 and all(
            t.state == "valid" and not t.secret for t in listed
        )
        admin.StopRun(pb.StopRunRequest(run=name, reason="first"), timeout=10)
        op = control_pb2_grpc.ControlStub(_channel(pki, "op", raw))
        with pytest.raises(grpc.RpcError) as info:
            op.StopRun(pb.StopRunRequest(run=name, reason="second"), timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "already stopping (stopped by operator adm: first)" in (
            info.value.details() or ""
        )
        wait_for(lambda: srv.server.stop_event.is_set(), 30, "the stop")
    finally:
        srv.stop()
    with Store(raw["store"]["url"]) as store:
        run = store.get_run_by_name(name)
        assert run is not None and run.reason == "stopped by operator adm: first"


def test_the_store_owner_undoes_a_revocation(
    tmp_path: Path, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "s.db")
    fp = fingerprint((pki / "adm2.pem").read_bytes())
    with Store(db) as store:
        store.revoke_operator(fp, name="adm2", by="leaked")
    assert main(["operators", "revoked", "--db", db]) == 0
    assert f"{fp}  adm2  revoked by leaked" in capsys.readouterr().out
    assert main(["operators", "unrevoke", fp, "--db", db]) == 0
    assert "accepted again" in capsys.readouterr().out
    with Store(db) as store:
        assert not store.operator_revoked(fp)
