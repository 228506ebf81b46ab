"""Client side of the peer protocol: signed calls to one peer, verified answers.

A :class:`PeerClient` talks to one peer over mutual TLS (checking that the
callee's certificate names the node it means to reach) or, explicitly insecure,
plaintext. It signs every request with the caller's identity
(:class:`~fedplat.gossip.signing.Signer`) and checks every answer that carries
state: a ``Hello`` answer and a pulled model must be signed by the callee's
pinned key and repeat the request's nonce. gRPC errors come back as
:mod:`fedplat.protocol.errors` (``InvalidArgument``, ``PermissionDenied``,
``StaleUpdate``, ``Unavailable``, ...) with the peer's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import grpc

from fedplat.gossip.membership import Member, Membership
from fedplat.gossip.signing import Signer, hello_reply_signed_by, model_signed_by
from fedplat.gossip.tls import PeerTls, open_channel
from fedplat.proto import peer_pb2 as pb
from fedplat.proto import peer_pb2_grpc as pb_grpc
from fedplat.proto import peer_serde as serde
from fedplat.protocol.errors import PermissionDenied
from fedplat.protocol.peer import (
    Hello,
    HelloReply,
    ModelHeader,
    ModelMessage,
    PeerAddress,
    PeerStatus,
    PingReply,
    PushReply,
)
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
    """Signed calls to one peer.

    Parameters
    ----------
    address : str
        ``host:port``.
    signer : Signer
        The caller's identity.
    membership : Membership
        Pinned keys, to verify answers.
    server_id : str, optional
        The node expected at ``address``; ``None`` when only the address is
        known (a seed): the first verified ``Hello`` answer tells.
    tls : PeerTls, optional
        ``None`` only for an explicitly insecure deployment.
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
        signer: Signer,
        membership: Membership,
        server_id: str | None = None,
        tls: PeerTls | None = None,
        timeout: float = 5.0,
        chunk_bytes: int = 1 * MiB,
        max_model_bytes: int = 256 * MiB,
    ) -> None:
        self.address = address
        self.signer = signer
        self.membership = membership
        self.server_id = server_id
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes
        self.max_model_bytes = max_model_bytes
        self.channel = open_channel(
            address, tls, server_id, channel_options(chunk_bytes + 4 * MiB)
        )
        self.stub = pb_grpc.PeerStub(self.channel)

    @staticmethod
    def _call(fn: Callable[[], T]) -> T:
        try:
            return fn()
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def _server(self, node_id: str) -> Member:
        """The pinned entry of the peer that answered as ``node_id``."""
        if self.server_id is not None and node_id != self.server_id:
            raise PermissionDenied(
                f"{self.address} answered as {node_id!r}, expected {self.server_id!r}"
            )
        member = self.membership.peer(node_id)
        if member is None:
            raise PermissionDenied(f"{self.address} answered as non-member {node_id!r}")
        return member

    def hello(
        self, me: PeerAddress, round: int, fingerprint: str, want_link: bool = True
    ) -> HelloReply:
        """Introduce ourselves; the answer is verified (its sender and nonce)."""
        h = self.signer.hello(
            Hello(me, round, fingerprint, want_link, self.server_id or "")
        )
        msg = serde.hello_to_proto(h)
        reply = serde.hello_reply_from_proto(
            self._call(lambda: self.stub.Hello(msg, timeout=self.timeout))
        )
        member = self._server(reply.responder.node_id)
        if reply.request_nonce != h.nonce or not hello_reply_signed_by(
            member.public_key, reply
        ):
            raise PermissionDenied(
                f"hello answer from {member.node_id!r} is not signed by it"
            )
        return reply

    def ping(self, round: int) -> PingReply:
        req = pb.PingRequest(
            auth=serde.call_to_proto(
                self.signer.call("ping", self.server_id or "", round)
            )
        )
        return serde.ping_reply_from_proto(
            self._call(lambda: self.stub.Ping(req, timeout=self.timeout))
        )

    def push(self, header: ModelHeader, data: bytes, fingerprint: str) -> PushReply:
        """Sign ``header`` (for this client's peer) and stream it with ``data``."""
        h = self.signer.model(
            replace(header, receiver_id=self.server_id or ""), fingerprint
        )
        return self.push_chunks(
            list(serde.model_to_chunks(ModelMessage(h, data), self.chunk_bytes))
        )

    def push_chunks(self, chunks: list[pb.ModelChunk]) -> PushReply:
        """Send chunks as they are (tests send malformed or forged streams)."""
        return serde.push_reply_from_proto(
            self._call(lambda: self.stub.PushModel(iter(chunks), timeout=self.timeout))
        )

    def pull(self, round: int = 0) -> ModelMessage:
        """The peer's current model; verified to be its answer to this request."""
        auth = self.signer.call("pull", self.server_id or "", round)
        req = pb.PullRequest(auth=serde.call_to_proto(auth))
        msg = self._call(
            lambda: serde.model_from_chunks(
                self.stub.PullModel(req, timeout=self.timeout), self.max_model_bytes
            )
        )
        h = msg.header
        member = self._server(h.sender_id)
        if (
            h.receiver_id != self.signer.node_id
            or h.nonce != auth.nonce
            or not model_signed_by(member.public_key, h, h.layout.fingerprint())
        ):
            raise PermissionDenied(
                f"pulled model from {member.node_id!r} is not its signed answer to "
                "this request"
            )
        return msg

    def status(self) -> PeerStatus:
        auth = self.signer.call("status", self.server_id or "", 0)
        req = pb.StatusRequest(auth=serde.call_to_proto(auth))
        return serde.status_from_proto(
            self._call(lambda: self.stub.GetStatus(req, timeout=self.timeout))
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> PeerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
