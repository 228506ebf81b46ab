"""Mutual TLS between gossip peers, with the deployment's CA (``fedplat certs``).

Every peer serves with its peer certificate and requires one from every caller
(:meth:`PeerTls.server_credentials`); every call it makes presents the same
certificate and checks that the callee's certificate carries the DNS name of
the node it means to reach (:func:`open_channel`), so an address cannot be
redirected to another certificate holder. The handlers read who called from
the connection (:func:`caller_certificate`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fedplat.security.certs import (
    CertError,
    CertInfo,
    inspect_certificate,
    peer_dns_name,
)

__all__ = ["PeerTls", "caller_certificate", "open_channel"]


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CertError(f"cannot read the {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        raise CertError(f"the {what} {path} is not a PEM file")
    return data


@dataclass(frozen=True)
class PeerTls:
    """A peer's CA, certificate and key (PEM bytes).

    Attributes
    ----------
    ca, cert, key : bytes
    info : CertInfo
        What the peer's own certificate says (common name, DNS names, usages).
    """

    ca: bytes
    cert: bytes
    key: bytes
    info: CertInfo

    @classmethod
    def load(
        cls,
        ca: str | os.PathLike[str],
        cert: str | os.PathLike[str],
        key: str | os.PathLike[str],
    ) -> PeerTls:
        ca_pem = _read(ca, "CA certificate")
        cert_pem = _read(cert, "certificate")
        key_pem = _read(key, "private key")
        inspect_certificate(ca_pem)  # raises CertError for a bad CA file
        return cls(ca_pem, cert_pem, key_pem, inspect_certificate(cert_pem))

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.ca,
            require_client_auth=True,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca,
            private_key=self.key,
            certificate_chain=self.cert,
        )


def open_channel(
    address: str,
    tls: PeerTls | None,
    server_id: str | None,
    options: Sequence[tuple[str, Any]],
) -> grpc.Channel:
    """A channel to the peer ``server_id`` at ``address``.

    With TLS the callee must present a certificate for
    :func:`~fedplat.security.certs.peer_dns_name` of ``server_id`` (or, when the
    id is not known yet, for the address's host).
    """
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    opts = list(options)
    if server_id:
        opts.append(("grpc.ssl_target_name_override", peer_dns_name(server_id)))
    return grpc.secure_channel(address, tls.channel_credentials(), options=opts)


@functools.lru_cache(maxsize=512)
def _inspect(pem: bytes) -> CertInfo | None:
    try:
        return inspect_certificate(pem)
    except CertError:
        return None


def caller_certificate(context: Any) -> CertInfo | None:
    """The verified client certificate of a call (``None`` without TLS)."""
    pems = context.auth_context().get("x509_pem_cert")
    return _inspect(bytes(pems[0])) if pems else None
