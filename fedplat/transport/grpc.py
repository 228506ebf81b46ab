"""gRPC transport: the client-side :class:`GrpcConnection` and status-code mapping."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import fedplat_pb2_grpc as pb_grpc
from fedplat.proto import serde
from fedplat.transport.errors import (
    ERRORS_BY_CODE,
    FedplatError,
    Unauthenticated,
    Unavailable,
)
from fedplat.transport.messages import (
    Enrollment,
    EnrollRequest,
    ModelPayload,
    Task,
    UpdateHeader,
    UploadAck,
)

MiB = 1024 * 1024
CLIENT_ID_KEY = "x-fedplat-client"
TOKEN_KEY = "x-fedplat-token"

STATUS_BY_CODE: dict[str, grpc.StatusCode] = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "already_exists": grpc.StatusCode.ALREADY_EXISTS,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "internal": grpc.StatusCode.INTERNAL,
}
CODE_BY_STATUS = {v: k for k, v in STATUS_BY_CODE.items()}


def error_from_rpc(exc: grpc.RpcError) -> FedplatError:
    """Map a gRPC error back to the domain error the SDK handles."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        None,
    ):
        return Unavailable(f"{code.name if code else 'error'}: {details}")
    cls = ERRORS_BY_CODE.get(CODE_BY_STATUS.get(code, ""), FedplatError)
    return cls(details)


@dataclass(frozen=True)
class ChannelOptions:
    """How to reach the coordinator. TLS unless ``insecure`` is explicitly set."""

    insecure: bool = False
    root_certificates: bytes | None = None
    private_key: bytes | None = None  # client key/cert for mutual TLS
    certificate_chain: bytes | None = None
    max_message_bytes: int = 4 * MiB
    chunk_bytes: int = 1 * MiB
    max_model_bytes: int = 2048 * MiB
    rpc_timeout: float = 60.0


def make_channel(address: str, opts: ChannelOptions) -> grpc.Channel:
    options = [
        ("grpc.max_send_message_length", opts.max_message_bytes),
        ("grpc.max_receive_message_length", opts.max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.enable_retries", 0),
    ]
    if opts.insecure:
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(
        root_certificates=opts.root_certificates,
        private_key=opts.private_key,
        certificate_chain=opts.certificate_chain,
    )
    return grpc.secure_channel(address, creds, options=options)


T = TypeVar("T")


class GrpcConnection:
    """A client's gRPC session with a coordinator."""

    def __init__(self, address: str, opts: ChannelOptions) -> None:
        self.address = address
        self.opts = opts
        self.channel = make_channel(address, opts)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self._client_id = ""
        self._token = ""
        self._chunk = opts.chunk_bytes

    def _md(self) -> tuple[tuple[str, str], ...]:
        if not self._client_id:
            raise Unauthenticated("not enrolled")
        return ((CLIENT_ID_KEY, self._client_id), (TOKEN_KEY, self._token))

    @staticmethod
    def _call(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def enroll(self, req: EnrollRequest) -> Enrollment:
        msg = serde.enroll_request_to_proto(req)
        resp = self._call(lambda: self.stub.Enroll(msg, timeout=self.opts.rpc_timeout))
        e = serde.enrollment_from_proto(resp)
        self._client_id, self._token = e.client_id, e.token
        # Stay below the server's per-message limit whatever we were configured with.
        self._chunk = max(
            1024, min(self.opts.chunk_bytes, e.max_message_bytes - 64 * 1024)
        )
        return e

    def get_task(self, wait_seconds: float) -> Task:
        md = self._md()
        resp = self._call(
            lambda: self.stub.GetTask(
                pb.GetTaskRequest(wait_seconds=wait_seconds),
                metadata=md,
                timeout=wait_seconds + self.opts.rpc_timeout,
            )
        )
        return serde.task_from_proto(resp)

    def download_model(self, task_id: str) -> ModelPayload:
        md = self._md()
        return self._call(
            lambda: serde.model_from_chunks(
                self.stub.DownloadModel(
                    pb.DownloadRequest(task_id=task_id),
                    metadata=md,
                    timeout=self.opts.rpc_timeout,
                ),
                self.opts.max_model_bytes,
            )
        )

    def upload_update(self, header: UpdateHeader, data: bytes) -> UploadAck:
        md = self._md()
        resp = self._call(
            lambda: self.stub.UploadUpdate(
                serde.update_to_chunks(header, data, self._chunk),
                metadata=md,
                timeout=self.opts.rpc_timeout,
            )
        )
        return serde.upload_ack_from_proto(resp)

    def report_metrics(
        self, task_id: str, round_number: int, metrics: dict[str, float]
    ) -> None:
        md = self._md()
        self._call(
            lambda: self.stub.ReportMetrics(
                pb.MetricsReport(task_id=task_id, round=round_number, metrics=metrics),
                metadata=md,
                timeout=self.opts.rpc_timeout,
            )
        )

    def close(self) -> None:
        self.channel.close()
