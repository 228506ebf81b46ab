"""Shamir t-out-of-n secret sharing over a prime field (Shamir, CACM 1979).

SecAgg (Bonawitz et al., CCS 2017, Sec. 3) shares two 32-byte secrets of every
client with its neighbours: the seed of its self mask and the private key of its
mask key pair. A secret ``s < 2^256`` is the constant term of a random polynomial
``f`` of degree ``t - 1`` over GF(p); holder ``j`` gets ``f(x_j)``; any ``t``
points determine ``f`` (Lagrange interpolation at 0), fewer reveal nothing.

``p = 2^256 + 297`` is the smallest prime above ``2^256``, so every 32-byte secret
is a field element and a share fits in 33 bytes. Evaluation points are the
holders' client ids plus one (never 0, which is the secret itself).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterable, Sequence

from fedplat.secagg.errors import SecAggError

__all__ = [
    "PRIME",
    "SHARE_BYTES",
    "interpolate_at_zero",
    "reconstruct",
    "reconstruct_checked",
    "secret_from_bytes",
    "secret_to_bytes",
    "share_from_bytes",
    "share_to_bytes",
    "split",
]

PRIME = (1 << 256) + 297
SHARE_BYTES = 33  # ceil(257 / 8)
SECRET_BYTES = 32
# Subsets of t shares tried when the first one does not verify (a corrupted
# share from a faulty or lying holder); bounded so a round's cost stays bounded.
MAX_SUBSETS = 64


def split(
    secret: int,
    xs: Sequence[int],
    threshold: int,
    *,
    prime: int = PRIME,
    randbelow: Callable[[int], int] = secrets.randbelow,
) -> list[int]:
    """Shares ``f(x)``, ``x`` in ``xs``, of a random ``f`` with ``f(0) = secret``.

    Parameters
    ----------
    secret : int
        In ``[0, prime)``.
    xs : sequence of int
        Distinct evaluation points in ``[1, prime)``.
    threshold : int
        ``t``: any ``t`` shares reconstruct, ``t - 1`` reveal nothing.
    prime : int
        Field modulus (tests use small primes to check by hand).
    randbelow : callable
        Source of the random coefficients (the OS CSPRNG by default).

    Returns
    -------
    list of int
        One share per point, in the order of ``xs``.
    """
    if not 0 <= secret < prime:
        raise SecAggError("secret out of the field")
    if not 1 <= threshold <= len(xs):
        raise SecAggError(f"threshold {threshold} not in [1, {len(xs)}]")
    if len(set(xs)) != len(xs) or any(not 0 < x < prime for x in xs):
        raise SecAggError("evaluation points must be distinct and in [1, p)")
    coeffs = [secret] + [randbelow(prime) for _ in range(threshold - 1)]
    out = []
    for x in xs:
        acc = 0
        for c in reversed(coeffs):  # Horner
            acc = (acc * x + c) % prime
        out.append(acc)
    return out


def interpolate_at_zero(
    points: Sequence[tuple[int, int]], *, prime: int = PRIME
) -> int:
    """``f(0)`` of the polynomial of degree ``< len(points)`` through ``points``."""
    xs = [x for x, _ in points]
    if len(set(xs)) != len(xs) or any(not 0 < x < prime for x in xs):
        raise SecAggError("share points must be distinct and in [1, p)")
    total = 0
    for j, (xj, yj) in enumerate(points):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % prime
                den = den * (xm - xj) % prime
        total = (total + yj * num * pow(den, -1, prime)) % prime
    return total


def reconstruct(
    points: Sequence[tuple[int, int]], threshold: int, *, prime: int = PRIME
) -> int:
    """The secret from the first ``threshold`` of ``points`` (``(x, f(x))`` pairs)."""
    if len(points) < threshold:
        raise SecAggError(f"{len(points)} shares, need {threshold}")
    return interpolate_at_zero(list(points)[:threshold], prime=prime)


def reconstruct_checked(
    points: Sequence[tuple[int, int]],
    threshold: int,
    verify: Callable[[int], bool],
    *,
    prime: int = PRIME,
    max_subsets: int = MAX_SUBSETS,
) -> int:
    """The first secret from a ``threshold``-subset of ``points`` that ``verify``
    accepts.

    ``verify`` checks a candidate against a public commitment (for a private key,
    its advertised public key). With more than ``threshold`` shares a wrong share
    is routed around; at most ``max_subsets`` subsets are tried.

    Raises
    ------
    SecAggError
        Too few shares, or no subset tried gives a verified secret.
    """
    if len(points) < threshold:
        raise SecAggError(f"{len(points)} shares, need {threshold}")
    subsets: Iterable[tuple[tuple[int, int], ...]] = itertools.combinations(
        points, threshold
    )
    for subset in itertools.islice(subsets, max_subsets):
        candidate = interpolate_at_zero(subset, prime=prime)
        if verify(candidate):
            return candidate
    raise SecAggError(
        f"no {threshold} of the {len(points)} shares reconstruct a secret that "
        "matches its commitment (corrupted shares)"
    )


def secret_to_bytes(secret: int) -> bytes:
    """A reconstructed secret (``< 2^256``) as its 32 bytes."""
    if not 0 <= secret < 1 << (8 * SECRET_BYTES):
        raise SecAggError("reconstructed value is not a 32-byte secret")
    return secret.to_bytes(SECRET_BYTES, "little")


def secret_from_bytes(data: bytes) -> int:
    if len(data) != SECRET_BYTES:
        raise SecAggError(f"a secret is {SECRET_BYTES} bytes, got {len(data)}")
    return int.from_bytes(data, "little")


def share_to_bytes(share: int) -> bytes:
    return share.to_bytes(SHARE_BYTES, "little")


def share_from_bytes(data: bytes) -> int:
    """A share from the wire: exactly 33 bytes holding a field element."""
    if len(data) != SHARE_BYTES:
        raise SecAggError(f"a share is {SHARE_BYTES} bytes, got {len(data)}")
    value = int.from_bytes(data, "little")
    if value >= PRIME:
        raise SecAggError("share is not a field element")
    return value
