"""A small certificate authority for TLS and mutual TLS (``fedplat certs``).

Makes a CA, server certificates (with configurable DNS/IP subject alternative
names) and client certificates with the ``cryptography`` package, so an operator
never needs openssl. Keys are ECDSA P-256 (what every gRPC TLS stack accepts);
private keys are written with mode 0600 and never overwritten.

Under mutual TLS the coordinator binds a client's identity to its certificate:
:func:`fingerprint` (SHA-256 of the DER certificate) is the identity stored with
the client, so one certificate cannot enrol under two client ids.

Gossip peers are servers and clients of each other: a *peer certificate*
(:func:`issue_peer`) carries both usages, the node id as common name and the DNS
name :func:`peer_dns_name` of that id, which a peer dialling the node verifies,
so an address cannot be redirected to another holder of a certificate from the
same CA (a coordinator client's, say).
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
#: Peer certificates name their node as ``<id>.peer.fedplat.invalid`` (a reserved
#: top-level domain: the name is an identity label and never resolves).
PEER_DNS_SUFFIX = "peer.fedplat.invalid"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class CertError(ValueError):
    """Bad names or SANs, missing CA files, or files that would be overwritten."""


@dataclass(frozen=True)
class CertInfo:
    """What a certificate says about its holder (see :func:`inspect_certificate`)."""

    common_name: str
    dns_names: tuple[str, ...]
    fingerprint: str
    server_auth: bool
    client_auth: bool


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


def _load_pem(cert_pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertError(f"not a PEM certificate: {exc}") from exc


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM file (a chain or a CA bundle); CertError when
    there is none or one does not parse."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise CertError("not a PEM certificate") from None
    if not certs:
        raise CertError("not a PEM certificate")
    return certs


def check_key_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """CertError unless ``key_pem`` is an unencrypted PEM private key whose
    public half is the one in the first certificate of ``cert_pem``: the
    mistakes gRPC would otherwise report only as a failure to listen."""
    cert = load_certificates(cert_pem)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise CertError("not an unencrypted PEM private key") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(
        der, spki
    ):
        raise CertError("the private key does not belong to the certificate")


def _der_sha256(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def fingerprint(cert_pem: bytes) -> str:
    """Hex SHA-256 of a PEM certificate's DER bytes (the mTLS client identity)."""
    return _der_sha256(_load_pem(cert_pem))


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


def _issue(
    d: Path,
    name: str,
    usages: list[x509.ObjectIdentifier],
    dns_and_ips: tuple[str, ...],
    days: int,
    uris: tuple[str, ...] = (),
) -> Issued:
    _check_name(name)
    if days < 1:
        raise CertError("days must be >= 1")
    sans = [_san(s) for s in dns_and_ips] + [
        x509.UniformResourceIdentifier(u) for u in uris
    ]
    ca_cert, ca_key = _load_ca(d)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(name, ca_cert.subject, key, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if sans:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(sans), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = d / f"{name}.pem", d / f"{name}.key"
    _write_new(key_path, _key_pem(key), 0o600)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    _write_new(cert_path, pem, 0o644)
    return Issued(cert_path, key_path, fingerprint(pem))


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
    if server:
        return _issue(
            Path(directory),
            name,
            [ExtendedKeyUsageOID.SERVER_AUTH],
            sans or ("localhost", "127.0.0.1"),
            days,
        )
    return _issue(Path(directory), name, [ExtendedKeyUsageOID.CLIENT_AUTH], (), days)


def peer_dns_name(node_id: str) -> str:
    """The DNS name in node ``node_id``'s peer certificate (what callers verify)."""
    return f"{node_id}.{PEER_DNS_SUFFIX}"


def issue_peer(
    directory: str | os.PathLike[str],
    node_id: str,
    *,
    sans: tuple[str, ...] = (),
    days: int = 825,
) -> Issued:
    """A gossip peer's ``NODE_ID.pem``/``NODE_ID.key``: server and client usages,
    common name ``node_id``, DNS names :func:`peer_dns_name` and ``localhost``,
    IP ``127.0.0.1``, plus ``sans`` (the hosts the peer is reached at)."""
    return _issue(
        Path(directory),
        node_id,
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        tuple(dict.fromkeys((peer_dns_name(node_id), "localhost", "127.0.0.1", *sans))),
        days,
    )


def inspect_certificate(cert_pem: bytes) -> CertInfo:
    """Common name, DNS names, fingerprint and usages of a PEM certificate."""
    cert = _load_pem(cert_pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        dns = tuple(san.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns = ()
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        usages = set(eku)
    except x509.ExtensionNotFound:
        usages = set()
    return CertInfo(
        common_name=str(cns[0].value) if cns else "",
        dns_names=dns,
        fingerprint=_der_sha256(cert),
        server_auth=ExtendedKeyUsageOID.SERVER_AUTH in usages,
        client_auth=ExtendedKeyUsageOID.CLIENT_AUTH in usages,
    )


__all__ = [
    "CA_CERT",
    "CA_KEY",
    "PEER_DNS_SUFFIX",
    "CertError",
    "CertInfo",
    "Issued",
    "check_key_pair",
    "create_ca",
    "fingerprint",
    "inspect_certificate",
    "issue",
    "issue_peer",
    "load_certificates",
    "peer_dns_name",
]
