"""A small certificate authority for TLS and mutual TLS (``fedplat certs``).

Makes a CA, server certificates (with configurable DNS/IP subject alternative
names) and client certificates with the ``cryptography`` package, so an operator
never needs openssl. Keys are ECDSA P-256 (what every gRPC TLS stack accepts);
private keys are written with mode 0600 and never overwritten.

Under mutual TLS the coordinator binds a client's identity to its certificate:
:func:`fingerprint` (SHA-256 of the DER certificate) is the identity stored with
the client, so one certificate cannot enrol under two client ids.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class CertError(ValueError):
    """Bad names or SANs, missing CA files, or files that would be overwritten."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as written (PEM paths)."""

    cert_path: Path
    key_path: Path
    fingerprint: str


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise CertError(
            f"certificate name {name!r}: use 1-64 letters, digits, '.', '_' or '-'"
        )
    return name


def _san(value: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not re.match(r"^[A-Za-z0-9*]([A-Za-z0-9\-.]{0,252})$", value):
        raise CertError(f"subject alternative name {value!r} is not a host or IP")
    return x509.DNSName(value)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise CertError(f"{path} exists; remove it first or use another name") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def fingerprint(cert_pem: bytes) -> str:
    """Hex SHA-256 of a PEM certificate's DER bytes (the mTLS client identity)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertError(f"not a PEM certificate: {exc}") from exc
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def create_ca(
    directory: str | os.PathLike[str], *, name: str = "fedplat CA", days: int = 3650
) -> Issued:
    """Write ``ca.pem`` and ``ca.key`` (0600) into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if days < 1:
        raise CertError("days must be >= 1")
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _builder(name, issuer, key, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_new(d / CA_KEY, _key_pem(key), 0o600)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    _write_new(d / CA_CERT, pem, 0o644)
    return Issued(d / CA_CERT, d / CA_KEY, fingerprint(pem))


def _load_ca(d: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((d / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key(
            (d / CA_KEY).read_bytes(), password=None
        )
    except (OSError, ValueError) as exc:
        raise CertError(
            f"no usable CA in {d} ({exc}); run `fedplat certs ca --dir {d}` first"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{d / CA_KEY} is not an EC private key")
    return cert, key


def issue(
    directory: str | os.PathLike[str],
    name: str,
    *,
    server: bool,
    sans: tuple[str, ...] = (),
    days: int = 825,
) -> Issued:
    """Write ``NAME.pem`` and ``NAME.key`` signed by the CA in ``directory``.

    A server certificate carries ``sans`` (default ``localhost`` and
    ``127.0.0.1``) and the serverAuth usage; a client certificate the clientAuth
    usage and its name as common name.
    """
    d = Path(directory)
    _check_name(name)
    if days < 1:
        raise CertError("days must be >= 1")
    ca_cert, ca_key = _load_ca(d)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = (
        ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    )
    builder = (
        _builder(name, ca_cert.subject, key, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        names = sans or ("localhost", "127.0.0.1")
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_san(s) for s in names]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = d / f"{name}.pem", d / f"{name}.key"
    _write_new(key_path, _key_pem(key), 0o600)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    _write_new(cert_path, pem, 0o644)
    return Issued(cert_path, key_path, fingerprint(pem))


__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CertError",
    "Issued",
    "create_ca",
    "fingerprint",
    "issue",
]
