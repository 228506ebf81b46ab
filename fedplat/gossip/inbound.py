"""What a peer does with the calls it admitted.

The gRPC layer (:mod:`fedplat.gossip.server`) has already checked who is
calling (membership, certificate, signature, freshness: :mod:`.guard`); these
handlers check what the call asks for. A pushed model is checked before its
body is read (the sender is a neighbour on an uncut link, the layout is this
peer's, the declared size is within the layout's bound) and after (payload
well-formed, right length, finite, against the link reference it names); a bad
one is refused with a reason and the peer keeps its model.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING

import torch

from fedplat.compression import dense_payload
from fedplat.gossip.links import ReferenceMismatch
from fedplat.gossip.membership import Member
from fedplat.proto.peer_serde import check_model_size
from fedplat.protocol.errors import (
    InvalidArgument,
    StaleUpdate,
    UnknownClient,
)
from fedplat.protocol.peer import (
    CallAuth,
    Hello,
    HelloReply,
    ModelHeader,
    ModelMessage,
    PeerAddress,
    PeerStatus,
    PingReply,
    PushReply,
)

if TYPE_CHECKING:
    from fedplat.gossip.node import PeerNode

__all__ = ["Inbound"]


class Inbound:
    """The handlers of one peer's service (called from the server's executor)."""

    def __init__(self, node: PeerNode) -> None:
        self.node = node
        self._pull_cache: tuple[int, bytes, str] | None = None

    # ------------------------------------------------------------ hello, ping
    def on_hello(self, h: Hello, member: Member) -> HelloReply:
        """Link with an admitted member (``h`` is verified to be its own)."""
        node = self.node
        if h.layout_fingerprint != node.fingerprint:
            raise InvalidArgument(
                f"model layout differs (fingerprint {h.layout_fingerprint[:12]}..., "
                f"mine {node.fingerprint[:12]}...)"
            )
        sender = member.node_id
        if sender == node.id:
            raise InvalidArgument(f"peer id {node.id!r} is mine")
        # The membership's address wins; otherwise the member's own signed word.
        # Nobody can announce another member's address: the Hello is signed by,
        # and its certificate names, the member it speaks for.
        address = member.address or h.sender.address
        known = sender in node.table
        linked = h.want_link and (known or len(node.table) < node.config.max_degree)
        if linked:
            if node.table.add(sender, address):
                node.log.info("linked with %s at %s (incoming)", sender, address)
            # A restarted peer starts a new link: forget its old reference.
            node.decoder.forget(sender)
            node.heard(sender, h.round)
        reply = HelloReply(
            PeerAddress(node.id, node.address),
            node.state.round,
            node.fingerprint,
            linked,
            tuple(p for p in node.table.addresses() if p.node_id != sender),
        )
        return node.signer.hello_reply(reply, h.nonce)

    def on_ping(self, c: CallAuth, member: Member) -> PingReply:
        node = self.node
        if member.node_id in node.table:
            node.heard(member.node_id, c.round)
        return PingReply(node.id, node.state.round, max(1, len(node.table.live())))

    # ------------------------------------------------------------ push
    def check_push(self, h: ModelHeader) -> None:
        """Everything about a pushed model that its header alone decides."""
        node = self.node
        if h.sender_id not in node.table:
            raise UnknownClient(
                f"{h.sender_id!r} is not a neighbour of {node.id!r}; say Hello first"
            )
        if node.table.is_blocked(h.sender_id):
            raise UnknownClient(f"link {h.sender_id}-{node.id} is cut")
        mismatch = node.layout.describe_mismatch(h.layout)
        if mismatch:
            raise InvalidArgument(f"wrong model shape: {mismatch}")
        check_model_size(h, node.max_payload_bytes)
        if node.rule.debiased and not h.push_weight > 0:
            raise InvalidArgument("push-sum message without a positive weight")

    def on_push(self, h: ModelHeader, data: bytes | bytearray) -> PushReply:
        """Decode, check and keep a pushed model (header checked already)."""
        node = self.node
        x_hat, version = self._decode(h, data)
        node.decoder.commit(h.sender_id, x_hat, version)
        node.state.deposit(
            h.sender_id, h.round, x_hat, h.num_examples, max(1, h.degree), h.push_weight
        )
        node.state.count_bytes(received=len(data))
        node.table.count_bytes(h.sender_id, received=len(data))
        node.heard(h.sender_id, h.round, h.degree)
        return PushReply(True, "", node.state.round)

    def _decode(
        self, h: ModelHeader, data: bytes | bytearray
    ) -> tuple[torch.Tensor, str]:
        try:
            x_hat, version = self.node.decoder.decode(
                h.sender_id, data, h.base_version, h.version
            )
        except ReferenceMismatch as exc:
            raise StaleUpdate(str(exc)) from None
        except ValueError as exc:  # PayloadError, CompressionError
            raise InvalidArgument(f"bad model payload: {exc}") from None
        if not math.isfinite(float(x_hat.norm())):
            raise InvalidArgument("model norm is not finite")
        return x_hat, version

    def reject(self, reason: str) -> None:
        """Count a refused model (the model is left untouched)."""
        self.node.state.count_rejection(reason)

    # ------------------------------------------------------------ pull, status
    def _published(self) -> tuple[int, bytes, str]:
        """The published model's payload, encoded once per version."""
        st = self.node.state
        with st.lock:
            version, x, r = st.published_version, st.published, st.round
        cached = self._pull_cache
        if cached is None or cached[0] != version:
            data = dense_payload(x).to_bytes()
            cached = self._pull_cache = (
                version,
                data,
                hashlib.sha256(data).hexdigest(),
            )
        return r, cached[1], cached[2]

    def on_pull(self, c: CallAuth, member: Member) -> ModelMessage:
        """The published model, signed for ``member`` and this request's nonce."""
        node = self.node
        if not member.observer:
            if node.table.is_blocked(member.node_id):
                raise UnknownClient(f"link {member.node_id}-{node.id} is cut")
            if member.node_id not in node.table:
                raise UnknownClient(
                    f"{member.node_id!r} is not a neighbour of {node.id!r}; "
                    "say Hello first"
                )
            node.heard(member.node_id)
        r, data, digest = self._published()
        header = ModelHeader(
            node.id,
            r,
            node.layout,
            node.num_examples,
            max(1, len(node.table.live())),
            0.0,
            "",
            "pull",
            len(data),
            digest,
            receiver_id=member.node_id,
        )
        header = node.signer.model(header, node.fingerprint, nonce=c.nonce)
        node.table.count_bytes(member.node_id, sent=len(data))
        node.state.count_bytes(sent=len(data))
        return ModelMessage(header, data)

    def status(self) -> PeerStatus:
        node = self.node
        st = node.state
        with st.lock:
            digest = hashlib.sha256(st.x.numpy().tobytes()).hexdigest()
            return PeerStatus(
                node_id=node.id,
                round=st.round,
                finished=st.finished,
                accuracy=st.accuracy,
                num_examples=node.num_examples,
                model_sha256=digest,
                rejected=st.rejected,
                last_rejection=st.last_rejection,
                bytes_sent=st.bytes_sent,
                bytes_received=st.bytes_received,
                consensus_gap=st.consensus_gap,
                neighbours=tuple(node.table.views()),
                refused=node.refusals.counts(),
            )
