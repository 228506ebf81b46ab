"""The only module that converts between protobuf messages and fedplat's domain types.

Paired ``x_to_proto`` / ``x_from_proto`` functions. ``*_from_proto`` functions face the
network: they validate and raise :class:`~fedplat.protocol.errors.InvalidArgument`
with a reason instead of letting malformed input travel further.
"""

from __future__ import annotations

import math
from typing import Any

from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.protocol.errors import InvalidArgument
from fedplat.protocol.messages import (
    MAX_EXAMPLES,
    Challenge,
    Enrollment,
    EnrollRequest,
    SecAggReply,
    SecAggReplyKind,
    SecAggRequest,
    Task,
    TaskKind,
    UploadAck,
    client_name_problem,
    is_client_id,
)
from fedplat.protocol.task import TaskConfig, TaskConfigError
from fedplat.vectors import Layout, LayoutError, TensorSpec

MAX_LAYOUT_TENSORS = 100_000
MAX_NAME_LEN = 256
MAX_INFO_ITEMS = 64
MAX_METRICS = 64
MAX_METRIC_KEY = 64


def layout_to_proto(layout: Layout) -> common.Layout:
    return common.Layout(
        tensors=[
            common.TensorSpec(name=s.name, shape=list(s.shape), dtype=s.dtype)
            for s in layout.specs
        ]
    )


MAX_TENSOR_DIMS = 8
MAX_DIM = 1 << 40


def layout_from_proto(
    msg: common.Layout, max_tensors: int = MAX_LAYOUT_TENSORS
) -> Layout:
    """A layout from the network; ``max_tensors`` (e.g. the run's own tensor
    count) refuses oversized layouts before any per-tensor work."""
    if len(msg.tensors) > max_tensors:
        raise InvalidArgument(
            f"layout has {len(msg.tensors)} tensors (max {max_tensors})"
        )
    for t in msg.tensors:
        check_name(t.name, "tensor name")
        if len(t.shape) > MAX_TENSOR_DIMS or any(
            not 0 <= x <= MAX_DIM for x in t.shape
        ):
            raise InvalidArgument(f"tensor {t.name[:64]!r} has an implausible shape")
    try:
        return Layout(
            tuple(
                TensorSpec(t.name, tuple(int(x) for x in t.shape), t.dtype or "float32")
                for t in msg.tensors
            )
        )
    except LayoutError as exc:
        raise InvalidArgument(f"invalid layout: {exc}") from exc


def check_name(value: str, what: str) -> str:
    if len(value) > MAX_NAME_LEN:
        raise InvalidArgument(f"{what} longer than {MAX_NAME_LEN} characters")
    return value


def finite_metrics(items: Any, what: str) -> dict[str, float]:
    if len(items) > MAX_METRICS:
        raise InvalidArgument(f"too many {what} ({len(items)} > {MAX_METRICS})")
    out: dict[str, float] = {}
    for k, v in items.items():
        if not k or len(k) > MAX_METRIC_KEY or not k.isprintable():
            raise InvalidArgument(
                f"{what} keys must be 1-{MAX_METRIC_KEY} printable characters"
            )
        if not math.isfinite(v):
            raise InvalidArgument(f"{what} {k!r} is not finite")
        out[k] = float(v)
    return out


# -- enrolment ---------------------------------------------------------------------

MAX_KEY_BYTES = 64
MAX_TOKEN_LEN = 256


def challenge_to_proto(c: Challenge) -> pb.ChallengeResponse:
    return pb.ChallengeResponse(challenge=c.challenge, expires_unix=c.expires_unix)


def challenge_from_proto(msg: pb.ChallengeResponse) -> Challenge:
    return Challenge(bytes(msg.challenge), float(msg.expires_unix))


def check_client_id(value: str) -> str:
    """``""`` (a new client) or a well-formed client id; InvalidArgument otherwise."""
    if value and not is_client_id(value):
        raise InvalidArgument("malformed client id")
    return value


def check_examples(value: int) -> int:
    if not 0 <= value <= MAX_EXAMPLES:
        raise InvalidArgument(f"num_examples must be in [0, {MAX_EXAMPLES}]")
    return int(value)


def challenge_request_from_proto(msg: pb.ChallengeRequest) -> str:
    return check_client_id(msg.client_id)


def check_bytes(value: bytes, what: str, limit: int = MAX_KEY_BYTES) -> bytes:
    if len(value) > limit:
        raise InvalidArgument(f"{what} longer than {limit} bytes")
    return bytes(value)


def enroll_request_to_proto(req: EnrollRequest) -> pb.EnrollRequest:
    return pb.EnrollRequest(
        name=req.name,
        num_examples=req.num_examples,
        layout=layout_to_proto(req.layout),
        client_id=req.client_id,
        info=dict(req.info),
        public_key=req.public_key,
        challenge=req.challenge,
        signature=req.signature,
        enrolment_token=req.enrolment_token,
    )


def enroll_request_from_proto(
    msg: pb.EnrollRequest, max_tensors: int = MAX_LAYOUT_TENSORS
) -> EnrollRequest:
    name = msg.name
    problem = client_name_problem(name)
    if problem is not None:
        raise InvalidArgument(problem)
    if len(msg.info) > MAX_INFO_ITEMS:
        raise InvalidArgument(f"too many info items (max {MAX_INFO_ITEMS})")
    for k, v in msg.info.items():
        check_name(k, "info key")
        check_name(v, "info value")
    return EnrollRequest(
        name=name,
        num_examples=check_examples(msg.num_examples),
        layout=layout_from_proto(msg.layout, max_tensors),
        client_id=check_client_id(msg.client_id),
        info=dict(msg.info),
        public_key=check_bytes(msg.public_key, "public key"),
        challenge=check_bytes(msg.challenge, "challenge"),
        signature=check_bytes(msg.signature, "signature", 128),
        enrolment_token=check_name(msg.enrolment_token, "enrolment token"),
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
        session_expires_unix=e.session_expires_unix,
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
        session_expires_unix=float(msg.session_expires_unix),
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
        config_json=task.config.to_json() if task.kind is TaskKind.TRAIN else "",
        retry_after=task.retry_after,
        nonce=task.nonce,
    )


def task_from_proto(msg: pb.Task) -> Task:
    if msg.kind not in _KIND_FROM_PB:
        raise InvalidArgument(f"unknown task kind {msg.kind}")
    try:
        config = TaskConfig.from_json(msg.config_json)
    except TaskConfigError as exc:
        raise InvalidArgument(str(exc)) from None
    return Task(
        kind=_KIND_FROM_PB[msg.kind],
        run_id=msg.run_id,
        round=int(msg.round),
        task_id=msg.task_id,
        model_version=int(msg.model_version),
        deadline_unix=float(msg.deadline_unix),
        config=config,
        retry_after=float(msg.retry_after),
        nonce=bytes(msg.nonce),
    )


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
    if msg.round < 1:
        raise InvalidArgument(f"round must be >= 1, got {msg.round}")
    return (
        check_name(msg.task_id, "task id"),
        int(msg.round),
        finite_metrics(msg.metrics, "metrics"),
    )


# -- secure aggregation -------------------------------------------------------------

_SECAGG_TO_PB = {
    SecAggReplyKind.WAIT: pb.SecAggReply.WAIT,
    SecAggReplyKind.MESSAGE: pb.SecAggReply.MESSAGE,
    SecAggReplyKind.DONE: pb.SecAggReply.DONE,
}
_SECAGG_FROM_PB = {v: k for k, v in _SECAGG_TO_PB.items()}


def secagg_request_to_proto(req: SecAggRequest) -> pb.SecAggRequest:
    return pb.SecAggRequest(
        task_id=req.task_id,
        round=req.round,
        message=req.message,
        signature=req.signature,
        wait_seconds=req.wait_seconds,
    )


def secagg_request_from_proto(msg: pb.SecAggRequest) -> SecAggRequest:
    """Checked (the message's size is bounded by the server's message limit and
    parsed against the round's config by the coordinator)."""
    wait = float(msg.wait_seconds)
    return SecAggRequest(
        task_id=check_name(msg.task_id, "task id"),
        round=int(msg.round),
        message=bytes(msg.message),
        signature=check_bytes(msg.signature, "signature", 128),
        wait_seconds=wait if math.isfinite(wait) and wait > 0 else 0.0,
    )


def secagg_reply_to_proto(reply: SecAggReply) -> pb.SecAggReply:
    return pb.SecAggReply(
        kind=_SECAGG_TO_PB[reply.kind], message=reply.message, reason=reply.reason
    )


def secagg_reply_from_proto(msg: pb.SecAggReply) -> SecAggReply:
    if msg.kind not in _SECAGG_FROM_PB:
        raise InvalidArgument(f"unknown secure-aggregation reply kind {msg.kind}")
    return SecAggReply(_SECAGG_FROM_PB[msg.kind], bytes(msg.message), msg.reason[:1000])
