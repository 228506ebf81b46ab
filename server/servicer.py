"""The coordinator's gRPC servicer (``grpc.aio``): thin, bounded, never INTERNAL.

Every call authenticates from metadata before reading a body, maps domain errors
to status codes (:mod:`fedplat.transport.status`) with one log line, and runs
anything that may block (store writes, hashing and decoding large chunks) in the
executor, never on the event loop. A waiting client (a long poll) is a coroutine,
not a thread. Streams have an idle timeout and an overall deadline; messages
that do not parse are answered INVALID_ARGUMENT by the handler itself (the
request deserializers return :class:`~fedplat.proto.streams.Malformed` instead of
raising), so gRPC never logs a traceback for hostile bytes.

Downloads are serialized once per model version and sent as pre-serialized
messages; upload data chunks arrive as views of the received bytes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import grpc
from fedplat.server.coordinator import Coordinator
from fedplat.server.registry import ClientState, PeerIdentity

from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import serde, streams
from fedplat.proto.streams import GRPC_FRAME_BYTES, Malformed
from fedplat.transport.errors import (
    FedplatError,
    InvalidArgument,
    ResourceExhausted,
    Unauthenticated,
)
from fedplat.transport.grpc import CLIENT_ID_KEY, TOKEN_KEY
from fedplat.transport.messages import SecAggReplyKind, Task
from fedplat.transport.status import status_of

log = logging.getLogger("fedplat.server.grpc")
SERVICE = "fedplat.v1.Coordinator"
T = TypeVar("T")


def _creds(context: grpc.aio.ServicerContext) -> tuple[str, str]:
    md = dict(context.invocation_metadata() or ())
    cid, tok = md.get(CLIENT_ID_KEY, ""), md.get(TOKEN_KEY, "")
    if not isinstance(cid, str) or not isinstance(tok, str) or len(cid) > 64:
        raise Unauthenticated("bad credentials metadata")
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
        self.idle = s.stream_idle_seconds
        self.chunk = s.chunk_bytes
        self.long_poll = s.long_poll_seconds
        self.max_tensors = len(coord.ctx.layout.specs)
        self._uploads = asyncio.Semaphore(s.max_concurrent_uploads)
        self._model = _ModelMessages()

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
            log.info("%s refused (%s): %s", rpc, exc.code, exc.reason[:200])
            if not exc.recorded:
                cid = dict(context.invocation_metadata() or ()).get(CLIENT_ID_KEY)
                self.coord.reject(
                    f"{rpc.lower()}_refused",
                    exc.reason,
                    cid if isinstance(cid, str) and len(cid) <= 64 else None,
                )
            await context.abort(status_of(exc), exc.reason)
        except grpc.aio.AbortError:
            raise
        except BaseException:
            if context.cancelled() or context.done():
                # The caller went away (closed its channel, timed out) while we
                # were answering: nothing to report to it, nothing went wrong here.
                log.info("%s: the client cancelled the call", rpc)
                raise asyncio.CancelledError from None
            if not isinstance(sys.exc_info()[1], Exception):
                raise
            # A bug must not take the coordinator down; the client sees INTERNAL.
            log.exception("%s failed", rpc)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {rpc}")
        raise AssertionError("unreachable")

    def _parsed(self, msg: T | Malformed, rpc: str) -> T:
        if isinstance(msg, Malformed):
            raise InvalidArgument(msg.reason)
        return msg

    def _auth(self, context: grpc.aio.ServicerContext) -> ClientState:
        cid, tok = _creds(context)
        return self.coord.authenticate(cid, tok)

    # ---------------------------------------------------------------- unary
    async def Challenge(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run() -> pb.ChallengeResponse:
            req = self._parsed(request, "Challenge")
            cid = serde.challenge_request_from_proto(req)
            return serde.challenge_to_proto(self.coord.challenge(cid))

        return await self._guard("Challenge", context, run)

    async def Enroll(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run() -> pb.EnrollResponse:
            req = serde.enroll_request_from_proto(
                self._parsed(request, "Enroll"), self.max_tensors
            )
            e = await asyncio.to_thread(self.coord.enroll, req, _peer(context))
            return serde.enrollment_to_proto(e)

        return await self._guard("Enroll", context, run)

    async def GetTask(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run() -> pb.Task:
            req = self._parsed(request, "GetTask")
            c = self._auth(context)
            wait = req.wait_seconds
            wait = max(0.0, min(wait if wait == wait else 0.0, self.long_poll))
            return serde.task_to_proto(await self._wait_task(c, wait))

        return await self._guard("GetTask", context, run)

    async def _wait_task(self, c: ClientState, wait: float) -> Task:
        board = self.coord.board
        end = time.monotonic() + wait
        while True:
            woken = board.waiters.register(c.client_id)
            task = self.coord.task_for(c)
            left = end - time.monotonic()
            if task is not None or left <= 0:
                board.waiters.discard(c.client_id, woken)
                return task if task is not None else self.coord.wait_task()
            await board.waiters.wait(c.client_id, woken, min(left, 5.0))
            self.coord.registry.touch(c)

    async def ReportMetrics(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def run() -> pb.MetricsAck:
            task_id, rnd, metrics = serde.metrics_from_proto(
                self._parsed(request, "ReportMetrics")
            )
            cid, tok = _creds(context)
            await asyncio.to_thread(
                self.coord.report_metrics, cid, tok, task_id, rnd, metrics
            )
            return pb.MetricsAck(accepted=True)

        return await self._guard("ReportMetrics", context, run)

    async def SecAgg(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run() -> pb.SecAggReply:
            req = serde.secagg_request_from_proto(self._parsed(request, "SecAgg"))
            c = self._auth(context)
            wait = min(req.wait_seconds, self.long_poll)
            end = time.monotonic() + wait
            board = self.coord.board
            while True:
                gen = board.signal.gen
                reply = await asyncio.to_thread(self.coord.secagg_step, c, req)
                left = end - time.monotonic()
                if reply.kind is not SecAggReplyKind.WAIT or left <= 0:
                    return serde.secagg_reply_to_proto(reply)
                req = replace(req, message=b"", signature=b"")
                await board.signal.wait_async(gen, min(left, 5.0))

        return await self._guard("SecAgg", context, run)

    # ---------------------------------------------------------------- download
    async def DownloadModel(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> None:
        async def run() -> None:
            req = self._parsed(request, "DownloadModel")
            c = self._auth(context)
            with self.coord.registry.slot(c, "download"):
                _, sent = self.coord.begin_download(c, req.task_id)
                messages = await self._model.get(self.coord, self.chunk)
                total = 0
                try:
                    for m in messages:
                        await asyncio.wait_for(context.write(m), self.idle)
                        total += len(m) + GRPC_FRAME_BYTES
                except TimeoutError:
                    raise ResourceExhausted(
                        f"download stalled for {self.idle:.0f} s"
                    ) from None
                finally:
                    sent(total)

        await self._guard("DownloadModel", context, run)

    # ---------------------------------------------------------------- upload
    async def UploadUpdate(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> Any:
        async def run() -> pb.UploadAck:
            c = self._auth(context)  # before a byte of the stream is read
            with self.coord.registry.slot(c, "upload"):
                return await self._upload(c, request_iterator)

        return await self._guard("UploadUpdate", context, run)

    async def _next(self, it: AsyncIterator[Any], deadline: float) -> Any:
        left = min(self.idle, deadline - time.monotonic())
        if left <= 0:
            raise ResourceExhausted("upload took longer than the round allows")
        try:
            return await asyncio.wait_for(anext(it), left)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise ResourceExhausted(
                f"upload stream idle for {left:.0f} s; closed"
            ) from None

    async def _upload(self, c: ClientState, it: AsyncIterator[Any]) -> pb.UploadAck:
        r = self.coord.board.round
        limit = r.deadline if r is not None else time.time() + self.idle
        deadline = time.monotonic() + max(self.idle, limit - time.time() + self.idle)
        first = self._parsed(await self._next(it, deadline), "UploadUpdate")
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
                while True:
                    part = self._parsed(await self._next(it, deadline), "UploadUpdate")
                    if part is None:
                        break
                    if not isinstance(part, memoryview):
                        raise InvalidArgument("update stream has a second header")
                    size = streams.data_message_size(len(part))
                    up.wire_bytes += size + GRPC_FRAME_BYTES
                    await asyncio.to_thread(up.write, part)
                ack = await asyncio.to_thread(up.finish)
        except FedplatError as exc:
            up.fail(exc)
            raise
        except BaseException:
            up.fail(InvalidArgument("upload interrupted"))
            raise
        return serde.upload_ack_to_proto(ack)

    # ---------------------------------------------------------------- wiring
    def handler(self) -> grpc.GenericRpcHandler:
        def parse(cls: Any) -> Callable[[bytes], Any]:
            return lambda raw: streams.parse_or_malformed(cls, raw)

        def out(msg: Any) -> bytes:
            # Pre-serialized download messages pass through as they are.
            return msg if isinstance(msg, bytes) else msg.SerializeToString()

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Challenge": grpc.unary_unary_rpc_method_handler(
                    self.Challenge, parse(pb.ChallengeRequest), out
                ),
                "Enroll": grpc.unary_unary_rpc_method_handler(
                    self.Enroll, parse(pb.EnrollRequest), out
                ),
                "GetTask": grpc.unary_unary_rpc_method_handler(
                    self.GetTask, parse(pb.GetTaskRequest), out
                ),
                "DownloadModel": grpc.unary_stream_rpc_method_handler(
                    self.DownloadModel, parse(pb.DownloadRequest), out
                ),
                "UploadUpdate": grpc.stream_unary_rpc_method_handler(
                    self.UploadUpdate, streams.parse_update_chunk, out
                ),
                "ReportMetrics": grpc.unary_unary_rpc_method_handler(
                    self.ReportMetrics, parse(pb.MetricsReport), out
                ),
                "SecAgg": grpc.unary_unary_rpc_method_handler(
                    self.SecAgg, parse(pb.SecAggRequest), out
                ),
            },
        )


__all__ = ["SERVICE", "CoordinatorServicer"]
