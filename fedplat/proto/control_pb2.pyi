from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class RunRef(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: str
    def __init__(self, run: _Optional[str] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("id", "name", "status", "current_round", "total_rounds", "best_accuracy", "phase", "live_clients", "started_unix", "finished_unix", "reason", "served_here")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BEST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LIVE_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SERVED_HERE_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    status: str
    current_round: int
    total_rounds: int
    best_accuracy: float
    phase: str
    live_clients: int
    started_unix: float
    finished_unix: float
    reason: str
    served_here: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[str] = ..., current_round: _Optional[int] = ..., total_rounds: _Optional[int] = ..., best_accuracy: _Optional[float] = ..., phase: _Optional[str] = ..., live_clients: _Optional[int] = ..., started_unix: _Optional[float] = ..., finished_unix: _Optional[float] = ..., reason: _Optional[str] = ..., served_here: bool = ...) -> None: ...

class RunList(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ...) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ("run", "reason")
    RUN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run: str
    reason: str
    def __init__(self, run: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("id", "name", "state", "num_examples", "public_key_prefix", "enrolled_unix", "last_seen_unix")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ENROLLED_UNIX_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    state: str
    num_examples: int
    public_key_prefix: str
    enrolled_unix: float
    last_seen_unix: float
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., num_examples: _Optional[int] = ..., public_key_prefix: _Optional[str] = ..., enrolled_unix: _Optional[float] = ..., last_seen_unix: _Optional[float] = ...) -> None: ...

class DeviceList(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    def __init__(self, devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ...) -> None: ...

class DeviceRef(_message.Message):
    __slots__ = ("run", "id")
    RUN_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    run: str
    id: str
    def __init__(self, run: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class CreateTokensRequest(_message.Message):
    __slots__ = ("count", "expires_seconds", "run_name", "max_examples", "note")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    count: int
    expires_seconds: float
    run_name: str
    max_examples: int
    note: str
    def __init__(self, count: _Optional[int] = ..., expires_seconds: _Optional[float] = ..., run_name: _Optional[str] = ..., max_examples: _Optional[int] = ..., note: _Optional[str] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("id", "state", "run_name", "expires_unix", "note", "secret")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    run_name: str
    expires_unix: float
    note: str
    secret: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., run_name: _Optional[str] = ..., expires_unix: _Optional[float] = ..., note: _Optional[str] = ..., secret: _Optional[str] = ...) -> None: ...

class TokenList(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ("limit", "all")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    limit: int
    all: bool
    def __init__(self, limit: _Optional[int] = ..., all: bool = ...) -> None: ...

class TokenRef(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class OperatorRef(_message.Message):
    __slots__ = ("fingerprint", "name")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    name: str
    def __init__(self, fingerprint: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class AuditRequest(_message.Message):
    __slots__ = ("limit", "refused_only", "method", "before_unix")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_ONLY_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    BEFORE_UNIX_FIELD_NUMBER: _ClassVar[int]
    limit: int
    refused_only: bool
    method: str
    before_unix: float
    def __init__(self, limit: _Optional[int] = ..., refused_only: bool = ..., method: _Optional[str] = ..., before_unix: _Optional[float] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("at_unix", "operator", "role", "fingerprint", "method", "target", "result", "run_id")
    AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    at_unix: float
    operator: str
    role: str
    fingerprint: str
    method: str
    target: str
    result: str
    run_id: str
    def __init__(self, at_unix: _Optional[float] = ..., operator: _Optional[str] = ..., role: _Optional[str] = ..., fingerprint: _Optional[str] = ..., method: _Optional[str] = ..., target: _Optional[str] = ..., result: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class AuditList(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...

class LogRequest(_message.Message):
    __slots__ = ("run", "after_id", "tail", "follow", "from_start")
    RUN_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    FROM_START_FIELD_NUMBER: _ClassVar[int]
    run: str
    after_id: int
    tail: int
    follow: bool
    from_start: bool
    def __init__(self, run: _Optional[str] = ..., after_id: _Optional[int] = ..., tail: _Optional[int] = ..., follow: bool = ..., from_start: bool = ...) -> None: ...

class LogEvent(_message.Message):
    __slots__ = ("id", "at_unix", "round", "client", "kind", "level", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    at_unix: float
    round: int
    client: str
    kind: str
    level: str
    message: str
    def __init__(self, id: _Optional[int] = ..., at_unix: _Optional[float] = ..., round: _Optional[int] = ..., client: _Optional[str] = ..., kind: _Optional[str] = ..., level: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Identity(_message.Message):
    __slots__ = ("name", "role", "fingerprint")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    fingerprint: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., fingerprint: _Optional[str] = ...) -> None: ...
