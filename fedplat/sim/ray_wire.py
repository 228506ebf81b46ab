"""The coordinator's client API as bytes, for the Ray backend's transport.

Between Ray processes fedplat sends only ``bytes`` and ``str``: every message is
the same protobuf message the gRPC transport sends (serialized and parsed by
:mod:`fedplat.proto.serde` and :mod:`fedplat.proto.streams`, with their bounds),
an update's body is its ``fedplat-payload-v1`` bytes, and the global model is one
``uint8`` array per model version placed in Ray's object store once and read by
every client host. No model object, tensor or fedplat dataclass is pickled
between processes; Ray's own object transport carries the bytes.

:class:`CoordinatorEndpoint` is the coordinator's side (it answers each call
with ``("ok", value)`` or ``("err", code, reason)``, never raising across the
boundary); :class:`RayConnection` is the client SDK's
:class:`~fedplat.transport.base.Connection` on top of any ``call(method, *args)``
that reaches an endpoint (an actor method in the Ray backend, a plain call in
tests).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import serde, streams
from fedplat.proto.streams import Malformed, ModelInfo
from fedplat.protocol.body import EncodedBody
from fedplat.protocol.errors import (
    ERRORS_BY_CODE,
    FedplatError,
    InvalidArgument,
    Unauthenticated,
)
from fedplat.protocol.messages import (
    Challenge,
    Enrollment,
    EnrollRequest,
    Task,
    UpdateHeader,
    UploadAck,
)
from fedplat.server.coordinator import Coordinator

#: ``("ok", value)`` or ``("err", code, reason)``.
Reply = tuple[Any, ...]
Call = Callable[..., Reply]


def _parse(cls: type[Any], raw: bytes, limit: int) -> Any:
    if not isinstance(raw, bytes) or len(raw) > limit:
        raise InvalidArgument(f"{cls.__name__} message missing or over {limit} bytes")
    msg = streams.parse_or_malformed(cls, raw)
    if isinstance(msg, Malformed):
        raise InvalidArgument(msg.reason)
    return msg


class CoordinatorEndpoint:
    """A coordinator's client API over bytes (see the module docstring).

    ``put_model(array)`` stores the model's bytes where client hosts can read
    them (``ray.put``) and returns the handle sent to them.
    """

    def __init__(
        self, coord: Coordinator, put_model: Callable[[np.ndarray], Any] = np.copy
    ) -> None:
        self.coord = coord
        self.put_model = put_model
        self.limit = coord.cfg.server.max_message_bytes
        self.max_tensors = len(coord.ctx.layout.specs)
        self._model: tuple[tuple[int, str], bytes, Any] | None = None

    def _answer(self, rpc: str, client_id: str, fn: Callable[[], Any]) -> Reply:
        try:
            return ("ok", fn())
        except FedplatError as exc:
            if not exc.recorded:
                self.coord.reject(f"{rpc}_refused", exc.reason, client_id or None)
            return ("err", exc.code, exc.reason)

    # ---------------------------------------------------------------- enrolment
    def challenge(self, client_id: str) -> Reply:
        return self._answer(
            "challenge",
            "",
            lambda: serde.challenge_to_proto(
                self.coord.challenge(serde.check_name(client_id, "client id"))
            ).SerializeToString(),
        )

    def enroll(self, raw: bytes) -> Reply:
        def run() -> bytes:
            msg = _parse(pb.EnrollRequest, raw, self.limit)
            req = serde.enroll_request_from_proto(msg, self.max_tensors)
            return serde.enrollment_to_proto(self.coord.enroll(req)).SerializeToString()

        return self._answer("enroll", "", run)

    # ---------------------------------------------------------------- tasks
    def task(self, client_id: str) -> bytes:
        """The selected client's task, handed to its host with the step order
        (the simulator's stand-in for the poll that would fetch it)."""
        c = self.coord.registry.get(client_id)
        task = self.coord.task_for(c) if c is not None else None
        return serde.task_to_proto(task or self.coord.wait_task()).SerializeToString()

    def get_task(self, client_id: str, token: str) -> Reply:
        return self._answer(
            "gettask",
            client_id,
            lambda: serde.task_to_proto(
                self.coord.get_task(client_id, token, 0.0)
            ).SerializeToString(),
        )

    def download(self, client_id: str, token: str, task_id: str) -> Reply:
        """The model header message and the stored model bytes' handle (in a list,
        so Ray passes the handle instead of resolving it)."""

        def run() -> tuple[bytes, list[Any]]:
            p = self.coord.download_model(client_id, token, task_id)
            key = (p.model_version, p.sha256)
            if self._model is None or self._model[0] != key:
                data = np.frombuffer(p.data, dtype=np.uint8)
                header = streams.model_header_message(p).SerializeToString()
                self._model = (key, header, self.put_model(data))
            return self._model[1], [self._model[2]]

        return self._answer("downloadmodel", client_id, run)

    def upload(self, client_id: str, token: str, raw: bytes, body: bytes) -> Reply:
        def run() -> bytes:
            self.coord.authenticate(client_id, token)  # before the body is read
            msg = _parse(pb.UpdateHeader, raw, self.limit)
            header = streams.update_header_from_proto(msg, self.max_tensors)
            ack = self.coord.upload_update(client_id, token, header, body)
            return serde.upload_ack_to_proto(ack).SerializeToString()

        return self._answer("uploadupdate", client_id, run)

    def report_metrics(self, client_id: str, token: str, raw: bytes) -> Reply:
        def run() -> None:
            self.coord.authenticate(client_id, token)
            task_id, rnd, metrics = serde.metrics_from_proto(
                _parse(pb.MetricsReport, raw, self.limit)
            )
            self.coord.report_metrics(client_id, token, task_id, rnd, metrics)

        return self._answer("reportmetrics", client_id, run)


class RayConnection:
    """A client's session with a :class:`CoordinatorEndpoint` reached through
    ``call``; ``fetch(handle)`` reads the model bytes a download names."""

    def __init__(self, call: Call, fetch: Callable[[Any], Any]) -> None:
        self._call = call
        self._fetch = fetch
        self._client_id = ""
        self._token = ""
        self._offered: bytes | None = None

    def _ok(self, method: str, *args: Any) -> Any:
        reply = self._call(method, *args)
        if reply[0] == "ok":
            return reply[1]
        _, code, reason = reply
        raise ERRORS_BY_CODE.get(code, FedplatError)(reason)

    def _creds(self) -> tuple[str, str]:
        if not self._client_id:
            raise Unauthenticated("not enrolled")
        return self._client_id, self._token

    def offer(self, task: bytes) -> None:
        """The next :meth:`get_task` answers ``task`` without a call."""
        self._offered = task

    def challenge(self, client_id: str) -> Challenge:
        raw = self._ok("challenge", client_id)
        return serde.challenge_from_proto(pb.ChallengeResponse.FromString(raw))

    def enroll(self, req: EnrollRequest) -> Enrollment:
        raw = self._ok("enroll", serde.enroll_request_to_proto(req).SerializeToString())
        e = serde.enrollment_from_proto(pb.EnrollResponse.FromString(raw))
        self._client_id, self._token = e.client_id, e.token
        return e

    def get_task(self, wait_seconds: float) -> Task:
        raw, self._offered = self._offered, None
        if raw is None:
            raw = self._ok("get_task", *self._creds())
        return serde.task_from_proto(pb.Task.FromString(raw))

    def download_model(self, task_id: str, out: torch.Tensor) -> ModelInfo:
        raw, (handle,) = self._ok("download", *self._creds(), task_id)
        h = pb.ModelChunk.FromString(raw).header
        data = np.asarray(self._fetch(handle), dtype=np.uint8)
        if data.size != 4 * out.numel() or h.total_bytes != data.size:
            raise InvalidArgument("model size differs from the client's model")
        if hashlib.sha256(data.data).hexdigest() != h.sha256:
            raise InvalidArgument("model checksum mismatch")
        out.view(torch.uint8).numpy()[:] = data
        layout = serde.layout_from_proto(h.layout)
        return ModelInfo(int(h.model_version), int(h.round), layout, h.encoding)

    def upload_update(self, header: UpdateHeader, body: EncodedBody) -> UploadAck:
        raw = streams.update_header_to_proto(header).SerializeToString()
        ack = self._ok("upload", *self._creds(), raw, body.tobytes())
        return serde.upload_ack_from_proto(pb.UploadAck.FromString(ack))

    def report_metrics(
        self, task_id: str, round_number: int, metrics: dict[str, float]
    ) -> None:
        msg = pb.MetricsReport(task_id=task_id, round=round_number, metrics=metrics)
        self._ok("report_metrics", *self._creds(), msg.SerializeToString())

    def close(self) -> None:
        pass


__all__ = ["CoordinatorEndpoint", "RayConnection", "Reply"]
