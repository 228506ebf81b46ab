"""The ``Peer`` service on ``grpc.aio``: a waiting stream costs no thread.

Every call takes the same path:

1. the connection's certificate must name a member (mutual TLS;
   :meth:`fedplat.gossip.guard.Admission.connection`), else
   ``PERMISSION_DENIED`` before anything is read;
2. a slot (:class:`~fedplat.transport.limits.StreamSlots`: calls in flight per
   caller and in total), else ``RESOURCE_EXHAUSTED``;
3. the request, parsed by a deserializer that never raises
   (:func:`fedplat.proto.streams.parse_or_malformed`): bytes that do not parse
   are ``INVALID_ARGUMENT`` with a reason, not gRPC's logged traceback; a data
   chunk arrives as a view of the received bytes;
4. the message's admission (membership, identity, signature, freshness);
5. the node's handler (:mod:`fedplat.gossip.inbound`), run in a small thread
   pool so the event loop never waits for the model's lock or a decode.

A pushed model's chunks are read one at a time with an idle timeout and an
overall deadline, and land in a buffer preallocated from the declared size
(already bounded by the layout), hashed as they arrive; a pulled model's chunks
are written under the same timeouts. A refusal is one status code with a
reason, counted, and logged at most once per kind per interval.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio

from fedplat.gossip.tls import PeerTls, caller_certificate
from fedplat.proto import peer_pb2 as pb
from fedplat.proto import peer_serde as serde
from fedplat.proto.streams import BodyBuffer, Malformed, parse_chunk, parse_or_malformed
from fedplat.protocol.errors import FedplatError, InvalidArgument, ResourceExhausted
from fedplat.transport.limits import StreamSlots
from fedplat.transport.status import status_of

if TYPE_CHECKING:
    from fedplat.gossip.node import PeerNode

__all__ = ["SERVICE", "PeerServer", "PeerService"]

log = logging.getLogger("fedplat.gossip.grpc")
T = TypeVar("T")
SERVICE = "fedplat.gossip.v1.Peer"
#: How long starting (binding, serving) the peer's gRPC server may take.
START_SECONDS = 60.0


def _parsed(msg: Any) -> Any:
    if isinstance(msg, Malformed):
        raise InvalidArgument(msg.reason)
    return msg


def _data(chunk: Any) -> bytes | memoryview:
    """A model stream's data chunk (a view of the received bytes, when the
    deserializer could take it without parsing)."""
    if isinstance(chunk, memoryview):
        return chunk
    return serde.model_data(_parsed(chunk))


def _caller(context: grpc.aio.ServicerContext, cert_name: str | None) -> str:
    """Who a call counts against: its certificate's name, or its connection."""
    return f"node {cert_name}" if cert_name else str(context.peer())


class PeerService:
    """The handlers of one peer's ``Peer`` service (see the module docstring)."""

    def __init__(self, node: PeerNode, executor: ThreadPoolExecutor) -> None:
        cfg = node.config
        self.node = node
        self.slots = StreamSlots(cfg.max_calls_per_caller, cfg.max_calls)
        self.executor = executor
        self.idle_s = cfg.stream_idle_s
        self.deadline_s = cfg.stream_deadline_s

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Any, req: Any, resp: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn, partial(parse_or_malformed, req), resp.SerializeToString
            )

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Hello": unary(self.hello, pb.HelloRequest, pb.HelloResponse),
                "Ping": unary(self.ping, pb.PingRequest, pb.PingResponse),
                "GetStatus": unary(self.status, pb.StatusRequest, pb.StatusResponse),
                "PushModel": grpc.stream_unary_rpc_method_handler(
                    self.push_model,
                    partial(parse_chunk, pb.ModelChunk),
                    pb.PushAck.SerializeToString,
                ),
                "PullModel": grpc.unary_stream_rpc_method_handler(
                    self.pull_model,
                    partial(parse_or_malformed, pb.PullRequest),
                    pb.ModelChunk.SerializeToString,
                ),
            },
        )

    # ------------------------------------------------------------ plumbing
    async def _guard(
        self,
        rpc: str,
        context: grpc.aio.ServicerContext,
        body: Callable[[], Awaitable[T]],
    ) -> T:
        cert = caller_certificate(context)
        caller = _caller(context, cert.common_name if cert else None)
        try:
            self.node.admission.connection(cert)
            with self.slots.hold(caller):
                return await body()
        except FedplatError as exc:
            self.node.refusals.refuse(f"{rpc}:{exc.code}", exc.reason, caller)
            if rpc == "push":
                self.node.inbound.reject(exc.reason)
            await context.abort(status_of(exc), exc.reason)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception:
            # A bug must not take the peer down; the caller sees INTERNAL.
            log.exception("%s failed", rpc)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {rpc}")
        raise AssertionError("unreachable")  # context.abort raises

    async def _work(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, fn, *args)

    def _wait(self, deadline: float, what: str) -> float:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise ResourceExhausted(
                f"{what} lasted longer than the {self.deadline_s:g} s limit"
            )
        return min(self.idle_s, left)

    async def _read(self, context: grpc.aio.ServicerContext, deadline: float) -> Any:
        wait = self._wait(deadline, "model stream")
        try:
            return await asyncio.wait_for(context.read(), wait)
        except TimeoutError:
            raise ResourceExhausted(
                f"model stream sent nothing for {wait:.3g} s (idle limit "
                f"{self.idle_s:g} s, stream limit {self.deadline_s:g} s)"
            ) from None

    async def _write(
        self, context: grpc.aio.ServicerContext, msg: Any, deadline: float
    ) -> None:
        wait = self._wait(deadline, "model download")
        try:
            await asyncio.wait_for(context.write(msg), wait)
        except TimeoutError:
            raise ResourceExhausted(
                f"model download took nothing for {wait:.3g} s"
            ) from None

    # ------------------------------------------------------------ calls
    async def hello(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> pb.HelloResponse:
        async def body() -> pb.HelloResponse:
            h = serde.hello_from_proto(_parsed(request))
            member = self.node.admission.hello(h, caller_certificate(context))
            reply = await self._work(self.node.inbound.on_hello, h, member)
            return serde.hello_reply_to_proto(reply)

        return await self._guard("hello", context, body)

    async def ping(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> pb.PingResponse:
        async def body() -> pb.PingResponse:
            c = serde.call_from_proto(_parsed(request).auth)
            member = self.node.admission.call("ping", c, caller_certificate(context))
            reply = await self._work(self.node.inbound.on_ping, c, member)
            return serde.ping_reply_to_proto(reply)

        return await self._guard("ping", context, body)

    async def status(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        async def body() -> pb.StatusResponse:
            c = serde.call_from_proto(_parsed(request).auth)
            self.node.admission.call("status", c, caller_certificate(context))
            return serde.status_to_proto(await self._work(self.node.inbound.status))

        return await self._guard("status", context, body)

    async def push_model(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> pb.PushAck:
        async def body() -> pb.PushAck:
            node = self.node
            deadline = asyncio.get_running_loop().time() + self.deadline_s
            first = await self._read(context, deadline)
            if first is grpc.aio.EOF or isinstance(first, memoryview):
                raise InvalidArgument("model stream must start with a header")
            h = serde.first_model_header(_parsed(first))
            cert = caller_certificate(context)
            node.admission.model(h, cert, h.layout.fingerprint())
            node.inbound.check_push(h)
            buf = BodyBuffer(h.total_bytes, h.sha256, "model")
            while (chunk := await self._read(context, deadline)) is not grpc.aio.EOF:
                buf.add(_data(chunk))
            reply = await self._work(node.inbound.on_push, h, buf.finish())
            node.admission.accepted_model(h.sender_id, h.round)
            return serde.push_reply_to_proto(reply)

        return await self._guard("push", context, body)

    async def pull_model(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        async def body() -> None:
            node = self.node
            deadline = asyncio.get_running_loop().time() + self.deadline_s
            c = serde.call_from_proto(_parsed(request).auth)
            member = node.admission.call("pull", c, caller_certificate(context))
            msg = await self._work(node.inbound.on_pull, c, member)
            for chunk in serde.model_to_chunks(msg, node.config.chunk_bytes):
                await self._write(context, chunk, deadline)

        await self._guard("pull", context, body)


class PeerServer:
    """A ``grpc.aio`` server for one :class:`PeerService`, on its own event loop
    thread, so the peer's training loop and its serving never share a thread.

    Parameters
    ----------
    service : PeerService
    listen : str
        ``host:port`` (port 0: any free port; :attr:`port` tells which).
    tls : PeerTls, optional
        ``None`` only for an explicitly insecure peer.
    options : sequence of (str, value)
        gRPC server options (message size limits, ...).

    gRPC's own cap on calls in flight (``maximum_concurrent_rpcs``) is left
    unset on purpose: it counts calls whose request has not arrived yet, so a
    member holding that many open would lock everyone out. The service's
    per-caller slots bound the calls it works on; connections are recycled
    after ``grpc.max_connection_age_ms``, which bounds how long any stream can
    be held open at all.
    """

    def __init__(
        self,
        service: PeerService,
        listen: str,
        tls: PeerTls | None,
        options: Sequence[tuple[str, Any]],
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"aio-{listen}", daemon=True
        )
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self._stop_lock = threading.Lock()
        try:
            self.port = self._call(self._bind(service, listen, tls, options))
        except Exception:
            self._end_loop()
            raise

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        timeout = START_SECONDS if timeout is None else timeout
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise OSError(
                f"the peer's gRPC server did not answer within {timeout:g} s "
                "(an overloaded host?)"
            ) from None

    async def _bind(
        self,
        service: PeerService,
        listen: str,
        tls: PeerTls | None,
        options: Sequence[tuple[str, Any]],
    ) -> int:
        server = grpc.aio.server(options=list(options))
        server.add_generic_rpc_handlers((service.handler(),))
        try:
            if tls is None:
                port = server.add_insecure_port(listen)
            else:
                port = server.add_secure_port(listen, tls.server_credentials())
        except RuntimeError as exc:
            raise OSError(f"cannot bind {listen}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot bind {listen}")
        self._server = server
        return int(port)

    def start(self) -> None:
        assert self._server is not None
        self._call(self._server.start())

    def stop(self, grace: float = 0.5) -> None:
        """Stop serving (in-flight calls get ``grace`` seconds) and end the loop.

        Safe to call again (a peer stopped from outside stops again when its
        run ends)."""
        with self._stop_lock:
            server, self._server = self._server, None
        if server is None:
            return
        try:
            self._call(server.stop(grace), timeout=grace + 5.0)
        finally:
            self._end_loop()

    def _end_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        if not self._loop.is_running():
            self._loop.close()
