"""TLS and mutual TLS between the client SDK and the coordinator (certs made here)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fedplat.client import Backoff, Client, FitResult
from fedplat.server.app import Coordinator
from fedplat.server.config import parse_config

from fedplat.models import create_model
from tests.support import free_port, run_config, wait_for

pytestmark = pytest.mark.integration  # starts real processes


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    return b.sign(issuer_key, hashes.SHA256())


def _pem(obj: object) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    assert isinstance(obj, ec.EllipticCurvePrivateKey)
    return obj.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, bytes | Path]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("fedplat test CA", ca_key, "fedplat test CA", ca_key, ca=True)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = _cert("localhost", srv_key, "fedplat test CA", ca_key, ca=False)
    cli_key = ec.generate_private_key(ec.SECP256R1())
    cli = _cert("client-0", cli_key, "fedplat test CA", ca_key, ca=False)
    out: dict[str, bytes | Path] = {
        "ca": _pem(ca),
        "cli_key": _pem(cli_key),
        "cli_cert": _pem(cli),
    }
    for name, data in (
        ("ca.pem", _pem(ca)),
        ("srv.pem", _pem(srv)),
        ("srv.key", _pem(srv_key)),
    ):
        (tmp_path / name).write_bytes(data)
        out[name] = tmp_path / name
    return out


def _client(address: str, name: str, **tls: bytes | None) -> Client:
    model = create_model("mlp", (1, 8, 8), 10, hidden=(64,))

    def train(m: torch.nn.Module, config: object) -> FitResult:
        return FitResult(3)

    return Client(
        address,
        model,
        train,
        num_examples=3,
        name=name,
        backoff=Backoff(base=0.1, cap=0.3),
        poll_seconds=1,
        give_up_after=3.0,
        **tls,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("mutual", [False, True])
def test_tls_round_trip_and_refusals(tmp_path: Path, pki: dict, mutual: bool) -> None:
    address = f"127.0.0.1:{free_port()}"
    tls = {"cert": str(pki["srv.pem"]), "key": str(pki["srv.key"])}
    if mutual:
        tls["client_ca"] = str(pki["ca.pem"])
    raw = run_config(tmp_path, rounds=1, clients=1, address=address)
    raw["server"] = {"address": address, "tls": tls}
    coord = Coordinator(parse_config(raw))
    coord.start()
    try:
        creds = {"root_certificates": pki["ca"]}
        if mutual:
            creds |= {
                "private_key": pki["cli_key"],
                "certificate_chain": pki["cli_cert"],
            }
        good = _client(address, "good", **creds)
        good.start()
        wait_for(lambda: coord.engine.finished, 60, "the TLS round")
        good.stop()
        # A client that does not trust the server's CA cannot connect at all.
        stranger = _client(address, "stranger")
        with pytest.raises(ConnectionError):
            stranger.run()
        if mutual:  # trusting the server is not enough without a client cert
            no_cert = _client(address, "no-cert", root_certificates=pki["ca"])
            with pytest.raises(ConnectionError):
                no_cert.run()
    finally:
        coord.stop(grace=0)
