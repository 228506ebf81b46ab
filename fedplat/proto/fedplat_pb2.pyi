from fedplat.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChallengeRequest(_message.Message):
    __slots__ = ("client_id",)
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    def __init__(self, client_id: _Optional[str] = ...) -> None: ...

class ChallengeResponse(_message.Message):
    __slots__ = ("challenge", "expires_unix")
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    challenge: bytes
    expires_unix: float
    def __init__(self, challenge: _Optional[bytes] = ..., expires_unix: _Optional[float] = ...) -> None: ...

class EnrollRequest(_message.Message):
    __slots__ = ("name", "num_examples", "layout", "client_id", "info", "public_key", "challenge", "signature", "enrolment_token")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ENROLMENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_examples: int
    layout: _common_pb2.Layout
    client_id: str
    info: _containers.ScalarMap[str, str]
    public_key: bytes
    challenge: bytes
    signature: bytes
    enrolment_token: str
    def __init__(self, name: _Optional[str] = ..., num_examples: _Optional[int] = ..., layout: _Optional[_Union[_common_pb2.Layout, _Mapping]] = ..., client_id: _Optional[str] = ..., info: _Optional[_Mapping[str, str]] = ..., public_key: _Optional[bytes] = ..., challenge: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., enrolment_token: _Optional[str] = ...) -> None: ...

class EnrollResponse(_message.Message):
    __slots__ = ("client_id", "token", "run_id", "run_name", "layout", "max_message_bytes", "max_update_bytes", "session_expires_unix")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_UPDATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    token: str
    run_id: str
    run_name: str
    layout: _common_pb2.Layout
    max_message_bytes: int
    max_update_bytes: int
    session_expires_unix: float
    def __init__(self, client_id: _Optional[str] = ..., token: _Optional[str] = ..., run_id: _Optional[str] = ..., run_name: _Optional[str] = ..., layout: _Optional[_Union[_common_pb2.Layout, _Mapping]] = ..., max_message_bytes: _Optional[int] = ..., max_update_bytes: _Optional[int] = ..., session_expires_unix: _Optional[float] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("wait_seconds",)
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    wait_seconds: float
    def __init__(self, wait_seconds: _Optional[float] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("kind", "run_id", "round", "task_id", "model_version", "deadline_unix", "config_json", "retry_after", "nonce")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Task.Kind]
        WAIT: _ClassVar[Task.Kind]
        TRAIN: _ClassVar[Task.Kind]
        FINISHED: _ClassVar[Task.Kind]
    KIND_UNSPECIFIED: Task.Kind
    WAIT: Task.Kind
    TRAIN: Task.Kind
    FINISHED: Task.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    kind: Task.Kind
    run_id: str
    round: int
    task_id: str
    model_version: int
    deadline_unix: float
    config_json: str
    retry_after: float
    nonce: bytes
    def __init__(self, kind: _Optional[_Union[Task.Kind, str]] = ..., run_id: _Optional[str] = ..., round: _Optional[int] = ..., task_id: _Optional[str] = ..., model_version: _Optional[int] = ..., deadline_unix: _Optional[float] = ..., config_json: _Optional[str] = ..., retry_after: _Optional[float] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class ModelHeader(_message.Message):
    __slots__ = ("model_version", "round", "layout", "total_bytes", "sha256", "encoding")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    round: int
    layout: _common_pb2.Layout
    total_bytes: int
    sha256: str
    encoding: str
    def __init__(self, model_version: _Optional[int] = ..., round: _Optional[int] = ..., layout: _Optional[_Union[_common_pb2.Layout, _Mapping]] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., encoding: _Optional[str] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: ModelHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[ModelHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("task_id", "round", "num_examples", "layout", "encoding", "encoding_params", "total_bytes", "sha256", "metrics", "signature")
    class EncodingParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    ENCODING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    round: int
    num_examples: int
    layout: _common_pb2.Layout
    encoding: str
    encoding_params: _containers.ScalarMap[str, str]
    total_bytes: int
    sha256: str
    metrics: _containers.ScalarMap[str, float]
    signature: bytes
    def __init__(self, task_id: _Optional[str] = ..., round: _Optional[int] = ..., num_examples: _Optional[int] = ..., layout: _Optional[_Union[_common_pb2.Layout, _Mapping]] = ..., encoding: _Optional[str] = ..., encoding_params: _Optional[_Mapping[str, str]] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., signature: _Optional[bytes] = ...) -> None: ...

class UpdateChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: UpdateHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[UpdateHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadAck(_message.Message):
    __slots__ = ("accepted", "message", "bytes_received")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    bytes_received: int
    def __init__(self, accepted: bool = ..., message: _Optional[str] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class MetricsReport(_message.Message):
    __slots__ = ("task_id", "round", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    round: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, task_id: _Optional[str] = ..., round: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class MetricsAck(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: bool = ...) -> None: ...

class SecAggRequest(_message.Message):
    __slots__ = ("task_id", "round", "message", "signature", "wait_seconds")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    round: int
    message: bytes
    signature: bytes
    wait_seconds: float
    def __init__(self, task_id: _Optional[str] = ..., round: _Optional[int] = ..., message: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class SecAggReply(_message.Message):
    __slots__ = ("kind", "message", "reason")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[SecAggReply.Kind]
        WAIT: _ClassVar[SecAggReply.Kind]
        MESSAGE: _ClassVar[SecAggReply.Kind]
        DONE: _ClassVar[SecAggReply.Kind]
    KIND_UNSPECIFIED: SecAggReply.Kind
    WAIT: SecAggReply.Kind
    MESSAGE: SecAggReply.Kind
    DONE: SecAggReply.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: SecAggReply.Kind
    message: bytes
    reason: str
    def __init__(self, kind: _Optional[_Union[SecAggReply.Kind, str]] = ..., message: _Optional[bytes] = ..., reason: _Optional[str] = ...) -> None: ...
