"""In-process transport: the client SDK calls a coordinator directly.

Updates still go through the same payload encoding, signatures and intake as over
gRPC, so a simulation exercises the coordinator's real checks; only sockets are
skipped. Byte counts are those of the messages gRPC would carry.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from fedplat.proto.streams import ModelInfo
from fedplat.protocol.body import EncodedBody
from fedplat.protocol.errors import InvalidArgument, Unauthenticated
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
from fedplat.transport.base import CoordinatorService


class InMemoryConnection:
    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self._client_id = ""
        self._token = ""

    def _creds(self) -> tuple[str, str]:
        if not self._client_id:
            raise Unauthenticated("not enrolled")
        return self._client_id, self._token

    def challenge(self, client_id: str) -> Challenge:
        return self.service.challenge(client_id)

    def enroll(self, req: EnrollRequest) -> Enrollment:
        e = self.service.enroll(req)
        self._client_id, self._token = e.client_id, e.token
        return e

    def get_task(self, wait_seconds: float) -> Task:
        return self.service.get_task(*self._creds(), wait_seconds)

    def download_model(self, task_id: str, out: torch.Tensor) -> ModelInfo:
        p = self.service.download_model(*self._creds(), task_id)
        if len(p.data) != 4 * out.numel():
            raise InvalidArgument("model size differs from the client's model")
        if hashlib.sha256(p.data).hexdigest() != p.sha256:
            raise InvalidArgument("model checksum mismatch")
        out.view(torch.uint8).numpy()[:] = np.frombuffer(p.data, dtype=np.uint8)
        return ModelInfo(p.model_version, p.round, p.layout, p.encoding)

    def upload_update(self, header: UpdateHeader, body: EncodedBody) -> UploadAck:
        return self.service.upload_update(*self._creds(), header, body.tobytes())

    def report_metrics(
        self, task_id: str, round_number: int, metrics: dict[str, float]
    ) -> None:
        self.service.report_metrics(*self._creds(), task_id, round_number, metrics)

    def secagg(self, req: SecAggRequest) -> SecAggReply:
        return self.service.secagg(*self._creds(), req)

    def close(self) -> None:
        pass
