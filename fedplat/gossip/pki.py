"""The files a set of peers on one host needs: a CA, one peer certificate and
identity key per node, an observer, and the membership that pins them all.

``fedplat gossip run`` makes them in its work folder (and tests use the same
function), so a scenario runs over mutual TLS with no setup::

    WORKDIR/pki/ca.pem, ca.key          the CA (fedplat.security.certs)
    WORKDIR/pki/<id>.pem, <id>.key      peer certificates; launcher.pem: observer
    WORKDIR/state/<id>/peer-identity.key   Ed25519 identity keys (0600)
    WORKDIR/membership.yaml             ids, public keys, fingerprints, addresses

Existing files are kept (a restarted peer keeps its key and certificate); the
membership is rewritten every time, since addresses change between runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fedplat.gossip.membership import Member, Membership, load_membership
from fedplat.gossip.security import PeerSecurity, identity_path, load_peer_security
from fedplat.gossip.tls import PeerTls
from fedplat.security.certs import CA_CERT, create_ca, fingerprint, issue, issue_peer
from fedplat.security.identity import Identity

__all__ = ["OBSERVER", "ClusterFiles", "make_cluster"]

#: The observer identity of the launcher (status and model pulls only).
OBSERVER = "launcher"


@dataclass(frozen=True)
class ClusterFiles:
    """Where :func:`make_cluster` put everything (see the module docstring)."""

    root: Path
    tls: bool

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def ca(self) -> Path:
        return self.pki / CA_CERT

    @property
    def membership(self) -> Path:
        return self.root / "membership.yaml"

    def cert(self, node_id: str) -> Path:
        return self.pki / f"{node_id}.pem"

    def key(self, node_id: str) -> Path:
        return self.pki / f"{node_id}.key"

    def state_dir(self, node_id: str) -> Path:
        return self.root / "state" / node_id

    def node_args(self, node_id: str) -> list[str]:
        """``fedplat gossip node`` flags for ``node_id``'s files."""
        args = ["--membership", str(self.membership)]
        args += ["--state-dir", str(self.state_dir(node_id))]
        if not self.tls:
            return [*args, "--insecure"]
        return [
            *args,
            *("--ca", str(self.ca), "--cert", str(self.cert(node_id))),
            *("--key", str(self.key(node_id))),
        ]

    def security(self, node_id: str) -> PeerSecurity:
        """A peer's :class:`PeerSecurity`, loaded and cross-checked."""
        return load_peer_security(
            node_id,
            membership=self.membership,
            state_dir=self.state_dir(node_id),
            ca=self.ca if self.tls else None,
            cert=self.cert(node_id) if self.tls else None,
            key=self.key(node_id) if self.tls else None,
            insecure=not self.tls,
        )

    def identity(self, node_id: str) -> Identity:
        return Identity.load_or_create(identity_path(self.state_dir(node_id)))

    def observer_tls(self, name: str = OBSERVER) -> PeerTls | None:
        if not self.tls:
            return None
        return PeerTls.load(self.ca, self.cert(name), self.key(name))

    def load_membership(self) -> Membership:
        return load_membership(self.membership)


def make_cluster(
    root: str | os.PathLike[str],
    node_ids: Iterable[str],
    *,
    tls: bool = True,
    addresses: Mapping[str, str] | None = None,
    observers: Iterable[str] = (OBSERVER,),
    sans: tuple[str, ...] = (),
) -> ClusterFiles:
    """Make (or reuse) every file a set of peers needs, and write the membership.

    Parameters
    ----------
    root : path
    node_ids : iterable of str
    tls : bool
        Make a CA and certificates (``False``: identity keys only, for an
        explicitly insecure run).
    addresses : mapping, optional
        Node id -> ``host:port`` to pin in the membership.
    observers : iterable of str
        Observer identities (client certificates, keys).
    sans : tuple of str
        Extra hosts or IPs in every peer certificate.
    """
    files = ClusterFiles(Path(root), tls)
    ids, obs = list(node_ids), list(observers)
    if tls:
        files.pki.mkdir(parents=True, exist_ok=True)
        if not files.ca.exists():
            create_ca(files.pki, name="fedplat gossip CA")
        for node_id in ids:
            if not files.cert(node_id).exists():
                issue_peer(files.pki, node_id, sans=sans)
        for name in obs:
            if not files.cert(name).exists():
                issue(files.pki, name, server=False)

    def member(node_id: str, observer: bool) -> Member:
        pin = fingerprint(files.cert(node_id).read_bytes()) if tls else None
        return Member(
            node_id,
            files.identity(node_id).public_key,
            pin,
            None if addresses is None else addresses.get(node_id),
            observer,
        )

    Membership(
        [*(member(i, False) for i in ids), *(member(o, True) for o in obs)]
    ).write(files.membership)
    return files
