"""The transport-facing sections of a run file: ``server`` (address, TLS and
every per-caller bound), ``admission`` (who may enrol) and ``control`` (the
operators' API). See :mod:`fedplat.server.config` for the whole file."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from fedplat.config import Strict

MiB = 1024 * 1024


def _host_port(value: str) -> str:
    _, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:50051)")
    return value


class TlsSection(Strict):
    cert: str
    key: str
    client_ca: str | None = None  # set to require client certificates (mTLS)


class AdmissionSection(Strict):
    """Who may enrol (see docs/security.md).

    ``tokens``: a single-use token from ``fedplat tokens create`` (the default,
    also over plaintext); ``mtls``: the client certificate is the identity (the
    default when ``server.tls.client_ca`` is set); ``open``: anyone who reaches the
    port, capped by ``max_clients`` and ``enrol_per_second``, only when asked for.
    """

    mode: Literal["tokens", "mtls", "open"] | None = None
    max_clients: int = Field(default=10_000, ge=1, le=1_000_000)
    # Admission rate limit (token bucket) in every mode, spent only by new
    # clients whose credential checked out; open mode relies on it.
    enrol_per_second: float = Field(default=50.0, gt=0)
    enrol_burst: int = Field(default=200, ge=1)
    # How long a (stateless) enrolment challenge stays valid.
    challenge_seconds: float = Field(default=60.0, gt=0, le=3600)
    session_seconds: float = Field(default=3600.0, ge=10, le=7 * 86400)
    # How often revocations made with `fedplat clients revoke` are picked up.
    revocation_poll_seconds: float = Field(default=5.0, gt=0)


class ServerSection(Strict):
    address: str = "127.0.0.1:50051"
    # Plaintext gRPC must be asked for explicitly; otherwise TLS is required.
    insecure: bool = False
    tls: TlsSection | None = None
    # At most 16 MiB: what the SDK accepts per message (its channel limit).
    max_message_bytes: int = Field(default=4 * MiB, ge=64 * 1024, le=16 * MiB)
    chunk_bytes: int = Field(default=1 * MiB, ge=1024)
    max_update_bytes: int = Field(default=1024 * MiB, ge=1024)
    long_poll_seconds: float = Field(default=10.0, gt=0, le=300)
    # A stream that sends nothing for this long is cut (RESOURCE_EXHAUSTED).
    stream_idle_seconds: float = Field(default=30.0, gt=0, le=3600)
    # Updates decoded at once (each holds one model-sized scratch row).
    max_concurrent_uploads: int = Field(default=8, ge=1, le=1024)
    # The HTTP/2 flow-control window of each incoming stream: the most an
    # upload waiting for a decoding slot can make the coordinator buffer.
    # gRPC's window auto-tuning (BDP probing) is off, since it grows windows
    # until waiting uploads sit in memory whole; a larger window is faster on
    # long-RTT links (throughput per stream <= window / RTT).
    stream_window_bytes: int = Field(default=1 * MiB, ge=64 * 1024, le=64 * MiB)
    # Rows whose L2 norm exceeds this are refused as implausible (finite but
    # huge values would otherwise defeat distance-based rules).
    max_update_norm: float = Field(default=1e6, gt=0)
    # What any one caller may hold (docs/security.md, "Bounds per caller"). Each
    # connection costs a file descriptor: the coordinator refuses to start when
    # the open-file limit cannot cover max_connections plus its own files.
    max_connections: int = Field(default=2048, ge=8, le=1_000_000)
    # HTTP/2 streams (calls) one connection may have open at once.
    max_streams_per_connection: int = Field(default=16, ge=4, le=1024)
    # Calls in flight in total (long polls included); beyond it gRPC answers
    # RESOURCE_EXHAUSTED before a handler runs.
    max_concurrent_rpcs: int = Field(default=8192, ge=16, le=1_000_000)
    # Calls in flight per enrolled client (a long poll, a download, an upload
    # and a metrics report or secure-aggregation call).
    max_calls_per_client: int = Field(default=4, ge=2, le=64)
    # Challenge/Enroll calls in flight per remote address, and in total: all an
    # outsider can hold. Devices behind one NAT enrol this many at a time.
    max_unauthenticated_per_address: int = Field(default=16, ge=1, le=100_000)
    max_unauthenticated: int = Field(default=256, ge=1, le=1_000_000)
    # A unary request must arrive whole within this (slow senders are cut).
    receive_seconds: float = Field(default=10.0, gt=0, le=300)
    # A TLS/HTTP2 handshake must finish within this.
    handshake_seconds: float = Field(default=10.0, gt=0, le=300)
    # A connection with no call in flight for this long is closed (the SDK
    # reconnects by itself); every connection is closed after max_age (calls in
    # flight then get connection_grace_seconds to finish).
    connection_idle_seconds: float = Field(default=300.0, gt=0, le=86_400)
    connection_max_age_seconds: float = Field(default=3600.0, gt=0, le=30 * 86_400)
    connection_grace_seconds: float = Field(default=300.0, gt=0, le=86_400)
    # An upload holding a decoding slot must average at least this many bytes
    # per second once upload_grace_seconds have passed, so no identity can hold
    # a slot by trickling (each identity has one upload at a time).
    min_upload_bytes_per_second: int = Field(default=32 * 1024, ge=0)
    upload_grace_seconds: float = Field(default=10.0, gt=0, le=3600)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return _host_port(value)

    @model_validator(mode="after")
    def _check(self) -> ServerSection:
        if not self.insecure and self.tls is None:
            # pydantic prefixes the section ("server: ..."), once.
            raise ValueError(
                "set tls.cert/tls.key, or insecure: true to serve plaintext gRPC"
            )
        if self.chunk_bytes > self.max_message_bytes - 64 * 1024:
            raise ValueError(
                "server.chunk_bytes must leave 64 KiB of max_message_bytes "
                "for message framing"
            )
        return self


class ControlSection(Strict):
    """The control API (:mod:`fedplat.control`): operators' calls on a port of
    its own, mutual TLS with certificates from ``operator_ca`` (``fedplat certs
    operator``), the server's own certificate (``server.tls``) on the other side.
    Never plaintext: a run file with ``control`` needs ``server.tls``."""

    address: str = "127.0.0.1:50061"
    operator_ca: str
    # Calls in flight at once, and per operator certificate; beyond them a call
    # is refused (RESOURCE_EXHAUSTED). Operators are few.
    max_concurrent_rpcs: int = Field(default=16, ge=1, le=1024)
    max_calls_per_operator: int = Field(default=4, ge=1, le=64)
    # Calls one certificate may make: a burst, then this many per second.
    calls_per_second: float = Field(default=1.0, gt=0, le=1000)
    calls_burst: int = Field(default=60, ge=1, le=100_000)
    # Connections at once (each a file descriptor, counted in the open-file
    # headroom), a TLS handshake's time, and a request's time to arrive.
    max_connections: int = Field(default=64, ge=1, le=10_000)
    handshake_seconds: float = Field(default=10.0, gt=0, le=300)
    receive_seconds: float = Field(default=10.0, gt=0, le=300)
    connection_idle_seconds: float = Field(default=300.0, gt=0, le=86_400)

    @model_validator(mode="after")
    def _slots(self) -> ControlSection:
        if self.max_calls_per_operator > self.max_concurrent_rpcs:
            raise ValueError("max_calls_per_operator must be <= max_concurrent_rpcs")
        return self

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return _host_port(value)


__all__ = ["AdmissionSection", "ControlSection", "MiB", "ServerSection", "TlsSection"]
