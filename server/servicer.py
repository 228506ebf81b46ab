"""The coordinator's gRPC servicer (``grpc.aio``): thin, bounded, never INTERNAL.

Every call is bounded before its body is parsed (:mod:`fedplat.server.wire`):
unary requests are served as one-message streams, so credentials in metadata
are checked first and a request must arrive whole within ``receive_seconds``;
each method's request has a size bound checked on the raw bytes; an enrolled
client has at most ``max_calls_per_client`` calls in flight, and unauthenticated
calls (Challenge, Enroll) are capped per remote address and in total. Domain
errors map to status codes (:mod:`fedplat.transport.status`); refusals are
stored as events by the recorder (bounded) and logged at most once per kind
per interval. Anything that may block (store writes, hashing and decoding large
chunks) runs in the executor, never on the event loop; a waiting client (a long
poll) is a coroutine, not a thread. Uploads hold a decoding slot only while
they keep up ``min_upload_bytes_per_second``.

Downloads are serialized once per model version and sent as pre-serialized
messages; upload data chunks arrive as views of the received bytes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
from fedplat.server.coordinator import Coordinator
from fedplat.server.registry import ClientState, PeerIdentity
from fedplat.server.waiting import run_async
from fedplat.server.wire import MessageLimits, peer_address, read_one

from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import serde, streams
from fedplat.proto.streams import GRPC_FRAME_BYTES, Malformed
from fedplat.protocol.errors import (
    FedplatError,
    InvalidArgument,
    ResourceExhausted,
    Unauthenticated,
)
from fedplat.protocol.messages import is_client_id
from fedplat.transport.grpc import CLIENT_ID_KEY, TOKEN_KEY
from fedplat.transport.limits import RefusalLog, StreamSlots
from fedplat.transport.status import status_of

log = logging.getLogger("fedplat.server.grpc")
SERVICE = "fedplat.v1.Coordinator"
T = TypeVar("T")
#: Longest session token accepted in metadata (issued ones are 43 characters).
MAX_TOKEN_LEN = 256


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, Any]:
    return dict(context.invocation_metadata() or ())


def _creds(context: grpc.aio.ServicerContext) -> tuple[str, str]:
    """The caller's client id and session token from metadata, well-formed or
    UNAUTHENTICATED (checked before anything else reads them)."""
    md = _metadata(context)
    cid, tok = md.get(CLIENT_ID_KEY, ""), md.get(TOKEN_KEY, "")
    if not is_client_id(cid) or not isinstance(tok, str) or len(tok) > MAX_TOKEN_LEN:
        raise Unauthenticated("missing or malformed credentials metadata")
    return cid, tok


def _peer(context: grpc.aio.ServicerContext) -> PeerIdentity:
    auth = context.auth_context() or {}
    certs = auth.get("x509_pem_cert") or []
    return PeerIdentity(certs[0] if certs else None)


class _ModelMessages:
    """The serialized download stream of the current model version."""

    def __init__(self) -> None:
        self.version = -1
        self.messages: list[bytes] = []
        self._lock = asyncio.Lock()

    async def get(self, coord: Coordinator, chunk: int) -> list[bytes]:
        payload = coord.ctx.model.current()
        async with self._lock:
            if payload.model_version != self.version:
                self.messages = await asyncio.to_thread(
                    streams.model_messages, payload, chunk
                )
                self.version = payload.model_version
            return self.messages


class CoordinatorServicer:
    """Handlers of ``fedplat.v1.Coordinator`` (see the module docstring)."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        s = coord.cfg.server
        self.cfg = s
        self.idle = s.stream_idle_seconds
        self.chunk = s.chunk_bytes
        self.long_poll = s.long_poll_seconds
        self.max_tensors = len(coord.ctx.layout.specs)
        self.limits = MessageLimits(s, serde.layout_to_proto(coord.ctx.layout))
        self._uploads = asyncio.Semaphore(s.max_concurrent_uploads)
        self._model = _ModelMessages()
        self._per_client = StreamSlots(s.max_calls_per_client, s.max_concurrent_rpcs)
        self.outsiders = StreamSlots(
            min(s.max_unauthenticated_per_address, s.max_unauthenticated),
            s.max_unauthenticated,
        )
        self._refusals = RefusalLog(log)

    # ---------------------------------------------------------------- plumbing
    async def _guard(
        self,
        rpc: str,
        context: grpc.aio.ServicerContext,
        fn: Callable[[], Awaitable[T]],
    ) -> T:
        try:
            return await fn()
        except FedplatError as exc:
            self._refused(rpc, context, exc)
            await context.abort(status_of(exc), exc.reason)
        except grpc.aio.AbortError:
            raise
        except BaseException:
            if context.cancelled() or context.done():
                # The caller went away (closed its channel, timed out) while we
                # were answering: nothing to report to it, nothing went wrong here.
                log.debug("%s: the client cancelled the call", rpc)
                raise asyncio.CancelledError from None
            if not isinstance(sys.exc_info()[1], Exception):
                raise
            # A bug must not take the coordinator down; the client sees INTERNAL.
            log.exception("%s failed", rpc)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {rpc}")
        raise AssertionError("unreachable")

    def _refused(
        self, rpc: str, context: grpc.aio.ServicerContext, exc: FedplatError
    ) -> None:
        """Log (sampled) and record (bounded by the recorder) one refusal. The
        event names a client only when the id is one of this run's clients."""
        self._refusals.refuse(
            f"{rpc}:{exc.code}", exc.reason[:200], peer_address(context)
        )
        if exc.recorded:
            return
        cid = _metadata(context).get(CLIENT_ID_KEY)
        if not is_client_id(cid) or self.coord.registry.get(cid) is None:
            cid = None  # an event names a client only if it is one of the run's
        self.coord.reject(f"{rpc.lower()}_refused", exc.reason, cid)

    def _auth(self, context: grpc.aio.ServicerContext) -> ClientState:
        cid, tok = _creds(context)
        return self.coord.registry.authenticate(cid, tok, _peer(context))

    @contextmanager
    def _client_call(self, context: grpc.aio.ServicerContext) -> Iterator[ClientState]:
        """The authenticated caller, holding one of its call slots."""
        c = self._auth(context)
        with self._per_client.hold(c.client_id):
            yield c

    @contextmanager
    def _outsider_call(self, context: grpc.aio.ServicerContext) -> Iterator[None]:
        with self.outsiders.hold(peer_address(context)):
            yield

    async def _request(self, it: AsyncIterator[Any], rpc: str) -> Any:
        return await read_one(it, self.cfg.receive_seconds, rpc)

    # ---------------------------------------------------------------- unary
    async def Challenge(self, it: AsyncIterator[Any], context: Any) -> Any:
        async def run() -> pb.ChallengeResponse:
            with self._outsider_call(context):
                req = await self._request(it, "Challenge")
                cid = serde.challenge_request_from_proto(req)
                return serde.challenge_to_proto(self.coord.challenge(cid))

        return await self._guard("Challenge", context, run)

    async def Enroll(self, it: AsyncIterator[Any], context: Any) -> Any:
        async def run() -> pb.EnrollResponse:
            with self._outsider_call(context):
                msg = await self._request(it, "Enroll")
                # A generic tensor cap (the size bound already limits it): the
                # run's own count would tell a caller without a token its layout.
                req = serde.enroll_request_from_proto(msg)
                e = await asyncio.to_thread(self.coord.enroll, req, _peer(context))
                return serde.enrollment_to_proto(e)

        return await self._guard("Enroll", context, run)

    async def GetTask(self, it: AsyncIterator[Any], context: Any) -> Any:
        async def run() -> pb.Task:
            with self._client_call(context) as c:
                req = await self._request(it, "GetTask")
                poll = self.coord.task_poll(c, req.wait_seconds)
                return serde.task_to_proto(await run_async(poll))

        return await self._guard("GetTask", context, run)

    async def ReportMetrics(self, it: AsyncIterator[Any], context: Any) -> Any:
        async def run() -> pb.MetricsAck:
            with self._client_call(context) as c:
                msg = await self._request(it, "ReportMetrics")
                task_id, rnd, metrics = serde.metrics_from_proto(msg)
                self.coord.record_metrics(c, task_id, rnd, metrics)
                return pb.MetricsAck(accepted=True)

        return await self._guard("ReportMetrics", context, run)

    async def SecAgg(self, it: AsyncIterator[Any], context: Any) -> Any:
        async def run() -> pb.SecAggReply:
            with self._client_call(context) as c:
                msg = await self._request(it, "SecAgg")
                req = serde.secagg_request_from_proto(msg)
                return await self._secagg(c, req)

        return await self._guard("SecAgg", context, run)

    async def _secagg(self, c: ClientState, req: Any) -> pb.SecAggReply:
        # The caller's own step (signature, protocol message) off the event
        # loop; then the long poll (cheap steps) as a coroutine.
        woken = self.coord.board.signal.wakeup()
        first = await asyncio.to_thread(self.coord.secagg_step, c, req)
        reply = await run_async(self.coord.secagg_poll(c, req, (woken, first)))
        return serde.secagg_reply_to_proto(reply)

    # ---------------------------------------------------------------- download
    async def DownloadModel(self, it: AsyncIterator[Any], context: Any) -> None:
        async def run() -> None:
            with self._client_call(context) as c:
                req = await self._request(it, "DownloadModel")
                with self.coord.registry.slot(c, "download"):
                    await self._download(c, req.task_id, context)

        await self._guard("DownloadModel", context, run)

    async def _download(self, c: ClientState, task_id: str, context: Any) -> None:
        _, sent = self.coord.begin_download(c, task_id)
        messages = await self._model.get(self.coord, self.chunk)
        total = 0
        try:
            for m in messages:
                await asyncio.wait_for(context.write(m), self.idle)
                total += len(m) + GRPC_FRAME_BYTES
        except TimeoutError:
            raise ResourceExhausted(f"download stalled for {self.idle:.0f} s") from None
        finally:
            sent(total)

    # ---------------------------------------------------------------- upload
    async def UploadUpdate(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> Any:
        async def run() -> pb.UploadAck:
            # Authenticated before a byte of the stream is read.
            with (
                self._client_call(context) as c,
                self.coord.registry.slot(c, "upload"),
            ):
                return await self._upload(c, request_iterator)

        return await self._guard("UploadUpdate", context, run)

    async def _next(self, it: AsyncIterator[Any], deadline: float, why: str) -> Any:
        """The stream's next message by ``deadline`` (monotonic), or the upload
        is cut with ``why`` (the round's end, idleness or a too-slow sender)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise ResourceExhausted(why)
        try:
            return await asyncio.wait_for(anext(it), left)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise ResourceExhausted(why) from None

    async def _upload(self, c: ClientState, it: AsyncIterator[Any]) -> pb.UploadAck:
        r = self.coord.board.round
        limit = r.deadline if r is not None else time.time() + self.idle
        end = time.monotonic() + max(self.idle, limit - time.time() + self.idle)
        first = await self._next(
            it, min(end, time.monotonic() + self.idle), "upload sent no header"
        )
        first = self._parsed(first)
        if (
            not isinstance(first, pb.UpdateChunk)
            or first.WhichOneof("part") != "header"
        ):
            raise InvalidArgument("update stream must start with a header")
        header = streams.update_header_from_proto(first.header, self.max_tensors)
        up = self.coord.begin_upload(c, header)
        up.wire_bytes = first.ByteSize() + GRPC_FRAME_BYTES
        try:
            async with self._uploads:
                up.start()
                await self._receive(up, it, end)
                ack = await asyncio.to_thread(up.finish)
        except BaseException as exc:
            failure = exc if isinstance(exc, FedplatError) else None
            # In a thread, and shielded: a cancelled call's worker may still be
            # writing or committing the row, and fail() waits for it.
            await asyncio.shield(
                asyncio.to_thread(
                    up.fail, failure or InvalidArgument("upload interrupted")
                )
            )
            raise
        return serde.upload_ack_to_proto(ack)

    async def _receive(self, up: Any, it: AsyncIterator[Any], end: float) -> None:
        """Data chunks into the upload while it holds a decoding slot: each by
        the stream's idle limit, the round's end, and the minimum rate."""
        started, received = time.monotonic(), 0
        rate, grace = (
            self.cfg.min_upload_bytes_per_second,
            self.cfg.upload_grace_seconds,
        )
        while True:
            now = time.monotonic()
            deadline, why = end, "upload took longer than the round allows"
            if now + self.idle < deadline:
                deadline, why = now + self.idle, f"upload idle for {self.idle:.0f} s"
            if rate > 0 and started + grace + received / rate < deadline:
                deadline = started + grace + received / rate
                why = f"upload slower than {rate} bytes/s while holding a slot"
            part = self._parsed(await self._next(it, deadline, why))
            if part is None:
                return
            if not isinstance(part, memoryview):
                raise InvalidArgument("update stream has a second header")
            received += len(part)
            size = streams.data_message_size(len(part))
            up.wire_bytes += size + GRPC_FRAME_BYTES
            await asyncio.to_thread(up.write, part)

    @staticmethod
    def _parsed(msg: Any) -> Any:
        if isinstance(msg, Malformed):
            raise InvalidArgument(msg.reason)
        return msg

    # ---------------------------------------------------------------- wiring
    def handler(self) -> grpc.GenericRpcHandler:
        """Every method served as a client stream (unary calls are one-message
        streams on the wire), so no request is read before its bounds apply."""

        def out(msg: Any) -> bytes:
            # Pre-serialized download messages pass through as they are.
            return msg if isinstance(msg, bytes) else msg.SerializeToString()

        lim = self.limits
        unary = {
            "Challenge": (self.Challenge, pb.ChallengeRequest),
            "Enroll": (self.Enroll, pb.EnrollRequest),
            "GetTask": (self.GetTask, pb.GetTaskRequest),
            "ReportMetrics": (self.ReportMetrics, pb.MetricsReport),
            "SecAgg": (self.SecAgg, pb.SecAggRequest),
        }
        handlers = {
            name: grpc.stream_unary_rpc_method_handler(
                fn, lim.deserializer(name, cls), out
            )
            for name, (fn, cls) in unary.items()
        }
        handlers["DownloadModel"] = grpc.stream_stream_rpc_method_handler(
            self.DownloadModel,
            lim.deserializer("DownloadModel", pb.DownloadRequest),
            out,
        )
        handlers["UploadUpdate"] = grpc.stream_unary_rpc_method_handler(
            self.UploadUpdate, lim.update_chunk_parser(), out
        )
        return grpc.method_handlers_generic_handler(SERVICE, handlers)


__all__ = ["SERVICE", "CoordinatorServicer"]
