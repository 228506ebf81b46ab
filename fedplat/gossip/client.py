"""Client side of the peer protocol: one channel to one peer.

gRPC errors come back as :mod:`fedplat.transport.errors` (``InvalidArgument``,
``StaleUpdate``, ``Unavailable``, ...) with the peer's reason, exactly as the
coordinator's client sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

from fedplat.gossip import serde
from fedplat.gossip.messages import (
    Hello,
    HelloReply,
    ModelMessage,
    PeerStatus,
    PingReply,
    PushReply,
)
from fedplat.proto import peer_pb2 as pb
from fedplat.proto import peer_pb2_grpc as pb_grpc
from fedplat.transport.status import error_from_rpc

__all__ = ["PeerClient", "channel_options"]

T = TypeVar("T")
MiB = 1024 * 1024


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.enable_retries", 0),
        # Reconnect quickly to a restarted peer (the default backoff reaches 120 s).
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


class PeerClient:
    """Calls to one peer (plaintext on a trusted network; see ``docs/gossip.md``).

    Parameters
    ----------
    address : str
        ``host:port``.
    timeout : float
        Deadline of each call, seconds.
    chunk_bytes : int
        Payload bytes per stream message (below the peer's message limit).
    max_model_bytes : int
        Largest model accepted from :meth:`pull`.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 5.0,
        chunk_bytes: int = 1 * MiB,
        max_model_bytes: int = 256 * MiB,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes
        self.max_model_bytes = max_model_bytes
        self.channel = grpc.insecure_channel(
            address, options=channel_options(chunk_bytes + 4 * MiB)
        )
        self.stub = pb_grpc.PeerStub(self.channel)

    @staticmethod
    def _call(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def hello(self, h: Hello) -> HelloReply:
        msg = serde.hello_to_proto(h)
        return serde.hello_reply_from_proto(
            self._call(lambda: self.stub.Hello(msg, timeout=self.timeout))
        )

    def ping(self, sender_id: str, round: int) -> PingReply:
        req = pb.PingRequest(sender_id=sender_id, round=round)
        return serde.ping_reply_from_proto(
            self._call(lambda: self.stub.Ping(req, timeout=self.timeout))
        )

    def push(self, msg: ModelMessage) -> PushReply:
        return serde.push_reply_from_proto(
            self._call(
                lambda: self.stub.PushModel(
                    serde.model_to_chunks(msg, self.chunk_bytes), timeout=self.timeout
                )
            )
        )

    def push_chunks(self, chunks: list[pb.ModelChunk]) -> PushReply:
        """Send raw chunks (tests use it to send malformed streams)."""
        return serde.push_reply_from_proto(
            self._call(lambda: self.stub.PushModel(iter(chunks), timeout=self.timeout))
        )

    def pull(self, sender_id: str) -> ModelMessage:
        req = pb.PullRequest(sender_id=sender_id)
        return self._call(
            lambda: serde.model_from_chunks(
                self.stub.PullModel(req, timeout=self.timeout), self.max_model_bytes
            )
        )

    def status(self) -> PeerStatus:
        return serde.status_from_proto(
            self._call(
                lambda: self.stub.GetStatus(pb.StatusRequest(), timeout=self.timeout)
            )
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> PeerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
