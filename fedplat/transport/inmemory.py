"""In-process transport: the client SDK calls a round engine directly.

Updates still go through the same byte encoding and validation as over gRPC, so a
simulation exercises the coordinator's real checks; only sockets are skipped.
"""

from __future__ import annotations

from fedplat.transport.base import CoordinatorService
from fedplat.transport.errors import Unauthenticated
from fedplat.transport.messages import (
    Enrollment,
    EnrollRequest,
    ModelPayload,
    Task,
    UpdateHeader,
    UploadAck,
)


class InMemoryConnection:
    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self._client_id = ""
        self._token = ""

    def _creds(self) -> tuple[str, str]:
        if not self._client_id:
            raise Unauthenticated("not enrolled")
        return self._client_id, self._token

    def enroll(self, req: EnrollRequest) -> Enrollment:
        e = self.service.enroll(req)
        self._client_id, self._token = e.client_id, e.token
        return e

    def get_task(self, wait_seconds: float) -> Task:
        return self.service.get_task(*self._creds(), wait_seconds)

    def download_model(self, task_id: str) -> ModelPayload:
        return self.service.download_model(*self._creds(), task_id)

    def upload_update(self, header: UpdateHeader, data: bytes) -> UploadAck:
        return self.service.upload_update(*self._creds(), header, data)

    def report_metrics(
        self, task_id: str, round_number: int, metrics: dict[str, float]
    ) -> None:
        self.service.report_metrics(*self._creds(), task_id, round_number, metrics)

    def close(self) -> None:
        pass
