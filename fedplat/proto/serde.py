"""The only module that converts between protobuf messages and fedplat's domain types.

Paired ``x_to_proto`` / ``x_from_proto`` functions. ``*_from_proto`` functions face the
network: they validate and raise :class:`~fedplat.transport.errors.InvalidArgument`
with a reason instead of letting malformed input travel further.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto.stream import read_body
from fedplat.transport.errors import InvalidArgument
from fedplat.transport.messages import (
    Enrollment,
    EnrollRequest,
    ModelPayload,
    Task,
    TaskKind,
    UpdateHeader,
    UploadAck,
)
from fedplat.vectors import Layout, LayoutError, TensorSpec

MAX_LAYOUT_TENSORS = 100_000
MAX_NAME_LEN = 256
MAX_INFO_ITEMS = 64
MAX_METRICS = 256


def layout_to_proto(layout: Layout) -> common.Layout:
    return common.Layout(
        tensors=[
            common.TensorSpec(name=s.name, shape=list(s.shape), dtype=s.dtype)
            for s in layout.specs
        ]
    )


def layout_from_proto(msg: common.Layout) -> Layout:
    if len(msg.tensors) > MAX_LAYOUT_TENSORS:
        raise InvalidArgument(
            f"layout has {len(msg.tensors)} tensors (max {MAX_LAYOUT_TENSORS})"
        )
    try:
        return Layout(
            tuple(
                TensorSpec(t.name, tuple(int(x) for x in t.shape), t.dtype or "float32")
                for t in msg.tensors
            )
        )
    except LayoutError as exc:
        raise InvalidArgument(f"invalid layout: {exc}") from exc


def _check_name(value: str, what: str) -> str:
    if len(value) > MAX_NAME_LEN:
        raise InvalidArgument(f"{what} longer than {MAX_NAME_LEN} characters")
    return value


def _finite_metrics(items: Any, what: str) -> dict[str, float]:
    if len(items) > MAX_METRICS:
        raise InvalidArgument(f"too many {what} ({len(items)} > {MAX_METRICS})")
    out: dict[str, float] = {}
    for k, v in items.items():
        _check_name(k, f"{what} key")
        if not math.isfinite(v):
            raise InvalidArgument(f"{what} {k!r} is not finite")
        out[k] = float(v)
    return out


# -- enrolment ---------------------------------------------------------------------


def enroll_request_to_proto(req: EnrollRequest) -> pb.EnrollRequest:
    return pb.EnrollRequest(
        name=req.name,
        num_examples=req.num_examples,
        layout=layout_to_proto(req.layout),
        client_id=req.client_id,
        info=dict(req.info),
    )


def enroll_request_from_proto(msg: pb.EnrollRequest) -> EnrollRequest:
    if not msg.name:
        raise InvalidArgument("enrolment needs a client name")
    if msg.num_examples < 0:
        raise InvalidArgument("num_examples must be >= 0")
    if len(msg.info) > MAX_INFO_ITEMS:
        raise InvalidArgument(f"too many info items (max {MAX_INFO_ITEMS})")
    for k, v in msg.info.items():
        _check_name(k, "info key")
        _check_name(v, "info value")
    return EnrollRequest(
        name=_check_name(msg.name, "client name"),
        num_examples=int(msg.num_examples),
        layout=layout_from_proto(msg.layout),
        client_id=_check_name(msg.client_id, "client id"),
        info=dict(msg.info),
    )


def enrollment_to_proto(e: Enrollment) -> pb.EnrollResponse:
    return pb.EnrollResponse(
        client_id=e.client_id,
        token=e.token,
        run_id=e.run_id,
        run_name=e.run_name,
        layout=layout_to_proto(e.layout),
        max_message_bytes=e.max_message_bytes,
        max_update_bytes=e.max_update_bytes,
    )


def enrollment_from_proto(msg: pb.EnrollResponse) -> Enrollment:
    return Enrollment(
        client_id=msg.client_id,
        token=msg.token,
        run_id=msg.run_id,
        run_name=msg.run_name,
        layout=layout_from_proto(msg.layout),
        max_message_bytes=int(msg.max_message_bytes),
        max_update_bytes=int(msg.max_update_bytes),
    )


# -- tasks -------------------------------------------------------------------------

_KIND_TO_PB = {
    TaskKind.WAIT: pb.Task.WAIT,
    TaskKind.TRAIN: pb.Task.TRAIN,
    TaskKind.FINISHED: pb.Task.FINISHED,
}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}


def task_to_proto(task: Task) -> pb.Task:
    return pb.Task(
        kind=_KIND_TO_PB[task.kind],
        run_id=task.run_id,
        round=task.round,
        task_id=task.task_id,
        model_version=task.model_version,
        deadline_unix=task.deadline_unix,
        config_json=json.dumps(task.config, sort_keys=True),
        retry_after=task.retry_after,
    )


def task_from_proto(msg: pb.Task) -> Task:
    if msg.kind not in _KIND_FROM_PB:
        raise InvalidArgument(f"unknown task kind {msg.kind}")
    try:
        config = json.loads(msg.config_json) if msg.config_json else {}
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"task config is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise InvalidArgument("task config must be a JSON object")
    return Task(
        kind=_KIND_FROM_PB[msg.kind],
        run_id=msg.run_id,
        round=int(msg.round),
        task_id=msg.task_id,
        model_version=int(msg.model_version),
        deadline_unix=float(msg.deadline_unix),
        config=config,
        retry_after=float(msg.retry_after),
    )


# -- model download (server stream) -------------------------------------------------


def model_to_chunks(payload: ModelPayload, chunk_bytes: int) -> Iterator[pb.ModelChunk]:
    yield pb.ModelChunk(
        header=pb.ModelHeader(
            model_version=payload.model_version,
            round=payload.round,
            layout=layout_to_proto(payload.layout),
            total_bytes=len(payload.data),
            sha256=payload.sha256,
            encoding=payload.encoding,
        )
    )
    view = memoryview(payload.data)
    for start in range(0, len(view), chunk_bytes):
        yield pb.ModelChunk(data=bytes(view[start : start + chunk_bytes]))


def model_from_chunks(chunks: Iterator[pb.ModelChunk], max_bytes: int) -> ModelPayload:
    """Reassemble a streamed model; checks size and checksum."""
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("part") != "header":
        raise InvalidArgument("model stream must start with a header")
    h = first.header
    if h.total_bytes < 0 or h.total_bytes > max_bytes:
        raise InvalidArgument(
            f"model of {h.total_bytes} bytes exceeds limit {max_bytes}"
        )
    data = read_body(it, h.total_bytes, h.sha256, "model")
    return ModelPayload(
        model_version=int(h.model_version),
        round=int(h.round),
        layout=layout_from_proto(h.layout),
        data=data,
        sha256=h.sha256,
        encoding=h.encoding or "dense-f32le",
    )


# -- update upload (client stream) --------------------------------------------------


def update_header_to_proto(h: UpdateHeader) -> pb.UpdateHeader:
    return pb.UpdateHeader(
        task_id=h.task_id,
        round=h.round,
        num_examples=h.num_examples,
        layout=layout_to_proto(h.layout),
        encoding=h.encoding,
        encoding_params=dict(h.encoding_params),
        total_bytes=h.total_bytes,
        sha256=h.sha256,
        metrics=dict(h.metrics),
    )


def update_header_from_proto(msg: pb.UpdateHeader) -> UpdateHeader:
    if not msg.task_id:
        raise InvalidArgument("update header has no task id")
    if msg.num_examples < 0:
        raise InvalidArgument("num_examples must be >= 0")
    if msg.total_bytes < 0:
        raise InvalidArgument("total_bytes must be >= 0")
    if len(msg.encoding_params) > MAX_INFO_ITEMS:
        raise InvalidArgument("too many encoding parameters")
    return UpdateHeader(
        task_id=_check_name(msg.task_id, "task id"),
        round=int(msg.round),
        num_examples=int(msg.num_examples),
        layout=layout_from_proto(msg.layout),
        total_bytes=int(msg.total_bytes),
        sha256=_check_name(msg.sha256, "sha256"),
        encoding=_check_name(msg.encoding or "dense-f32le", "encoding"),
        encoding_params={str(k): str(v) for k, v in msg.encoding_params.items()},
        metrics=_finite_metrics(msg.metrics, "metrics"),
    )


def update_to_chunks(
    header: UpdateHeader, data: bytes, chunk_bytes: int
) -> Iterator[pb.UpdateChunk]:
    yield pb.UpdateChunk(header=update_header_to_proto(header))
    view = memoryview(data)
    for start in range(0, len(view), chunk_bytes):
        yield pb.UpdateChunk(data=bytes(view[start : start + chunk_bytes]))


def update_from_chunks(
    chunks: Iterator[pb.UpdateChunk], max_bytes: int
) -> tuple[UpdateHeader, bytes]:
    """Reassemble an upload, refusing it as soon as it exceeds ``max_bytes``."""
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("part") != "header":
        raise InvalidArgument("update stream must start with a header")
    header = update_header_from_proto(first.header)
    if header.total_bytes > max_bytes:
        raise InvalidArgument(
            f"update of {header.total_bytes} bytes exceeds the limit of "
            f"{max_bytes} bytes"
        )
    data = read_body(it, header.total_bytes, header.sha256, "update")
    return header, data


def upload_ack_to_proto(ack: UploadAck) -> pb.UploadAck:
    return pb.UploadAck(
        accepted=ack.accepted, message=ack.message, bytes_received=ack.bytes_received
    )


def upload_ack_from_proto(msg: pb.UploadAck) -> UploadAck:
    return UploadAck(
        accepted=msg.accepted,
        message=msg.message,
        bytes_received=int(msg.bytes_received),
    )


def metrics_from_proto(msg: pb.MetricsReport) -> tuple[str, int, dict[str, float]]:
    return msg.task_id, int(msg.round), _finite_metrics(msg.metrics, "metrics")
