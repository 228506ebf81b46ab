"""The public parameters of one secure-aggregation round, shared by every party."""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from fedplat.secagg.errors import SecAggError
from fedplat.secagg.graph import harary_parameters, threshold_for
from fedplat.secagg.quantize import FixedPoint

__all__ = ["MAX_CLIENT_ID", "SESSION_BYTES", "SecAggConfig"]

SESSION_BYTES = 16
MAX_CLIENT_ID = (1 << 31) - 1
# Bounds on what a round may declare (a config arrives from the network too).
MAX_CLIENTS = 1 << 16
MAX_DIM = 1 << 31


@dataclass(frozen=True)
class SecAggConfig:
    """Parameters every client and the server of one round agree on.

    Attributes
    ----------
    session : bytes
        16 random bytes naming the round; bound into every derived key and
        message, so nothing carries over between rounds.
    dim : int
        ``d``, length of the float updates.
    clip_norm : float
        L2 bound each client clips its update to before encoding.
    max_clients : int
        ``n``, participants invited to the round (ids in ``[0, 2^31)``).
    threshold : int
        ``t``: shares needed to rebuild a client's secrets.
    degree : int or None
        Neighbours per client (SecAgg+, even); ``None`` masks every pair (SecAgg).
    min_clients : int
        The round aborts if fewer clients remain in any phase; clients refuse
        lists shorter than this, so the server never unmasks a sum of fewer.
    rotate : bool
        Randomized Hadamard rotation before quantization (see ``quantize``).
    """

    session: bytes
    dim: int
    clip_norm: float
    max_clients: int
    threshold: int
    degree: int | None
    min_clients: int
    rotate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.session, bytes) or len(self.session) != SESSION_BYTES:
            raise SecAggError(f"session must be {SESSION_BYTES} bytes")
        if not 1 <= self.dim <= MAX_DIM:
            raise SecAggError(f"dim must be in [1, 2^31], got {self.dim}")
        if not 0.0 < self.clip_norm < math.inf:
            raise SecAggError(f"clip_norm must be finite and > 0, got {self.clip_norm}")
        if not 3 <= self.max_clients <= MAX_CLIENTS:
            raise SecAggError(
                f"max_clients must be in [3, {MAX_CLIENTS}], got {self.max_clients}"
            )
        if self.degree is not None and (
            self.degree < 2 or self.degree % 2 or self.degree >= self.max_clients
        ):
            raise SecAggError(
                f"degree must be even, >= 2 and < max_clients, got {self.degree}"
            )
        if not 2 <= self.threshold <= self.max_neighbours:
            raise SecAggError(
                f"threshold must be in [2, {self.max_neighbours}], got {self.threshold}"
            )
        if not 2 <= self.min_clients <= self.max_clients:
            raise SecAggError(
                f"min_clients must be in [2, {self.max_clients}], "
                f"got {self.min_clients}"
            )

    @classmethod
    def create(
        cls,
        *,
        dim: int,
        clip_norm: float,
        clients: int,
        dropout_rate: float = 0.1,
        corrupt_rate: float = 0.05,
        sparse: bool = True,
        rotate: bool = True,
        min_fraction: float = 0.5,
        session: bytes | None = None,
    ) -> SecAggConfig:
        """A round's config with ``k`` and ``t`` from :func:`harary_parameters`.

        ``sparse=False`` keeps the complete graph (SecAgg) with the threshold the
        same analysis gives for ``k = n - 1``. ``min_clients`` is
        ``ceil(min_fraction * clients)`` (at least ``t`` and 2).
        """
        degree: int | None
        if sparse:
            params = harary_parameters(clients, dropout_rate, corrupt_rate)
            degree, threshold = params.degree, params.threshold
        else:
            degree = clients - 1
            threshold = threshold_for(clients, degree, dropout_rate, corrupt_rate)
        if degree >= clients - 1:
            degree = None
        return cls(
            session=session if session is not None else secrets.token_bytes(16),
            dim=dim,
            clip_norm=clip_norm,
            max_clients=clients,
            threshold=threshold,
            degree=degree,
            min_clients=max(2, threshold, math.ceil(min_fraction * clients)),
            rotate=rotate,
        )

    @property
    def max_neighbours(self) -> int:
        return self.max_clients - 1 if self.degree is None else self.degree

    @property
    def graph_seed(self) -> bytes:
        """Public seed of the neighbour graph, derived from the session id."""
        return hashlib.sha256(b"fedplat-secagg-graph-seed" + self.session).digest()

    @cached_property
    def fixed_point(self) -> FixedPoint:
        return FixedPoint(
            self.dim,
            self.clip_norm,
            self.max_clients,
            rotate=self.rotate,
            session=self.session,
        )

    @property
    def ring_dim(self) -> int:
        """Length of a masked input (``d`` or the padded ``d'``)."""
        return self.fixed_point.ring_dim

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (for a task config); :meth:`from_dict` inverts it."""
        return {
            "session": self.session.hex(),
            "dim": self.dim,
            "clip_norm": self.clip_norm,
            "max_clients": self.max_clients,
            "threshold": self.threshold,
            "degree": self.degree,
            "min_clients": self.min_clients,
            "rotate": self.rotate,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SecAggConfig:
        """Validated inverse of :meth:`as_dict` (unknown or missing keys raise)."""
        keys = {
            "session",
            "dim",
            "clip_norm",
            "max_clients",
            "threshold",
            "degree",
            "min_clients",
            "rotate",
        }
        if set(data) != keys:
            raise SecAggError(
                f"secagg config keys must be {sorted(keys)}, got {sorted(data)}"
            )
        try:
            session = bytes.fromhex(str(data["session"]))
            degree = data["degree"]
            return cls(
                session=session,
                dim=_int(data["dim"]),
                clip_norm=float(data["clip_norm"]),
                max_clients=_int(data["max_clients"]),
                threshold=_int(data["threshold"]),
                degree=None if degree is None else _int(degree),
                min_clients=_int(data["min_clients"]),
                rotate=_bool(data["rotate"]),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, SecAggError):
                raise
            raise SecAggError(f"bad secagg config: {exc}") from exc


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SecAggError(f"expected an integer, got {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise SecAggError(f"expected a boolean, got {value!r}")
    return value
