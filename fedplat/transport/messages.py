"""Transport-neutral messages exchanged between clients and the coordinator."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from fedplat.vectors import Layout


@dataclass(frozen=True)
class EnrollRequest:
    name: str
    num_examples: int
    layout: Layout
    client_id: str = ""
    info: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Enrollment:
    client_id: str
    token: str
    run_id: str
    run_name: str
    layout: Layout
    max_message_bytes: int
    max_update_bytes: int


class TaskKind(enum.Enum):
    WAIT = 1
    TRAIN = 2
    FINISHED = 3


@dataclass(frozen=True)
class Task:
    kind: TaskKind
    run_id: str = ""
    round: int = 0
    task_id: str = ""
    model_version: int = 0
    deadline_unix: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)
    retry_after: float = 0.0


@dataclass(frozen=True)
class ModelPayload:
    """The global model: raw little-endian bytes in ``encoding`` plus its layout."""

    model_version: int
    round: int
    layout: Layout
    data: bytes
    sha256: str
    encoding: str = "dense-f32le"


@dataclass(frozen=True)
class UpdateHeader:
    task_id: str
    round: int
    num_examples: int
    layout: Layout
    total_bytes: int
    sha256: str
    encoding: str = "dense-f32le"
    encoding_params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class UploadAck:
    accepted: bool
    message: str
    bytes_received: int
