"""A participant of one secure-aggregation round (Bonawitz et al., CCS 2017, Fig. 4).

One :class:`SecAggClient` per client per round; its four methods are the
protocol's rounds, each consuming the server's previous reply. The client
checks every server message against what the protocol allows (its roster,
its neighbours, list sizes) and raises :class:`SecAggError` instead of answering
when something is off: a client that stops answering is just a dropout, and the
round goes on without it.
"""

from __future__ import annotations

import secrets

import numpy as np
import torch

from fedplat.secagg.config import MAX_CLIENT_ID, SecAggConfig
from fedplat.secagg.crypto import (
    KEY_BYTES,
    KeyPair,
    MaskExpander,
    agree,
    commit,
    decrypt_for,
    derive,
    encrypt_for,
)
from fedplat.secagg.errors import SecAggError
from fedplat.secagg.graph import neighbours
from fedplat.secagg.messages import (
    AdvertiseKeys,
    EncryptedShares,
    KeyDirectory,
    MaskedInput,
    Message,
    PeerKeys,
    Sealed,
    ShareBundle,
    ShareOf,
    UnmaskRequest,
    UnmaskShares,
)
from fedplat.secagg.quantize import Encoded
from fedplat.secagg.shamir import (
    SHARE_BYTES,
    secret_from_bytes,
    share_to_bytes,
    split,
)

__all__ = ["ENC_LABEL", "MASK_LABEL", "SELF_MASK_LABEL", "SecAggClient", "pair_seed"]

ENC_LABEL = b"fedplat-secagg-share-key"
MASK_LABEL = b"fedplat-secagg-pair-mask"
SELF_MASK_LABEL = b"fedplat-secagg-self-mask"


def pair_seed(
    private: bytes, peer_public: bytes, session: bytes, u: int, v: int
) -> bytes:
    """Seed of the pairwise mask between ``u`` and ``v`` (symmetric in the pair)."""
    lo, hi = min(u, v), max(u, v)
    return derive(agree(private, peer_public), MASK_LABEL, session, lo, hi)


def _share_key(
    private: bytes, peer_public: bytes, session: bytes, u: int, v: int
) -> bytes:
    lo, hi = min(u, v), max(u, v)
    return derive(agree(private, peer_public), ENC_LABEL, session, lo, hi)


class SecAggClient:
    """Client ``client_id``'s side of the round described by ``config``.

    Parameters
    ----------
    config : SecAggConfig
        The round's public parameters (from the coordinator's task).
    client_id : int
        This client's id in ``[0, 2^31)``, as the server knows it.
    """

    def __init__(self, config: SecAggConfig, client_id: int) -> None:
        if not 0 <= client_id <= MAX_CLIENT_ID:
            raise SecAggError(f"client id {client_id} out of range [0, 2^31)")
        self.config = config
        self.id = client_id
        self._enc = KeyPair()
        self._mask = KeyPair()
        self._self_seed = secrets.token_bytes(KEY_BYTES)
        self._phase = "advertise"
        self._peers: dict[int, PeerKeys] = {}
        self._held: dict[int, tuple[bytes, bytes]] = {}  # sender -> (key, self)
        self.last_encoding: Encoded | None = None

    def _enter(self, expected: str, session: bytes, recipient: int) -> None:
        """Start a round: any failure from here on ends this client's part in
        the protocol (it never answers twice, so a server cannot probe it with
        different lists)."""
        if self._phase != expected:
            raise SecAggError(f"client {self.id} is in {self._phase}, not {expected}")
        self._phase = "aborted"
        if session != self.config.session or recipient != self.id:
            raise SecAggError("server message for another session or client")

    # ------------------------------------------------------------ round 0
    def advertise(self) -> AdvertiseKeys:
        """Round 0: the two fresh public keys."""
        if self._phase != "advertise":
            raise SecAggError(f"client {self.id} already advertised")
        self._phase = "share"
        keys = PeerKeys(self.id, self._enc.public, self._mask.public)
        return AdvertiseKeys(self.config.session, self.id, keys)

    # ------------------------------------------------------------ round 1
    def share_keys(self, directory: KeyDirectory) -> EncryptedShares:
        """Round 1: Shamir-share the mask key and self-mask seed to the neighbours."""
        cfg = self.config
        self._enter("share", directory.session, directory.recipient)
        roster = directory.roster
        if self.id not in roster:
            raise SecAggError("roster does not list this client")
        if not cfg.min_clients <= len(roster) <= cfg.max_clients:
            raise SecAggError(
                f"roster of {len(roster)} outside "
                f"[{cfg.min_clients}, {cfg.max_clients}]"
            )
        mine = neighbours(roster, cfg.degree, cfg.graph_seed)[self.id]
        got = tuple(k.client_id for k in directory.keys)
        if got != mine:
            raise SecAggError("server sent keys of clients that are not my neighbours")
        publics = [k.enc_public for k in directory.keys] + [
            k.mask_public for k in directory.keys
        ]
        publics += [self._enc.public, self._mask.public]
        if len(set(publics)) != len(publics):
            raise SecAggError("advertised public keys are not all distinct")
        self._peers = {k.client_id: k for k in directory.keys}
        xs = [v + 1 for v in mine]
        key_shares = split(secret_from_bytes(self._mask.private), xs, cfg.threshold)
        self_shares = split(secret_from_bytes(self._self_seed), xs, cfg.threshold)
        sealed = []
        for v, ks, bs in zip(mine, key_shares, self_shares, strict=True):
            key = _share_key(
                self._enc.private, self._peers[v].enc_public, cfg.session, self.id, v
            )
            plain = share_to_bytes(ks) + share_to_bytes(bs)
            sealed.append(Sealed(v, encrypt_for(key, cfg.session, self.id, v, plain)))
        commitment = commit(SELF_MASK_LABEL, cfg.session, self.id, self._self_seed)
        self._phase = "mask"
        return EncryptedShares(cfg.session, self.id, commitment, tuple(sealed))

    # ------------------------------------------------------------ round 2
    def mask(self, bundle: ShareBundle, update: torch.Tensor) -> MaskedInput:
        """Round 2: encode ``update`` ``[dim]`` (clip, rotate, quantize) and mask it."""
        encoded = self.config.fixed_point.encode(update)
        self.last_encoding = encoded
        return self.mask_ring(bundle, encoded.ring)

    def mask_ring(self, bundle: ShareBundle, ring: np.ndarray) -> MaskedInput:
        """Round 2 on an already encoded uint32 ``[ring_dim]`` input."""
        cfg = self.config
        if ring.dtype != np.uint32 or ring.shape != (cfg.ring_dim,):
            raise SecAggError(f"expected a uint32 [{cfg.ring_dim}] input")
        self._enter("mask", bundle.session, bundle.recipient)
        senders = [s.peer for s in bundle.shares]
        if not set(senders) <= set(self._peers):
            raise SecAggError("server forwarded shares from non-neighbours")
        if len(senders) < cfg.threshold:
            raise SecAggError(
                f"only {len(senders)} neighbours shared keys, need {cfg.threshold}"
            )
        for s in bundle.shares:
            key = _share_key(
                self._enc.private,
                self._peers[s.peer].enc_public,
                cfg.session,
                self.id,
                s.peer,
            )
            plain = decrypt_for(key, cfg.session, s.peer, self.id, s.ciphertext)
            self._held[s.peer] = (plain[:SHARE_BYTES], plain[SHARE_BYTES:])
        y = ring.copy()
        expander = MaskExpander(cfg.ring_dim)
        expander.add(y, self._self_seed, +1)
        for v in senders:
            seed = pair_seed(
                self._mask.private, self._peers[v].mask_public, cfg.session, self.id, v
            )
            # +PRG on the smaller id, -PRG on the larger: the pair cancels.
            expander.add(y, seed, +1 if self.id < v else -1)
        self._phase = "unmask"
        return MaskedInput(cfg.session, self.id, y)

    # ------------------------------------------------------------ round 3
    def unmask(self, request: UnmaskRequest) -> UnmaskShares:
        """Round 3: per neighbour that shared keys, reveal exactly one share:
        its self-mask share if it survived, its mask-key share if it dropped."""
        cfg = self.config
        self._enter("unmask", request.session, request.recipient)
        survivors = set(request.survivors)
        if self.id not in survivors:
            raise SecAggError("asked to unmask a round my input is not part of")
        if len(survivors) < cfg.min_clients:
            raise SecAggError(
                f"{len(survivors)} survivors, fewer than min_clients {cfg.min_clients}"
            )
        if not (survivors & set(self._peers)) <= set(self._held):
            raise SecAggError("a surviving neighbour never shared keys with me")
        self_shares, key_shares = [], []
        for v in sorted(self._held):
            key_share, self_share = self._held[v]
            if v in survivors:
                self_shares.append(ShareOf(v, self_share))
            else:
                key_shares.append(ShareOf(v, key_share))
        self._held.clear()
        self._phase = "done"
        return UnmaskShares(cfg.session, self.id, tuple(self_shares), tuple(key_shares))

    # ------------------------------------------------------------ dispatch
    def respond(self, msg: Message, update: torch.Tensor | None = None) -> Message:
        """The answer to any server message (``update`` is needed for round 2)."""
        if isinstance(msg, KeyDirectory):
            return self.share_keys(msg)
        if isinstance(msg, ShareBundle):
            if update is None:
                raise SecAggError("round 2 needs the client's update")
            return self.mask(msg, update)
        if isinstance(msg, UnmaskRequest):
            return self.unmask(msg)
        raise SecAggError(f"a client does not answer {type(msg).__name__}")
