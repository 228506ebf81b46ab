"""Poisson client sampling: each client takes part in a round independently with
probability ``q``.

This is the sampling the subsampled Gaussian mechanism's accounting assumes
(Abadi et al. 2016; McMahan et al., ICLR 2018, Alg. 1: "each user is selected
independently with probability q"); Opacus's accountants compose it with
``sample_rate=q``. Selecting a fixed number of clients per round is a different
mechanism (sampling without replacement) whose amplification holds under
replace-one adjacency, not the add/remove-one adjacency those accountants use.

Each client's coin is a keyed hash of ``(seed, round, client id)``: the draw is a
pure function (the round driver can replay it), independent across clients, and
a client's coin does not depend on which other clients exist. For DP the seed
must stay secret to the coordinator (draw it with ``secure_seed``): whoever knows
it knows who was sampled.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

from fedplat.privacy.clipping import PrivacyError

__all__ = ["poisson_sample"]

_U64 = 1 << 64


def poisson_sample(
    client_ids: Iterable[int], rate: float, *, seed: int, round: int
) -> tuple[int, ...]:
    """The clients sampled for ``round``, in increasing id order.

    Parameters
    ----------
    client_ids : iterable of int
        The population (distinct non-negative ids, e.g. the enrolled clients).
    rate : float
        ``q`` in ``(0, 1]``: each client's probability of being sampled.
    seed : int
        Secret 64-bit seed of the run.
    round : int
        Round number (``>= 0``); each round draws fresh coins.

    Returns
    -------
    tuple of int
        Sampled ids; may be empty (the round still releases a noised model).
    """
    if not 0.0 < rate <= 1.0:
        raise PrivacyError(f"sampling rate must be in (0, 1], got {rate}")
    if not 0 <= seed < _U64 or round < 0:
        raise PrivacyError("seed must be in [0, 2^64) and round >= 0")
    ids = sorted(set(client_ids))
    if ids and (ids[0] < 0 or ids[-1] >= _U64):
        raise PrivacyError("client ids must be in [0, 2^64)")
    # Sampled iff the coin, uniform on [0, 2^64), falls below q 2^64.
    cut = min(_U64, int(rate * _U64))
    key = struct.pack("<QQ", seed, round)
    out = []
    for c in ids:
        digest = hashlib.blake2b(struct.pack("<Q", c), digest_size=8, key=key).digest()
        if int.from_bytes(digest, "little") < cut:
            out.append(c)
    return tuple(out)
