"""gRPC transport, client side: :class:`GrpcConnection` (errors map through
:mod:`fedplat.transport.status`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
import torch

from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import fedplat_pb2_grpc as pb_grpc
from fedplat.proto import serde, streams
from fedplat.proto.streams import ModelInfo
from fedplat.protocol.body import EncodedBody
from fedplat.protocol.errors import Unauthenticated
from fedplat.protocol.messages import (
    Challenge,
    Enrollment,
    EnrollRequest,
    SecAggReply,
    SecAggRequest,
    Task,
    UpdateHeader,
    UploadAck,
)
from fedplat.transport.base import DEFAULT_STREAM_WINDOW
from fedplat.transport.status import error_from_rpc

MiB = 1024 * 1024
CLIENT_ID_KEY = "x-fedplat-client"
TOKEN_KEY = "x-fedplat-token"


@dataclass(frozen=True)
class ChannelOptions:
    """How to reach the coordinator. TLS unless ``insecure`` is explicitly set."""

    insecure: bool = False
    root_certificates: bytes | None = None
    private_key: bytes | None = None  # client key/cert for mutual TLS
    certificate_chain: bytes | None = None
    # What this client accepts per message: the coordinator's chunks must fit.
    max_message_bytes: int = 16 * MiB
    chunk_bytes: int = 1 * MiB
    max_model_bytes: int = 2048 * MiB
    rpc_timeout: float = 60.0
    # A fixed receive window per stream (gRPC's window auto-tuning off): what
    # gRPC may hold of a download this client has not read yet. ``None``: the
    # auto-tuned window, which can grow to hold much more (docs/scale.md).
    stream_window_bytes: int | None = DEFAULT_STREAM_WINDOW

    def __post_init__(self) -> None:
        w = self.stream_window_bytes
        if w is not None and not 64 * 1024 <= w <= 64 * MiB:
            raise ValueError(
                f"stream_window_bytes must be in [64 KiB, 64 MiB], got {w}"
            )


def channel_options(opts: ChannelOptions) -> list[tuple[str, int]]:
    """The gRPC channel arguments of a client connection."""
    options = [
        ("grpc.max_send_message_length", opts.max_message_bytes),
        ("grpc.max_receive_message_length", opts.max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.enable_retries", 0),
    ]
    if opts.stream_window_bytes is not None:
        options += [
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", opts.stream_window_bytes),
        ]
    return options


def make_channel(address: str, opts: ChannelOptions) -> grpc.Channel:
    options = channel_options(opts)
    if opts.insecure:
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(
        root_certificates=opts.root_certificates,
        private_key=opts.private_key,
        certificate_chain=opts.certificate_chain,
    )
    return grpc.secure_channel(address, creds, options=options)


T = TypeVar("T")


def _as_bytes(message: bytes) -> bytes:
    return message


class GrpcConnection:
    """A client's gRPC session with a coordinator."""

    def __init__(self, address: str, opts: ChannelOptions) -> None:
        self.address = address
        self.opts = opts
        self.channel = make_channel(address, opts)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        # The two large streams skip protobuf objects for their payload: data
        # chunks are written with one copy and read as views of the received bytes.
        self._download = self.channel.unary_stream(
            "/fedplat.v1.Coordinator/DownloadModel",
            request_serializer=pb.DownloadRequest.SerializeToString,
            response_deserializer=streams.parse_model_chunk,
        )
        self._upload = self.channel.stream_unary(
            "/fedplat.v1.Coordinator/UploadUpdate",
            request_serializer=_as_bytes,
            response_deserializer=pb.UploadAck.FromString,
        )
        self._client_id = ""
        self._token = ""
        self._chunk = opts.chunk_bytes
        self._connected = False  # some call has succeeded on this channel

    def _md(self) -> tuple[tuple[str, str], ...]:
        if not self._client_id:
            raise Unauthenticated("not enrolled")
        return ((CLIENT_ID_KEY, self._client_id), (TOKEN_KEY, self._token))

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            out = fn()
        except grpc.RpcError as exc:
            # A plaintext connection closed before any call ever succeeded is
            # what a TLS-only coordinator does to it: say so.
            hint = self.opts.insecure and not self._connected
            raise error_from_rpc(exc, plaintext=hint) from None
        self._connected = True
        return out

    def challenge(self, client_id: str) -> Challenge:
        msg = pb.ChallengeRequest(client_id=client_id)
        resp = self._call(
            lambda: self.stub.Challenge(msg, timeout=self.opts.rpc_timeout)
        )
        return serde.challenge_from_proto(resp)

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

    def download_model(self, task_id: str, out: torch.Tensor) -> ModelInfo:
        md = self._md()
        return self._call(
            lambda: streams.receive_model(
                self._download(
                    pb.DownloadRequest(task_id=task_id),
                    metadata=md,
                    timeout=self.opts.rpc_timeout,
                ),
                out,
                self.opts.max_model_bytes,
            )
        )

    def upload_update(self, header: UpdateHeader, body: EncodedBody) -> UploadAck:
        md = self._md()
        resp = self._call(
            lambda: self._upload(
                streams.update_messages(header, body, self._chunk),
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

    def secagg(self, req: SecAggRequest) -> SecAggReply:
        md = self._md()
        msg = serde.secagg_request_to_proto(req)
        resp = self._call(
            lambda: self.stub.SecAgg(
                msg, metadata=md, timeout=req.wait_seconds + self.opts.rpc_timeout
            )
        )
        return serde.secagg_reply_from_proto(resp)

    def close(self) -> None:
        self.channel.close()
