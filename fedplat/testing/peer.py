"""Gossip peers' wire protocol by hand: a valid, signed request of every
``Peer`` call (what a structure-aware fuzzer mutates) and raw calls that send
arbitrary bytes to any call, as any member or none. Used by the gossip tests and
meant for the fuzzing benchmark (``bench/fuzz.py``)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from fedplat.compression import dense_payload
from fedplat.gossip.client import channel_options
from fedplat.gossip.pki import ClusterFiles
from fedplat.gossip.server import SERVICE
from fedplat.gossip.signing import Signer
from fedplat.gossip.tls import PeerTls, open_channel
from fedplat.proto import peer_pb2 as pb
from fedplat.proto import peer_serde as serde
from fedplat.protocol.peer import Hello, ModelHeader, ModelMessage, PeerAddress
from fedplat.vectors import Layout

__all__ = [
    "PEER_RPCS",
    "PeerRequests",
    "member_tls",
    "mutate_messages",
    "raw_channel",
    "send_raw",
    "valid_peer_requests",
]

#: Each call's path and whether its request is a stream.
PEER_RPCS: dict[str, bool] = {
    "Hello": False,
    "Ping": False,
    "PushModel": True,
    "PullModel": False,
    "GetStatus": False,
}


def member_tls(files: ClusterFiles, node_id: str) -> PeerTls | None:
    """A member's (or observer's) TLS files; ``None`` for an insecure cluster."""
    if not files.tls:
        return None
    return PeerTls.load(files.ca, files.cert(node_id), files.key(node_id))


@dataclass(frozen=True)
class PeerRequests:
    """One valid, signed request of each ``Peer`` call."""

    hello: pb.HelloRequest
    ping: pb.PingRequest
    push: list[pb.ModelChunk]
    pull: pb.PullRequest
    status: pb.StatusRequest

    def serialized(self) -> dict[str, list[bytes]]:
        """Call name -> its request messages as bytes (a stream for PushModel)."""
        return {
            "Hello": [self.hello.SerializeToString()],
            "Ping": [self.ping.SerializeToString()],
            "PushModel": [c.SerializeToString() for c in self.push],
            "PullModel": [self.pull.SerializeToString()],
            "GetStatus": [self.status.SerializeToString()],
        }


def valid_peer_requests(
    files: ClusterFiles,
    sender_id: str,
    receiver_id: str,
    layout: Layout,
    *,
    round: int = 0,
    sender_address: str = "127.0.0.1:1",
    vec: torch.Tensor | None = None,
    chunk_bytes: int = 64 * 1024,
    signer: Signer | None = None,
) -> PeerRequests:
    """A valid request of every call from member ``sender_id`` to
    ``receiver_id`` (fresh nonces each time): what a structure-aware fuzzer
    mutates. The push carries ``vec`` (zeros by default) as a dense model.
    ``signer`` replaces the sender's own key (a forger claiming ``sender_id``)."""
    signer = signer or Signer(sender_id, files.identity(sender_id))
    fp = layout.fingerprint()
    hello = signer.hello(
        Hello(PeerAddress(sender_id, sender_address), round, fp, True, receiver_id)
    )
    data = dense_payload(vec if vec is not None else torch.zeros(layout.numel))
    body = data.to_bytes()
    header = signer.model(
        ModelHeader(
            sender_id,
            round,
            layout,
            len(body) // 4,
            1,
            0.0,
            "",
            f"{sender_id}:1",
            len(body),
            hashlib.sha256(body).hexdigest(),
            receiver_id=receiver_id,
        ),
        fp,
    )

    def call(rpc: str) -> pb.CallAuth:
        return serde.call_to_proto(signer.call(rpc, receiver_id, round))

    return PeerRequests(
        hello=serde.hello_to_proto(hello),
        ping=pb.PingRequest(auth=call("ping")),
        push=list(serde.model_to_chunks(ModelMessage(header, body), chunk_bytes)),
        pull=pb.PullRequest(auth=call("pull")),
        status=pb.StatusRequest(auth=call("status")),
    )


def raw_channel(
    files: ClusterFiles, address: str, *, as_id: str | None, server_id: str
) -> grpc.Channel:
    """A channel presenting ``as_id``'s certificate (``None``: plaintext)."""
    tls = None if as_id is None else member_tls(files, as_id)
    return open_channel(address, tls, server_id, channel_options(8 * 1024 * 1024))


def send_raw(
    channel: grpc.Channel, rpc: str, messages: list[bytes], timeout: float = 5.0
) -> tuple[grpc.StatusCode, str]:
    """Send ``messages`` (raw bytes) to ``rpc``; its status code and details."""
    path = f"/{SERVICE}/{rpc}"
    ident: Any = lambda b: b  # noqa: E731 - bytes go out as they are
    try:
        if PEER_RPCS[rpc]:
            channel.stream_unary(path, ident, ident)(iter(messages), timeout=timeout)
        elif rpc == "PullModel":
            for _ in channel.unary_stream(path, ident, ident)(
                messages[0], timeout=timeout
            ):
                pass
        else:
            channel.unary_unary(path, ident, ident)(messages[0], timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def mutate_messages(messages: list[bytes], rng: random.Random) -> list[bytes]:
    """One mutation of a call's serialized messages: flip a bit, cut or grow a
    message, or drop, repeat or swap whole messages of a stream. Applied to
    :func:`valid_peer_requests`, most results are valid protobuf with a broken
    field, signature or stream structure: what the handlers must refuse."""
    out = list(messages)
    i = rng.randrange(len(out))
    m = bytearray(out[i])
    op = rng.choice(["flip", "cut", "grow", "drop", "repeat", "swap"])
    if op == "flip" and m:
        m[rng.randrange(len(m))] ^= 1 << rng.randrange(8)
    elif op == "cut":
        del m[rng.randrange(len(m) + 1) :]
    elif op == "grow":
        m[rng.randrange(len(m) + 1) : 0] = rng.randbytes(rng.randrange(1, 64))
    elif op == "drop" and len(out) > 1:
        del out[i]
        return out
    elif op == "repeat":
        out.insert(i, bytes(m))
    elif op == "swap" and len(out) > 1:
        j = rng.randrange(len(out))
        out[i], out[j] = out[j], out[i]
        return out
    out[i] = bytes(m)
    return out
