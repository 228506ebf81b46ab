"""Transport-neutral messages exchanged between clients and the coordinator.

Also what bounds a client's id and name where they enter, and the statements an
update's and a secure-aggregation message's signatures cover.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeGuard

import torch

from fedplat.protocol.task import TaskConfig
from fedplat.vectors import Layout

if TYPE_CHECKING:
    from fedplat.protocol.body import EncodedBody

#: The one upload encoding: a fedplat.compression.wire payload (dense or not).
PAYLOAD_V1 = "fedplat-payload-v1"
#: The global model's download encoding: raw little-endian float32 values.
DENSE_F32 = "dense-f32le"


#: What a client may call itself and what the coordinator calls it: the store's
#: columns are this wide, so nothing longer is ever accepted (or spends a token).
MAX_CLIENT_ID = 64
MAX_CLIENT_NAME = 128
#: Declared example counts fit the store's INTEGER column (PostgreSQL int4).
MAX_EXAMPLES = 2**31 - 1
_CLIENT_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.:\-]{{0,{MAX_CLIENT_ID - 1}}}")


def is_client_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` could be a client id (issued ids are hex; no blank,
    control or markup characters, at most :data:`MAX_CLIENT_ID`)."""
    return isinstance(value, str) and _CLIENT_ID.fullmatch(value) is not None


def client_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a client's name, or None."""
    if not isinstance(name, str) or not name.strip():
        return "a client name must be a non-blank string"
    if len(name) > MAX_CLIENT_NAME:
        return f"a client name must be at most {MAX_CLIENT_NAME} characters"
    if not name.isprintable():
        return "a client name must be printable (no control characters)"
    return None


@dataclass(frozen=True)
class Challenge:
    challenge: bytes
    expires_unix: float


@dataclass(frozen=True)
class EnrollRequest:
    name: str
    num_examples: int
    layout: Layout
    client_id: str = ""
    info: dict[str, str] = field(default_factory=dict)
    public_key: bytes = b""
    challenge: bytes = b""
    signature: bytes = b""
    enrolment_token: str = ""


@dataclass(frozen=True)
class Enrollment:
    client_id: str
    token: str
    run_id: str
    run_name: str
    layout: Layout
    max_message_bytes: int
    max_update_bytes: int
    session_expires_unix: float = 0.0


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
    config: TaskConfig = field(default_factory=TaskConfig)
    retry_after: float = 0.0
    nonce: bytes = b""


@dataclass(frozen=True)
class ModelPayload:
    """The global model: raw little-endian bytes in ``encoding`` plus its layout."""

    model_version: int
    round: int
    layout: Layout
    data: bytes | memoryview
    sha256: str
    encoding: str = DENSE_F32


@dataclass(frozen=True)
class UpdateHeader:
    task_id: str
    round: int
    num_examples: int
    layout: Layout
    total_bytes: int
    sha256: str
    encoding: str = PAYLOAD_V1
    metrics: dict[str, float] = field(default_factory=dict)
    signature: bytes = b""


def update_statement(
    run_id: str, header: UpdateHeader, nonce: bytes
) -> tuple[str, int, str, bytes, str, int, str]:
    """The fields an update's signature covers (domain ``UPDATE`` of
    :mod:`fedplat.security.identity`): the run, round, task and the task's nonce
    bind it to one task; the payload SHA-256, examples and encoding to its content."""
    return (
        run_id,
        header.round,
        header.task_id,
        nonce,
        header.sha256,
        header.num_examples,
        header.encoding,
    )


class SecAggReplyKind(enum.Enum):
    WAIT = 1
    MESSAGE = 2
    DONE = 3


@dataclass(frozen=True)
class SecAggRequest:
    """One client's secure-aggregation call: its message of the current phase
    (``fedplat.secagg`` bytes; empty to poll) and its signature."""

    task_id: str
    round: int
    message: bytes = b""
    signature: bytes = b""
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class SecAggReply:
    kind: SecAggReplyKind
    message: bytes = b""
    reason: str = ""


def secagg_statement(
    run_id: str, round: int, task_id: str, nonce: bytes, message: bytes
) -> tuple[str, int, str, bytes, str]:
    """The fields a secure-aggregation message's signature covers (domain
    ``SECAGG``): run, round, task and the task's nonce bind it to one task, the
    SHA-256 to its bytes."""
    return (run_id, round, task_id, nonce, hashlib.sha256(message).hexdigest())


@dataclass(frozen=True)
class UploadAck:
    accepted: bool
    message: str
    bytes_received: int


@dataclass(frozen=True)
class OutgoingUpdate:
    """An update on its way out through the client's middleware chain.

    ``vector`` is ``[d]`` float32 (new - global). ``body`` is set by the layer
    that encodes it (compression); without one the update is sent dense.
    """

    task: Task
    vector: torch.Tensor
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    body: EncodedBody | None = None


Send = Callable[[OutgoingUpdate], UploadAck]
