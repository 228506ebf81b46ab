"""The client-side view of a coordinator, independent of how bytes travel.

:class:`Connection` is what the client SDK talks to. ``GrpcConnection`` speaks the
wire protocol over a channel; ``InMemoryConnection`` calls a coordinator in the
same process (simulation, tests). Both raise the errors of
:mod:`fedplat.protocol.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from fedplat.protocol.messages import (
    Challenge,
    Enrollment,
    EnrollRequest,
    ModelPayload,
    SecAggReply,
    SecAggRequest,
    Task,
    UpdateHeader,
    UploadAck,
)

#: A client's fixed receive window per gRPC stream (``ChannelOptions``,
#: ``Client(stream_window_bytes=...)``): 4 MiB.
DEFAULT_STREAM_WINDOW = 4 * 1024 * 1024

if TYPE_CHECKING:
    from fedplat.proto.streams import ModelInfo
    from fedplat.protocol.body import EncodedBody


class Connection(Protocol):
    """One client's session with a coordinator (credentials kept after enrolment)."""

    def challenge(self, client_id: str) -> Challenge: ...

    def enroll(self, req: EnrollRequest) -> Enrollment: ...

    def get_task(self, wait_seconds: float) -> Task: ...

    def download_model(self, task_id: str, out: torch.Tensor) -> ModelInfo: ...

    def upload_update(self, header: UpdateHeader, body: EncodedBody) -> UploadAck: ...

    def report_metrics(
        self, task_id: str, round_number: int, metrics: dict[str, float]
    ) -> None: ...

    def secagg(self, req: SecAggRequest) -> SecAggReply: ...

    def close(self) -> None: ...


class CoordinatorService(Protocol):
    """What a coordinator offers in process (:class:`fedplat.server.Coordinator`)."""

    def challenge(self, client_id: str = "") -> Challenge: ...

    def enroll(self, req: EnrollRequest) -> Enrollment: ...

    def get_task(
        self, client_id: str, token: str, wait_seconds: float = 0.0
    ) -> Task: ...

    def download_model(
        self, client_id: str, token: str, task_id: str
    ) -> ModelPayload: ...

    def upload_update(
        self, client_id: str, token: str, header: UpdateHeader, data: bytes
    ) -> UploadAck: ...

    def report_metrics(
        self,
        client_id: str,
        token: str,
        task_id: str,
        round_number: int,
        metrics: dict[str, float],
    ) -> None: ...

    def secagg(self, client_id: str, token: str, req: SecAggRequest) -> SecAggReply: ...
