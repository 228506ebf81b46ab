"""The server's state machine of one secure-aggregation round.

Phases (Bonawitz et al., CCS 2017, Fig. 4, semi-honest protocol; SecAgg+ of
Bell et al., CCS 2020, when the config has a ``degree``):

``advertise`` -> ``share`` -> ``masked_input`` -> ``unmask`` -> ``done``

In each phase the coordinator passes every message it receives to
:meth:`SecAggServer.receive` (a bad one raises :class:`SecAggRejected`, and that
client counts as dropped from then on), then calls :meth:`SecAggServer.close`,
which returns the reply for each remaining client, or raises
:class:`SecAggAborted` when fewer than ``min_clients`` remain. After the unmask
phase :attr:`SecAggServer.result` holds the sum.

The server only ever holds the running sum of masked inputs (each added on
arrival, never stored), the shares it is sent, and what it reconstructs: for a
survivor its self-mask seed, for a dropped client its mask key; never both for
the same client, because each honest client reveals one kind per neighbour.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from fedplat.secagg.client import SELF_MASK_LABEL, pair_seed
from fedplat.secagg.config import MAX_CLIENT_ID, SecAggConfig
from fedplat.secagg.crypto import KeyPair, MaskExpander, agree, commit, public_of
from fedplat.secagg.errors import SecAggAborted, SecAggError, SecAggRejected
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
    UnmaskRequest,
    UnmaskShares,
)
from fedplat.secagg.shamir import reconstruct_checked, secret_to_bytes, share_from_bytes

__all__ = ["PHASES", "Rejection", "SecAggResult", "SecAggServer"]

PHASES = ("advertise", "share", "masked_input", "unmask", "done", "aborted")


@dataclass(frozen=True)
class Rejection:
    """A message the server refused, with the reason (for the event log)."""

    client_id: int
    phase: str
    reason: str


@dataclass(frozen=True, eq=False)
class SecAggResult:
    """The outcome of a completed round.

    Attributes
    ----------
    total : torch.Tensor
        float64 ``[dim]``: the sum of the survivors' clipped updates (up to the
        fixed-point rounding bounded by ``error_bound``).
    survivors : tuple of int
        Clients whose masked input is in the sum (``count = len(survivors)``).
    dropped : tuple of int
        Clients that shared keys but sent no (valid) masked input: their
        pairwise masks were rebuilt from their neighbours' shares.
    error_bound : float
        L2 bound on the rounding error of ``total``.
    ring : np.ndarray
        uint32 ``[ring_dim]``: the unmasked sum of the encodings, before decoding.
    """

    total: torch.Tensor
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    error_bound: float
    ring: np.ndarray

    @property
    def count(self) -> int:
        return len(self.survivors)


class SecAggServer:
    """Server side of one round.

    Parameters
    ----------
    config : SecAggConfig
        The round's parameters (also sent to every invited client).
    invited : iterable of int
        The clients selected for the round (at most ``config.max_clients``).
    """

    def __init__(self, config: SecAggConfig, invited: Iterable[int]) -> None:
        ids = sorted(set(invited))
        if not config.min_clients <= len(ids) <= config.max_clients:
            raise SecAggError(
                f"{len(ids)} invited clients outside "
                f"[{config.min_clients}, {config.max_clients}]"
            )
        if ids[0] < 0 or ids[-1] > MAX_CLIENT_ID:
            raise SecAggError("client ids must be in [0, 2^31)")
        self.config = config
        self.invited = frozenset(ids)
        self.phase = "advertise"
        self.rejections: list[Rejection] = []
        self._probe = KeyPair()
        self._keys: dict[int, PeerKeys] = {}
        self._graph: dict[int, tuple[int, ...]] = {}
        self._commitments: dict[int, bytes] = {}
        self._sealed: dict[int, dict[int, bytes]] = {}  # recipient -> sender -> ct
        self._u2: frozenset[int] = frozenset()
        self._sum = np.zeros(config.ring_dim, dtype=np.uint32)
        self._u3: set[int] = set()
        self._unmask: dict[int, UnmaskShares] = {}
        self._result: SecAggResult | None = None

    # ------------------------------------------------------------ receiving
    def receive(self, msg: Message) -> None:
        """Take one client message of the current phase.

        Raises
        ------
        SecAggRejected
            The message is invalid for this phase; the client is dropped.
        """
        client = getattr(msg, "client_id", -1)
        try:
            if msg.session != self.config.session:
                raise SecAggError("message belongs to another session")
            if isinstance(msg, AdvertiseKeys) and self.phase == "advertise":
                self._on_advertise(msg)
            elif isinstance(msg, EncryptedShares) and self.phase == "share":
                self._on_shares(msg)
            elif isinstance(msg, MaskedInput) and self.phase == "masked_input":
                self._on_masked(msg)
            elif isinstance(msg, UnmaskShares) and self.phase == "unmask":
                self._on_unmask(msg)
            else:
                raise SecAggError(f"{type(msg).__name__} is not expected now")
        except SecAggError as exc:
            reason = str(exc)
            self.rejections.append(Rejection(client, self.phase, reason))
            raise SecAggRejected(client, self.phase, reason) from None

    def _on_advertise(self, msg: AdvertiseKeys) -> None:
        c = msg.client_id
        if c not in self.invited:
            raise SecAggError("not invited to this round")
        if c in self._keys:
            raise SecAggError("keys already advertised")
        k = msg.keys
        seen = {
            p for pk in self._keys.values() for p in (pk.enc_public, pk.mask_public)
        }
        if k.enc_public == k.mask_public or {k.enc_public, k.mask_public} & seen:
            raise SecAggError("public key reused")
        for public in (k.enc_public, k.mask_public):
            agree(self._probe.private, public)  # refuses low-order points
        self._keys[c] = k

    def _on_shares(self, msg: EncryptedShares) -> None:
        c = msg.client_id
        if c not in self._graph:
            raise SecAggError("not on the roster")
        if c in self._commitments:
            raise SecAggError("shares already sent")
        if tuple(s.peer for s in msg.shares) != self._graph[c]:
            raise SecAggError("shares must go to exactly the client's neighbours")
        self._commitments[c] = msg.commitment
        for s in msg.shares:
            self._sealed.setdefault(s.peer, {})[c] = s.ciphertext

    def _on_masked(self, msg: MaskedInput) -> None:
        c = msg.client_id
        if c not in self._u2:
            raise SecAggError("did not share keys")
        if c in self._u3:
            raise SecAggError("masked input already sent")
        if msg.data.shape != (self.config.ring_dim,):
            raise SecAggError(f"masked input must have {self.config.ring_dim} entries")
        np.add(self._sum, msg.data, out=self._sum)
        self._u3.add(c)

    def _on_unmask(self, msg: UnmaskShares) -> None:
        c = msg.client_id
        if c not in self._u3:
            raise SecAggError("not a survivor")
        if c in self._unmask:
            raise SecAggError("shares already sent")
        held = [v for v in self._graph[c] if v in self._u2]
        want_b = tuple(v for v in held if v in self._u3)
        want_k = tuple(v for v in held if v not in self._u3)
        if tuple(s.owner for s in msg.self_mask_shares) != want_b:
            raise SecAggError(
                "self-mask shares must be for exactly the surviving neighbours"
            )
        if tuple(s.owner for s in msg.key_shares) != want_k:
            raise SecAggError("key shares must be for exactly the dropped neighbours")
        for s in msg.self_mask_shares + msg.key_shares:
            share_from_bytes(s.share)
        self._unmask[c] = msg

    # ------------------------------------------------------------ closing
    def close(self) -> dict[int, Message]:
        """End the current phase; the replies to send, keyed by client id."""
        try:
            if self.phase == "advertise":
                return self._close_advertise()
            if self.phase == "share":
                return self._close_share()
            if self.phase == "masked_input":
                return self._close_masked()
            if self.phase == "unmask":
                self._finish()
                return {}
        except SecAggAborted:
            self.phase = "aborted"
            raise
        raise SecAggError(f"nothing to close in phase {self.phase}")

    def _need(self, count: int, what: str) -> None:
        if count < self.config.min_clients:
            raise SecAggAborted(
                f"{count} clients {what}, fewer than "
                f"min_clients {self.config.min_clients}"
            )

    def _close_advertise(self) -> dict[int, Message]:
        self._need(len(self._keys), "advertised keys")
        roster = tuple(sorted(self._keys))
        self._graph = neighbours(roster, self.config.degree, self.config.graph_seed)
        self.phase = "share"
        s = self.config.session
        return {
            u: KeyDirectory(s, u, roster, tuple(self._keys[v] for v in self._graph[u]))
            for u in roster
        }

    def _close_share(self) -> dict[int, Message]:
        self._need(len(self._commitments), "shared keys")
        self._u2 = frozenset(self._commitments)
        self.phase = "masked_input"
        s = self.config.session
        out: dict[int, Message] = {}
        for u in sorted(self._u2):
            got = self._sealed.get(u, {})
            shares = tuple(Sealed(v, got[v]) for v in sorted(got) if v in self._u2)
            out[u] = ShareBundle(s, u, shares)
        self._sealed.clear()
        return out

    def _close_masked(self) -> dict[int, Message]:
        self._need(len(self._u3), "sent masked inputs")
        self.phase = "unmask"
        survivors = tuple(sorted(self._u3))
        s = self.config.session
        return {u: UnmaskRequest(s, u, survivors) for u in survivors}

    # ------------------------------------------------------------ unmasking
    def _points(self, owner: int, kind: str) -> list[tuple[int, int]]:
        out = []
        for holder in sorted(self._unmask):
            msg = self._unmask[holder]
            shares = msg.self_mask_shares if kind == "self" else msg.key_shares
            for s in shares:
                if s.owner == owner:
                    out.append((holder + 1, share_from_bytes(s.share)))
        return out

    def _rebuild(self, owner: int, kind: str) -> bytes:
        """Reconstruct ``owner``'s self-mask seed or mask key, checked against its
        commitment or advertised public key."""
        session = self.config.session

        def verify(candidate: int) -> bool:
            try:
                secret = secret_to_bytes(candidate)
            except SecAggError:
                return False
            if kind == "self":
                got = commit(SELF_MASK_LABEL, session, owner, secret)
                return got == self._commitments[owner]
            return public_of(secret) == self._keys[owner].mask_public

        points = self._points(owner, kind)
        try:
            value = reconstruct_checked(points, self.config.threshold, verify)
        except SecAggError as exc:
            what = "self-mask seed" if kind == "self" else "mask key"
            raise SecAggAborted(
                f"cannot rebuild the {what} of client {owner}: {exc}"
            ) from None
        return secret_to_bytes(value)

    def _finish(self) -> None:
        cfg = self.config
        survivors = tuple(sorted(self._u3))
        dropped = tuple(sorted(self._u2 - self._u3))
        total = self._sum
        expander = MaskExpander(cfg.ring_dim)
        for u in survivors:
            expander.add(total, self._rebuild(u, "self"), -1)
        for v in dropped:
            key = self._rebuild(v, "key")
            for u in self._graph[v]:
                if u in self._u3:
                    seed = pair_seed(key, self._keys[u].mask_public, cfg.session, v, u)
                    # u added +PRG if u < v, else -PRG: take it back out.
                    expander.add(total, seed, -1 if u < v else +1)
        fp = cfg.fixed_point
        self._result = SecAggResult(
            total=fp.decode(total, len(survivors)),
            survivors=survivors,
            dropped=dropped,
            error_bound=fp.error_bound(len(survivors)),
            ring=total,
        )
        self.phase = "done"

    @property
    def result(self) -> SecAggResult:
        """The sum, once the unmask phase is closed."""
        if self._result is None:
            raise SecAggError(f"no result in phase {self.phase}")
        return self._result
