"""Thin gRPC servicer of the ``Peer`` service: convert, delegate, map errors.

All logic lives in :class:`fedplat.gossip.node.PeerNode`; domain errors become
status codes with their reason (``INVALID_ARGUMENT`` for a bad model,
``FAILED_PRECONDITION`` for a stale link reference or a cut link).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn, TypeVar

import grpc

from fedplat.gossip import serde
from fedplat.proto import peer_pb2 as pb
from fedplat.proto import peer_pb2_grpc as pb_grpc
from fedplat.transport.errors import FedplatError, InvalidArgument
from fedplat.transport.status import STATUS_BY_CODE

if TYPE_CHECKING:
    from fedplat.gossip.node import PeerNode

log = logging.getLogger("fedplat.gossip.grpc")
T = TypeVar("T")


def _abort(context: grpc.ServicerContext, exc: FedplatError) -> NoReturn:
    context.abort(STATUS_BY_CODE.get(exc.code, grpc.StatusCode.INTERNAL), exc.reason)
    raise AssertionError("unreachable")  # context.abort raises


class PeerServicer(pb_grpc.PeerServicer):
    def __init__(self, node: PeerNode) -> None:
        self.node = node

    def _guard(self, context: grpc.ServicerContext, rpc: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except FedplatError as exc:
            log.debug("%s refused (%s): %s", rpc, exc.code, exc.reason)
            _abort(context, exc)
        except Exception:
            # A bug must not take the peer down; the caller sees INTERNAL.
            log.exception("%s failed", rpc)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {rpc}")
            raise

    def Hello(
        self, request: pb.HelloRequest, context: grpc.ServicerContext
    ) -> pb.HelloResponse:
        return self._guard(
            context,
            "Hello",
            lambda: serde.hello_reply_to_proto(
                self.node.on_hello(serde.hello_from_proto(request))
            ),
        )

    def Ping(
        self, request: pb.PingRequest, context: grpc.ServicerContext
    ) -> pb.PingResponse:
        return self._guard(
            context,
            "Ping",
            lambda: serde.ping_reply_to_proto(
                self.node.on_ping(request.sender_id, int(request.round))
            ),
        )

    def PushModel(
        self, request_iterator: Iterator[pb.ModelChunk], context: grpc.ServicerContext
    ) -> pb.PushAck:
        def handle() -> pb.PushAck:
            try:
                msg = serde.model_from_chunks(
                    request_iterator, self.node.config.max_model_bytes
                )
            except InvalidArgument as exc:
                self.node.reject(exc.reason)
                raise
            return serde.push_reply_to_proto(self.node.on_push(msg))

        return self._guard(context, "PushModel", handle)

    def PullModel(
        self, request: pb.PullRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ModelChunk]:
        msg = self._guard(
            context, "PullModel", lambda: self.node.on_pull(request.sender_id)
        )
        yield from serde.model_to_chunks(msg, self.node.config.chunk_bytes)

    def GetStatus(
        self, request: pb.StatusRequest, context: grpc.ServicerContext
    ) -> pb.StatusResponse:
        return self._guard(
            context, "GetStatus", lambda: serde.status_to_proto(self.node.status())
        )
