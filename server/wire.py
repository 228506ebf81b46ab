"""What one caller may cost the coordinator's gRPC server, decided before parsing.

The bounds (``ServerSection``; docs/security.md, "Bounds per caller"):

- **Connections**: at most ``max_connections`` (gRPC refuses the rest at accept),
  each with at most ``max_streams_per_connection`` calls; a TLS/HTTP2 handshake
  must finish within ``handshake_seconds``; a connection without a call for
  ``connection_idle_seconds`` is closed, and any connection after
  ``connection_max_age_seconds``. Calls in flight in total: ``max_concurrent_rpcs``.
  :func:`check_fd_headroom` makes sure the process can open that many sockets
  and still write its checkpoints and store.
- **Messages**: every method has its own size bound (:class:`MessageLimits`),
  checked on the raw bytes before protobuf parses them (an Enroll's layout is
  bounded by the run's own layout); unary requests are served as one-message
  streams, so a request that does not arrive whole within ``receive_seconds``
  is cut (:func:`read_one`) instead of holding its stream.
- **Callers**: calls in flight per enrolled client (``max_calls_per_client``), and
  unauthenticated calls (Challenge, Enroll) per remote address and in total
  (:class:`~fedplat.transport.limits.StreamSlots`).

The health service is served through the same safe deserializer
(:func:`health_handler`): malformed bytes are INVALID_ARGUMENT, never a traceback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
from collections.abc import Callable
from typing import Any

import grpc
from fedplat.server.config import ConfigError, ControlSection, ServerSection
from grpc_health.v1 import health, health_pb2

from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto.streams import Malformed, parse_chunk, parse_or_malformed
from fedplat.protocol.errors import FedplatError, ResourceExhausted
from fedplat.transport.limits import StreamSlots, read_one
from fedplat.transport.status import status_of

log = logging.getLogger("fedplat.server.grpc")

KiB = 1024
#: Files the coordinator opens besides its connections: the store's pool,
#: checkpoints being written and renamed, logs, evaluation data, gRPC's own
#: pipes and epoll descriptors, Python's imports.
FD_RESERVE = 256
#: Bounds of the small requests (a task id, a client id, a wait time).
SMALL_REQUEST_BYTES = 1 * KiB
#: A metrics report: at most 64 metrics of 64-character names and doubles.
METRICS_REQUEST_BYTES = 16 * KiB
#: An Enroll besides its layout: name, info (64 items), key, challenge,
#: signature, token.
ENROLL_FIXED_BYTES = 48 * KiB


def grpc_options(s: ServerSection) -> list[tuple[str, int]]:
    """The coordinator's gRPC server options (the bounds of the module docstring)."""
    ms = 1000
    return [
        ("grpc.max_send_message_length", s.max_message_bytes),
        ("grpc.max_receive_message_length", s.max_message_bytes),
        ("grpc.so_reuseport", 0),
        # A client must answer keepalive pings; dead peers are dropped.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        # A fixed receive window per stream (ServerSection.stream_window_bytes).
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", s.stream_window_bytes),
        ("grpc.max_allowed_incoming_connections", s.max_connections),
        ("grpc.max_concurrent_streams", s.max_streams_per_connection),
        ("grpc.server_handshake_timeout_ms", int(s.handshake_seconds * ms)),
        ("grpc.max_connection_idle_ms", int(s.connection_idle_seconds * ms)),
        ("grpc.max_connection_age_ms", int(s.connection_max_age_seconds * ms)),
        ("grpc.max_connection_age_grace_ms", int(s.connection_grace_seconds * ms)),
        ("grpc.max_metadata_size", 8 * KiB),
    ]


def control_options(c: ControlSection) -> list[tuple[str, int]]:
    """The control API server's options: small requests, few connections and
    streams, handshakes and idle connections cut (docs/control.md, "Bounds")."""
    ms = 1000
    return [
        ("grpc.max_receive_message_length", 64 * KiB),
        ("grpc.max_send_message_length", 16 * 1024 * KiB),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.max_allowed_incoming_connections", c.max_connections),
        ("grpc.max_concurrent_streams", c.max_calls_per_operator),
        ("grpc.server_handshake_timeout_ms", int(c.handshake_seconds * ms)),
        ("grpc.max_connection_idle_ms", int(c.connection_idle_seconds * ms)),
        ("grpc.max_connection_age_ms", 3600 * ms),
        ("grpc.max_connection_age_grace_ms", 60 * ms),
        ("grpc.max_metadata_size", 8 * KiB),
    ]


def fd_limit_needed(s: ServerSection, control: ControlSection | None = None) -> int:
    """File descriptors the caps need: one per connection (the device API's and
    the control API's), plus our own files."""
    extra = control.max_connections if control is not None else 0
    return s.max_connections + extra + FD_RESERVE


def check_fd_headroom(s: ServerSection, control: ControlSection | None = None) -> int:
    """Raise the soft open-file limit to cover the caps (up to the hard limit);
    ConfigError when even the hard limit cannot. Returns the soft limit.

    With the connection cap below the limit, a flood of connections is refused
    at accept and never takes the descriptors a checkpoint or the store needs.
    """
    need = fd_limit_needed(s, control)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        extra = need - s.max_connections - FD_RESERVE
        fits = max(0, soft - FD_RESERVE - extra)
        also = f" (+ control.max_connections {extra})" if extra else ""
        raise ConfigError(
            f"the open-file limit is {soft} (ulimit -n); server.max_connections "
            f"{s.max_connections}{also} needs {need}: raise the limit, or set "
            f"server.max_connections to at most {fits}"
        )
    return int(soft)


def _round_up_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class MessageLimits:
    """Per-method bounds on a request's serialized size.

    An Enroll or an upload header carries a layout: honest devices send the
    run's own, so the bound is the run's layout message with room to spare,
    rounded up to a power of two (a refusal tells an outsider nothing finer).
    """

    def __init__(self, s: ServerSection, layout: common.Layout) -> None:
        own = layout.ByteSize()
        self.layout_bytes = _round_up_pow2(2 * own + 4 * KiB)
        self.enroll = ENROLL_FIXED_BYTES + self.layout_bytes
        self.by_method = {
            "Challenge": SMALL_REQUEST_BYTES,
            "Enroll": self.enroll,
            "GetTask": SMALL_REQUEST_BYTES,
            "DownloadModel": SMALL_REQUEST_BYTES,
            "ReportMetrics": METRICS_REQUEST_BYTES,
            "SecAgg": s.max_message_bytes,
        }

    def update_chunk_parser(self) -> Callable[[bytes], Any]:
        """UploadUpdate's: data chunks as views, a header bounded like an
        Enroll (it carries the layout and the client's metrics)."""

        def parse(raw: bytes) -> Any:
            return parse_chunk(pb.UpdateChunk, raw, self.enroll)

        return parse

    def deserializer(self, method: str, cls: Any) -> Callable[[bytes], Any]:
        """Parse ``cls`` from raw bytes, or :class:`Malformed` (too large, or not
        a ``cls``): the handler answers INVALID_ARGUMENT, gRPC logs nothing."""
        return bounded_parser(cls, self.by_method[method], method)


def bounded_parser(cls: Any, limit: int, what: str) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        if len(raw) > limit:
            return Malformed(
                f"{what} request of {len(raw)} bytes exceeds its {limit}-byte bound",
                len(raw),
            )
        return parse_or_malformed(cls, raw)

    return parse


def peer_address(context: grpc.aio.ServicerContext) -> str:
    """The caller's address for per-address caps: the host of an IPv4 peer
    (``ipv4:1.2.3.4:5678`` -> ``ipv4:1.2.3.4``), the /64 of an IPv6 one (one
    host can draw on a whole /64, so that is what one caller holds)."""
    return address_key(context.peer() or "unknown")


def address_key(peer: str) -> str:
    """:func:`peer_address` of gRPC's peer string."""
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        return peer
    if host.startswith("ipv6:"):
        try:
            ip = ipaddress.IPv6Address(host[5:].strip("[]").split("%")[0])
        except ValueError:
            return host
        if ip.ipv4_mapped is not None:
            return f"ipv4:{ip.ipv4_mapped}"
        return f"ipv6:{ipaddress.IPv6Network((ip, 64), strict=False)}"
    return host


#: How long one Health.Watch stream may last (a watcher reconnects after it).
MAX_WATCH_SECONDS = 60.0


def health_handler(
    servicer: health.aio.HealthServicer,
    slots: StreamSlots,
    watch_seconds: float = MAX_WATCH_SECONDS,
) -> grpc.GenericRpcHandler:
    """``grpc.health.v1.Health`` with bounded, safe parsing (module docstring).

    Anyone may ask, so each call holds one of ``slots`` (the unauthenticated
    calls' per-address and total caps, shared with Challenge and Enroll), and a
    Watch ends after ``watch_seconds``: no caller can hold call slots, or the
    memory of streams it keeps sending on, for longer than that."""
    parse = bounded_parser(health_pb2.HealthCheckRequest, SMALL_REQUEST_BYTES, "Health")

    async def refuse(context: grpc.aio.ServicerContext, exc: FedplatError) -> None:
        await context.abort(status_of(exc), exc.reason)

    async def check(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        try:
            with slots.hold(peer_address(context)):
                return await servicer.Check(request, context)
        except ResourceExhausted as exc:
            await refuse(context, exc)

    async def watch(request: Any, context: grpc.aio.ServicerContext) -> None:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        try:
            with slots.hold(peer_address(context)):
                # Writes through context.write until the deadline, then ends.
                await asyncio.wait_for(servicer.Watch(request, context), watch_seconds)
        except TimeoutError:
            return
        except ResourceExhausted as exc:
            await refuse(context, exc)

    def out(msg: Any) -> bytes:
        return bytes(msg.SerializeToString())

    return grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health",
        {
            "Check": grpc.unary_unary_rpc_method_handler(check, parse, out),
            "Watch": grpc.unary_stream_rpc_method_handler(watch, parse, out),
        },
    )


__all__ = [
    "FD_RESERVE",
    "MAX_WATCH_SECONDS",
    "MessageLimits",
    "address_key",
    "bounded_parser",
    "check_fd_headroom",
    "control_options",
    "fd_limit_needed",
    "grpc_options",
    "health_handler",
    "peer_address",
    "read_one",
]
