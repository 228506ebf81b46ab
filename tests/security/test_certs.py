"""``fedplat certs``: a CA and certificates that gRPC accepts for mutual TLS."""

from __future__ import annotations

import stat
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedplat.cli import main
from fedplat.security.certs import CertError, create_ca, fingerprint, issue


def test_cli_init_makes_a_ca_server_and_clients(tmp_path: Path, capsys) -> None:
    d = tmp_path / "pki"
    assert main(["certs", "init", "--dir", str(d), "--clients", "2"]) == 0
    names = sorted(p.name for p in d.iterdir())
    assert names == sorted(
        ["ca.pem", "ca.key", "server.pem", "server.key"]
        + [f"client-{i}.{e}" for i in range(2) for e in ("pem", "key")]
    )
    assert stat.S_IMODE((d / "ca.key").stat().st_mode) == 0o600
    # Idempotent: a second init makes nothing and overwrites nothing.
    before = (d / "ca.pem").read_bytes()
    assert main(["certs", "init", "--dir", str(d)]) == 0
    assert (d / "ca.pem").read_bytes() == before
    # Issuing over an existing name is a one-line error, exit 2.
    assert main(["certs", "client", "--dir", str(d), "--name", "client-0"]) == 2
    assert "exists" in capsys.readouterr().err


def test_bad_names_sans_and_missing_ca(tmp_path: Path) -> None:
    with pytest.raises(CertError, match="no usable CA"):
        issue(tmp_path, "server", server=True)
    create_ca(tmp_path)
    with pytest.raises(CertError, match="certificate name"):
        issue(tmp_path, "../evil", server=False)
    with pytest.raises(CertError, match="not a host or IP"):
        issue(tmp_path, "srv", server=True, sans=("bad host!",))


def test_grpc_mutual_tls_with_issued_certs(tmp_path: Path) -> None:
    create_ca(tmp_path)
    srv = issue(tmp_path, "server", server=True)
    cli = issue(tmp_path, "client-0", server=False)
    assert fingerprint(cli.cert_path.read_bytes()) == cli.fingerprint
    ca = (tmp_path / "ca.pem").read_bytes()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    creds = grpc.ssl_server_credentials(
        [(srv.key_path.read_bytes(), srv.cert_path.read_bytes())],
        root_certificates=ca,
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        ok = grpc.ssl_channel_credentials(
            ca, cli.key_path.read_bytes(), cli.cert_path.read_bytes()
        )
        with grpc.secure_channel(f"localhost:{port}", ok) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        anonymous = grpc.ssl_channel_credentials(ca)
        with (
            grpc.secure_channel(f"localhost:{port}", anonymous) as ch,
            pytest.raises(grpc.RpcError),
        ):
            health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
    finally:
        server.stop(0)
