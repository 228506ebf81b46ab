"""Thin gRPC servicer: authenticate, convert with serde, delegate, map errors."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

import grpc
from fedplat.server.engine import RoundEngine

from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import fedplat_pb2_grpc as pb_grpc
from fedplat.proto import serde
from fedplat.transport.errors import FedplatError, InvalidArgument
from fedplat.transport.grpc import CLIENT_ID_KEY, STATUS_BY_CODE, TOKEN_KEY

log = logging.getLogger("fedplat.server.grpc")
T = TypeVar("T")


def _creds(context: grpc.ServicerContext) -> tuple[str, str]:
    md = dict(context.invocation_metadata())
    return str(md.get(CLIENT_ID_KEY, "")), str(md.get(TOKEN_KEY, ""))


def _abort(context: grpc.ServicerContext, exc: FedplatError) -> NoReturn:
    context.abort(STATUS_BY_CODE.get(exc.code, grpc.StatusCode.INTERNAL), exc.reason)
    raise AssertionError("unreachable")  # context.abort raises


class _CountingIterator:
    """Counts the payload bytes of an upload stream as it is consumed."""

    def __init__(self, it: Iterator[pb.UpdateChunk]) -> None:
        self._it = it
        self.nbytes = 0

    def __iter__(self) -> Iterator[pb.UpdateChunk]:
        for chunk in self._it:
            self.nbytes += len(chunk.data)
            yield chunk


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    def __init__(self, engine: RoundEngine) -> None:
        self.engine = engine
        self.max_update_bytes = engine.cfg.server.max_update_bytes
        self.chunk_bytes = engine.cfg.server.chunk_bytes

    def _guard(self, context: grpc.ServicerContext, rpc: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except FedplatError as exc:
            log.info("%s refused (%s): %s", rpc, exc.code, exc.reason)
            _abort(context, exc)
        except Exception:
            # A bug must not take the coordinator down; the client sees INTERNAL.
            log.exception("%s failed", rpc)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {rpc}")
            raise

    def Enroll(
        self, request: pb.EnrollRequest, context: grpc.ServicerContext
    ) -> pb.EnrollResponse:
        return self._guard(
            context,
            "Enroll",
            lambda: serde.enrollment_to_proto(
                self.engine.enroll(serde.enroll_request_from_proto(request))
            ),
        )

    def GetTask(
        self, request: pb.GetTaskRequest, context: grpc.ServicerContext
    ) -> pb.Task:
        cid, tok = _creds(context)
        return self._guard(
            context,
            "GetTask",
            lambda: serde.task_to_proto(
                self.engine.get_task(cid, tok, request.wait_seconds)
            ),
        )

    def DownloadModel(
        self, request: pb.DownloadRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ModelChunk]:
        cid, tok = _creds(context)
        payload = self._guard(
            context,
            "DownloadModel",
            lambda: self.engine.download_model(cid, tok, request.task_id),
        )
        yield from serde.model_to_chunks(payload, self.chunk_bytes)

    def UploadUpdate(
        self, request_iterator: Iterator[pb.UpdateChunk], context: grpc.ServicerContext
    ) -> pb.UploadAck:
        cid, tok = _creds(context)

        def handle() -> pb.UploadAck:
            # Authenticate before reading the (possibly large) body.
            self.engine.authenticate(cid, tok)
            counted = _CountingIterator(request_iterator)
            try:
                header, data = serde.update_from_chunks(
                    iter(counted), self.max_update_bytes
                )
            except InvalidArgument as exc:
                self.engine.reject_upload(cid, exc.reason, counted.nbytes)
                raise
            return serde.upload_ack_to_proto(
                self.engine.upload_update(cid, tok, header, data)
            )

        return self._guard(context, "UploadUpdate", handle)

    def ReportMetrics(
        self, request: pb.MetricsReport, context: grpc.ServicerContext
    ) -> pb.MetricsAck:
        cid, tok = _creds(context)

        def handle() -> pb.MetricsAck:
            task_id, rnd, metrics = serde.metrics_from_proto(request)
            self.engine.report_metrics(cid, tok, task_id, rnd, metrics)
            return pb.MetricsAck(accepted=True)

        return self._guard(context, "ReportMetrics", handle)
