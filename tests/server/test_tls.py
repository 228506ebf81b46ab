"""TLS + tokens and mutual TLS between the SDK and the coordinator (certificates
made with ``fedplat certs``)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import torch
from fedplat.client import Backoff, Client, FitResult
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config

from fedplat.models import create_model
from fedplat.proto import fedplat_pb2 as pb
from fedplat.protocol.errors import FedplatError, TlsError
from fedplat.security.certs import create_ca, issue
from fedplat.store import Store
from fedplat.store.check import check_store
from fedplat.testing.protocol import RawClient
from tests.support import free_port, issue_tokens, run_config, wait_for

pytestmark = pytest.mark.integration  # real sockets, TLS handshakes


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_ca(d)
    issue(d, "server", server=True)
    issue(d, "client-0", server=False)
    issue(d, "client-1", server=False)
    return d


def _client(address: str, name: str, **kw: object) -> Client:
    model = create_model("mlp", (1, 8, 8), 10, hidden=(64,))

    def train(m: torch.nn.Module, config: object) -> FitResult:
        return FitResult(3)

    return Client(
        address, model, train, num_examples=3, name=name,
        backoff=Backoff(base=0.1, cap=0.3), poll_seconds=1, give_up_after=5.0,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _serve(tmp: Path, pki: Path, mutual: bool) -> tuple[BackgroundServer, dict]:
    address = f"localhost:{free_port()}"
    tls = {"cert": str(pki / "server.pem"), "key": str(pki / "server.key")}
    if mutual:
        tls["client_ca"] = str(pki / "ca.pem")
    raw = run_config(tmp, rounds=1, clients=1, address=address)
    raw["server"] = {"address": address, "tls": tls}
    return BackgroundServer(parse_config(raw)).start(), raw


def test_tls_with_tokens(tmp_path: Path, pki: Path) -> None:
    srv, raw = _serve(tmp_path, pki, mutual=False)
    address = raw["server"]["address"]
    ca = (pki / "ca.pem").read_bytes()
    try:
        (token,) = issue_tokens(raw, 1)
        good = _client(address, "good", root_certificates=ca, enrolment_token=token)
        good.start()
        wait_for(lambda: srv.coord.finished, 60, "the TLS round")
        good.stop()
        # A client that does not trust the server's CA stops at once, saying why.
        with pytest.raises(TlsError, match="does not verify"):
            _client(address, "stranger").run()
        # A plaintext client is told what is wrong instead of retrying forever.
        plain = _client(address, "plain", insecure=True)
        with pytest.raises(ConnectionError, match="serves TLS"):
            plain.run()
        # Trusting the CA is not admission: without a token, refused.
        with pytest.raises(FedplatError, match="enrolment token"):
            _client(address, "no-token", root_certificates=ca).run()
    finally:
        srv.stop()
    assert check_store(Store(raw["store"]["url"], migrate=False)) == []


def test_mutual_tls_binds_the_client_to_its_certificate(
    tmp_path: Path, pki: Path
) -> None:
    srv, raw = _serve(tmp_path, pki, mutual=True)
    address = raw["server"]["address"]
    ca = (pki / "ca.pem").read_bytes()

    def creds(name: str) -> dict[str, bytes]:
        return {
            "root_certificates": ca,
            "private_key": (pki / f"{name}.key").read_bytes(),
            "certificate_chain": (pki / f"{name}.pem").read_bytes(),
        }

    try:
        good = _client(address, "good", **creds("client-0"))  # no token: the cert
        good.start()
        wait_for(lambda: srv.coord.finished, 60, "the mTLS round")
        good.stop()
        c = creds("client-0")
        channel = grpc.ssl_channel_credentials(
            c["root_certificates"], c["private_key"], c["certificate_chain"]
        )
        # The same certificate cannot enrol under another client id ...
        twin = RawClient(address, srv.coord.layout, credentials=channel)
        with pytest.raises(grpc.RpcError) as info:
            twin.enroll(client_id="someone-else")
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # ... and enrolling with it again is the same client, not a new one.
        twin.enroll()
        assert twin.client_id == good.client_id
        # A session is bound to its certificate: the token is useless over
        # another client's certificate.
        c1 = creds("client-1")
        other = RawClient(
            address,
            srv.coord.layout,
            credentials=grpc.ssl_channel_credentials(
                c1["root_certificates"], c1["private_key"], c1["certificate_chain"]
            ),
        )
        other.client_id, other.session = twin.client_id, twin.session
        with pytest.raises(grpc.RpcError) as info:
            other.poll(0.0)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert twin.poll(0.0).kind in (pb.Task.WAIT, pb.Task.FINISHED)
        # Ids a certificate holder merely claims (with a bad signature, or
        # bound to another certificate) name nobody in the stored refusals.
        claimed = [f"{i:016x}" for i in range(3)]
        for cid in claimed:
            with pytest.raises(grpc.RpcError):
                other.enroll(client_id=cid, signature=b"\x00" * 64)
        with pytest.raises(grpc.RpcError) as info:
            other.enroll(client_id=twin.client_id)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # as for no client
        srv.coord.ctx.recorder.flush()
        stored = Store(raw["store"]["url"], migrate=False).list_events(srv.coord.run_id)
        assert not {e.client_id for e in stored} & set(claimed)
        # Trusting the server is not enough without a client certificate.
        with pytest.raises((ConnectionError, TlsError)):
            _client(address, "no-cert", root_certificates=ca).run()
    finally:
        srv.stop()
    store = Store(raw["store"]["url"], migrate=False)
    run = store.get_run_by_name("test")
    assert run is not None and len(store.list_clients(run.id)) == 1
    assert check_store(store) == []


def test_an_operator_certificate_cannot_enrol_as_a_device(
    tmp_path: Path, pki: Path
) -> None:
    from fedplat.security.operators import issue_operator

    if not (pki / "op-viewer.pem").exists():
        issue_operator(pki, "op-viewer", role="viewer")
    srv, raw = _serve(tmp_path, pki, mutual=True)
    try:
        channel = grpc.ssl_channel_credentials(
            (pki / "ca.pem").read_bytes(),
            (pki / "op-viewer.key").read_bytes(),
            (pki / "op-viewer.pem").read_bytes(),
        )
        raw_client = RawClient(
            raw["server"]["address"], srv.coord.layout, credentials=channel
        )
        with pytest.raises(grpc.RpcError) as info:
            raw_client.enroll()
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "operator certificate" in (info.value.details() or "")
    finally:
        srv.stop()
