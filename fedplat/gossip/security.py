"""What a peer needs to be admitted and to admit others: its identity key, the
membership, and (unless explicitly insecure) its TLS certificate.

:func:`load_peer_security` reads them from files and checks that they agree
before the peer starts: the membership lists this node as a peer, pins this
identity's public key, and (with TLS) the certificate is a peer certificate for
this node id and the one the membership pins. Each problem is one line.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from fedplat.gossip.membership import Membership, MembershipError, load_membership
from fedplat.gossip.tls import PeerTls
from fedplat.security.certs import CertError, peer_dns_name
from fedplat.security.identity import Identity
from fedplat.security.keys import KeyFileError

__all__ = [
    "IDENTITY_FILE",
    "PeerSecurity",
    "SecurityError",
    "identity_path",
    "load_peer_security",
    "warn_if_insecure",
]

IDENTITY_FILE = "peer-identity.key"
log = logging.getLogger("fedplat.gossip.security")


class SecurityError(ValueError):
    """Identity, membership and certificate do not fit together (one line)."""


def identity_path(state_dir: str | os.PathLike[str]) -> Path:
    """Where a peer keeps its Ed25519 identity key inside its state folder."""
    return Path(state_dir) / IDENTITY_FILE


@dataclass(frozen=True)
class PeerSecurity:
    """Identity key, membership and TLS files of one peer.

    Attributes
    ----------
    identity : Identity
    membership : Membership
    tls : PeerTls or None
        ``None`` only for an explicitly insecure (plaintext) peer.
    replay_window_s : float
        Largest accepted clock difference between peers, seconds.
    """

    identity: Identity
    membership: Membership
    tls: PeerTls | None
    replay_window_s: float = 120.0

    @property
    def insecure(self) -> bool:
        return self.tls is None

    def check_for(self, node_id: str) -> None:
        """Raise :class:`SecurityError` unless these files fit node ``node_id``."""
        me = self.membership.peer(node_id)
        if me is None:
            raise SecurityError(f"node {node_id!r} is not a peer in the membership")
        if me.public_key != self.identity.public_key:
            raise SecurityError(
                f"the membership pins another public key for node {node_id!r} "
                "(wrong --state-dir, or a stale membership file)"
            )
        if self.tls is None:
            return
        info = self.tls.info
        if info.common_name != node_id:
            raise SecurityError(
                f"certificate is for {info.common_name!r}, not node {node_id!r}"
            )
        if not (
            info.server_auth
            and info.client_auth
            and peer_dns_name(node_id) in info.dns_names
        ):
            raise SecurityError(
                f"certificate of {node_id!r} is not a peer certificate "
                f"(make one with `fedplat certs peer --name {node_id}`)"
            )
        if me.cert_sha256 and me.cert_sha256 != info.fingerprint:
            raise SecurityError(
                f"certificate of {node_id!r} is not the one the membership pins"
            )


def load_peer_security(
    node_id: str,
    *,
    membership: str | os.PathLike[str],
    state_dir: str | os.PathLike[str],
    ca: str | os.PathLike[str] | None = None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
    insecure: bool = False,
    replay_window_s: float = 120.0,
    peers: set[str] | None = None,
) -> PeerSecurity:
    """Read and cross-check a peer's security files.

    Parameters
    ----------
    node_id : str
    membership : path
        The membership file.
    state_dir : path
        Folder holding the identity key (created, mode 0600, when absent).
    ca, cert, key : path, optional
        TLS files; all three are required unless ``insecure``.
    insecure : bool
        Plaintext (no TLS): signatures alone identify callers; logged loudly.
    peers : set of str, optional
        Restrict admission to these peer ids (a scenario's nodes).

    Raises
    ------
    SecurityError
        With a one-line reason.
    """
    try:
        members = load_membership(membership)
        identity = Identity.load_or_create(identity_path(state_dir))
        if insecure:
            if any(x is not None for x in (ca, cert, key)):
                raise SecurityError("--insecure does not take TLS files")
            tls = None
        elif ca is None or cert is None or key is None:
            raise SecurityError(
                "mutual TLS needs --ca, --cert and --key (or the explicit --insecure)"
            )
        else:
            tls = PeerTls.load(ca, cert, key)
    except (MembershipError, KeyFileError, CertError) as exc:
        raise SecurityError(str(exc)) from None
    if peers is not None:
        members = members.restricted_to(peers)
    sec = PeerSecurity(identity, members, tls, replay_window_s)
    sec.check_for(node_id)
    return sec


def warn_if_insecure(sec: PeerSecurity, node_id: str) -> None:
    """The loud part of the explicit insecure choice."""
    if sec.insecure:
        log.warning(
            "peer %s runs WITHOUT TLS (--insecure): traffic can be read and "
            "altered on the network, and callers are identified by signatures "
            "alone; use it only on a test host",
            node_id,
        )
