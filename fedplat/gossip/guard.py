"""Admission of every call a peer receives: membership, identity, signature,
freshness, all decided before a message's body is read.

A call is admitted when, in this order:

1. the connection's certificate names a member (mutual TLS; skipped only under
   ``--insecure``), is a peer certificate for that id (an observer's may be a
   client certificate), and matches the fingerprint the membership pins;
2. the id the message claims is the certificate's (a member cannot speak as
   another) and belongs to the membership (peers only, for ``Hello`` and
   ``PushModel``);
3. the message is for this peer (its signed receiver id);
4. its signature verifies with the member's pinned Ed25519 key;
5. it is fresh (:class:`~fedplat.gossip.signing.ReplayGuard`) and, for a model,
   not older than the last round accepted from that sender.

Steps 1-4 fail with :class:`~fedplat.gossip.errors.PermissionDenied`, step 5
with :class:`~fedplat.protocol.errors.StaleUpdate` (``FAILED_PRECONDITION``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fedplat.gossip.membership import Member, Membership
from fedplat.gossip.signing import (
    ReplayGuard,
    call_signed_by,
    hello_signed_by,
    model_signed_by,
)
from fedplat.protocol.errors import PermissionDenied, StaleUpdate
from fedplat.protocol.peer import CallAuth, Hello, ModelHeader
from fedplat.security.certs import CertInfo, peer_dns_name

__all__ = ["Admission"]


class Admission:
    """Decides whether a call to peer ``node_id`` is admitted.

    Parameters
    ----------
    node_id : str
        This peer.
    membership : Membership
    tls : bool
        Whether callers present certificates (``False`` only under
        ``--insecure``: then signatures alone identify callers).
    replay_window_s : float
        Accepted clock difference, seconds (see
        :class:`~fedplat.gossip.signing.ReplayGuard`).
    clock : callable
        Wall clock in seconds.
    """

    def __init__(
        self,
        node_id: str,
        membership: Membership,
        *,
        tls: bool,
        replay_window_s: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.membership = membership
        self.tls = tls
        self._replays = ReplayGuard(replay_window_s, clock=clock)
        self._rounds: dict[str, int] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ identity
    def connection(self, cert: CertInfo | None) -> Member | None:
        """Step 1: the member the connection's certificate names (``None``
        without TLS). Checked before any message is read."""
        if not self.tls:
            return None
        if cert is None:
            raise PermissionDenied("no client certificate")
        member = self.membership.get(cert.common_name)
        if member is None:
            raise PermissionDenied(
                f"certificate {cert.common_name!r} is not a member of this deployment"
            )
        if member.observer:
            if not cert.client_auth:
                raise PermissionDenied(f"{member.node_id!r}: not a client certificate")
        elif not (
            cert.server_auth
            and cert.client_auth
            and peer_dns_name(member.node_id) in cert.dns_names
        ):
            raise PermissionDenied(
                f"certificate {cert.common_name!r} is not a peer certificate "
                "(make one with `fedplat certs peer`)"
            )
        if member.cert_sha256 and member.cert_sha256 != cert.fingerprint:
            raise PermissionDenied(
                f"certificate of {member.node_id!r} is not the one the membership pins"
            )
        return member

    def claimant(
        self, claimed: str, cert: CertInfo | None, *, observers: bool
    ) -> Member:
        """Step 2: the member a message claims to come from."""
        holder = self.connection(cert)
        if holder is not None and holder.node_id != claimed:
            raise PermissionDenied(
                f"the certificate of {holder.node_id!r} cannot speak as {claimed!r}"
            )
        member = self.membership.get(claimed)
        if member is None:
            raise PermissionDenied(f"{claimed!r} is not a member of this deployment")
        if member.observer and not observers:
            raise PermissionDenied(f"{claimed!r} is an observer, not a peer")
        return member

    def _for_me(self, receiver_id: str, *, empty_ok: bool = False) -> None:
        if receiver_id == self.node_id or (empty_ok and not receiver_id):
            return
        raise PermissionDenied(
            f"message is signed for peer {receiver_id!r}, not {self.node_id!r}"
        )

    def _fresh(self, sender: str, timestamp_ms: int, nonce: bytes) -> None:
        with self._lock:
            why = self._replays.admit(sender, timestamp_ms, nonce)
        if why is not None:
            raise StaleUpdate(why)

    # ------------------------------------------------------------ messages
    def hello(self, h: Hello, cert: CertInfo | None) -> Member:
        """Admit a ``Hello``; a fresh one restarts the sender's round count."""
        m = self.claimant(h.sender.node_id, cert, observers=False)
        self._for_me(h.receiver_id, empty_ok=True)
        if not hello_signed_by(m.public_key, h):
            raise PermissionDenied(f"bad hello signature for {m.node_id!r}")
        self._fresh(m.node_id, h.timestamp_ms, h.nonce)
        with self._lock:
            self._rounds[m.node_id] = h.round  # a restarted peer counts anew
        return m

    def call(self, rpc: str, c: CallAuth, cert: CertInfo | None) -> Member:
        """Admit a ``Ping``/``PullModel``/``GetStatus`` (observers allowed)."""
        m = self.claimant(c.sender_id, cert, observers=True)
        self._for_me(c.receiver_id)
        if not call_signed_by(m.public_key, rpc, c):
            raise PermissionDenied(f"bad {rpc} signature for {m.node_id!r}")
        self._fresh(m.node_id, c.timestamp_ms, c.nonce)
        return m

    def model(self, h: ModelHeader, cert: CertInfo | None, fingerprint: str) -> Member:
        """Admit a pushed model's header (``fingerprint``: the receiver's layout,
        already found equal to the header's)."""
        m = self.claimant(h.sender_id, cert, observers=False)
        self._for_me(h.receiver_id)
        if not model_signed_by(m.public_key, h, fingerprint):
            raise PermissionDenied(f"bad model signature for {m.node_id!r}")
        with self._lock:
            last = self._rounds.get(m.node_id, 0)
        if h.round < last:
            raise StaleUpdate(
                f"round {h.round} is older than round {last} already accepted from "
                f"{m.node_id!r} (a replay?)"
            )
        self._fresh(m.node_id, h.timestamp_ms, h.nonce)
        return m

    def accepted_model(self, sender: str, round: int) -> None:
        """A model of ``round`` from ``sender`` was accepted: older ones are not."""
        with self._lock:
            self._rounds[sender] = max(self._rounds.get(sender, 0), round)
