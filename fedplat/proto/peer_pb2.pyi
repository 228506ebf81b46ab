from fedplat.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerInfo(_message.Message):
    __slots__ = ("node_id", "address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("sender", "round", "layout_fingerprint", "want_link", "receiver_id", "timestamp_ms", "nonce", "signature")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    WANT_LINK_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    sender: PeerInfo
    round: int
    layout_fingerprint: str
    want_link: bool
    receiver_id: str
    timestamp_ms: int
    nonce: bytes
    signature: bytes
    def __init__(self, sender: _Optional[_Union[PeerInfo, _Mapping]] = ..., round: _Optional[int] = ..., layout_fingerprint: _Optional[str] = ..., want_link: bool = ..., receiver_id: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ("responder", "round", "layout_fingerprint", "linked", "known", "request_nonce", "signature")
    RESPONDER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LINKED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    responder: PeerInfo
    round: int
    layout_fingerprint: str
    linked: bool
    known: _containers.RepeatedCompositeFieldContainer[PeerInfo]
    request_nonce: bytes
    signature: bytes
    def __init__(self, responder: _Optional[_Union[PeerInfo, _Mapping]] = ..., round: _Optional[int] = ..., layout_fingerprint: _Optional[str] = ..., linked: bool = ..., known: _Optional[_Iterable[_Union[PeerInfo, _Mapping]]] = ..., request_nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class CallAuth(_message.Message):
    __slots__ = ("sender_id", "receiver_id", "round", "timestamp_ms", "nonce", "signature")
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    sender_id: str
    receiver_id: str
    round: int
    timestamp_ms: int
    nonce: bytes
    signature: bytes
    def __init__(self, sender_id: _Optional[str] = ..., receiver_id: _Optional[str] = ..., round: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("auth",)
    AUTH_FIELD_NUMBER: _ClassVar[int]
    auth: CallAuth
    def __init__(self, auth: _Optional[_Union[CallAuth, _Mapping]] = ...) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("node_id", "round", "degree")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DEGREE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    round: int
    degree: int
    def __init__(self, node_id: _Optional[str] = ..., round: _Optional[int] = ..., degree: _Optional[int] = ...) -> None: ...

class ModelHeader(_message.Message):
    __slots__ = ("sender_id", "round", "layout", "num_examples", "degree", "push_weight", "base_version", "version", "total_bytes", "sha256", "receiver_id", "timestamp_ms", "nonce", "signature")
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    DEGREE_FIELD_NUMBER: _ClassVar[int]
    PUSH_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    sender_id: str
    round: int
    layout: _common_pb2.Layout
    num_examples: int
    degree: int
    push_weight: float
    base_version: str
    version: str
    total_bytes: int
    sha256: str
    receiver_id: str
    timestamp_ms: int
    nonce: bytes
    signature: bytes
    def __init__(self, sender_id: _Optional[str] = ..., round: _Optional[int] = ..., layout: _Optional[_Union[_common_pb2.Layout, _Mapping]] = ..., num_examples: _Optional[int] = ..., degree: _Optional[int] = ..., push_weight: _Optional[float] = ..., base_version: _Optional[str] = ..., version: _Optional[str] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., receiver_id: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: ModelHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[ModelHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("accepted", "reason", "round")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    round: int
    def __init__(self, accepted: bool = ..., reason: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("auth",)
    AUTH_FIELD_NUMBER: _ClassVar[int]
    auth: CallAuth
    def __init__(self, auth: _Optional[_Union[CallAuth, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("auth",)
    AUTH_FIELD_NUMBER: _ClassVar[int]
    auth: CallAuth
    def __init__(self, auth: _Optional[_Union[CallAuth, _Mapping]] = ...) -> None: ...

class NeighbourStatus(_message.Message):
    __slots__ = ("node_id", "address", "alive", "blocked", "round", "seconds_since_seen", "bytes_sent", "bytes_received")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_SEEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    alive: bool
    blocked: bool
    round: int
    seconds_since_seen: float
    bytes_sent: int
    bytes_received: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., alive: bool = ..., blocked: bool = ..., round: _Optional[int] = ..., seconds_since_seen: _Optional[float] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("node_id", "round", "finished", "accuracy", "num_examples", "model_sha256", "rejected", "last_rejection", "neighbours", "bytes_sent", "bytes_received", "consensus_gap", "refused")
    class RefusedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_REJECTION_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    CONSENSUS_GAP_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    round: int
    finished: bool
    accuracy: float
    num_examples: int
    model_sha256: str
    rejected: int
    last_rejection: str
    neighbours: _containers.RepeatedCompositeFieldContainer[NeighbourStatus]
    bytes_sent: int
    bytes_received: int
    consensus_gap: float
    refused: _containers.ScalarMap[str, int]
    def __init__(self, node_id: _Optional[str] = ..., round: _Optional[int] = ..., finished: bool = ..., accuracy: _Optional[float] = ..., num_examples: _Optional[int] = ..., model_sha256: _Optional[str] = ..., rejected: _Optional[int] = ..., last_rejection: _Optional[str] = ..., neighbours: _Optional[_Iterable[_Union[NeighbourStatus, _Mapping]]] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., consensus_gap: _Optional[float] = ..., refused: _Optional[_Mapping[str, int]] = ...) -> None: ...
