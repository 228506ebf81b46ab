"""What an enrolment attempt may cost the coordinator before it is admissible.

Anyone who reaches the port can send enrolment attempts as fast as gRPC takes
them. None of them may spend anything an honest device needs to enrol:

- **Challenges are stateless.** A challenge carries its expiry and 16 random
  bytes, sealed with an HMAC (a key of this coordinator process) over those and
  the client id it was issued for (:class:`Challenges`). Checking one needs no
  record of having issued it, so issuing costs no memory and needs no rate
  limit. Only the challenges of *admitted* enrolments are remembered, until
  they expire, to refuse a replay; that set grows with admissions, which are
  bounded below.
- **Tokens are checked in memory first** (:class:`UsableTokens`). The digests
  of the enrolment tokens this run could use are read from the store at start,
  and again when an unknown token comes in, at a bounded rate, so a flood of
  made-up tokens costs set lookups, not database transactions. The store stays
  the authority (:meth:`~fedplat.store.Store.consume_token`); the gate reads it
  through the read port (:class:`~fedplat.server.reads.AdmissionReads`).
- **The enrolment rate limit spends on admissions only**
  (:class:`AdmissionLimits`). ``admission.enrol_per_second`` is charged by a
  new client whose credential checked out, just before it is admitted: under
  ``tokens`` and ``mtls`` an outsider never reaches it, so a flood cannot drain
  it; under ``open`` everyone is admissible and it caps the rate at which
  anyone (sybils included) enrols. Re-enrolment under an existing id (after a
  coordinator restart or an expired session) is limited per client, so an
  admitted client cannot spend the others' budget.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable

from fedplat.server.config import RunConfig
from fedplat.server.reads import TOKEN_PREFIX, AdmissionReads, token_hash

from fedplat.protocol.errors import (
    FedplatError,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    UnknownClient,
)
from fedplat.protocol.messages import Challenge, EnrollRequest
from fedplat.transport.limits import KeyedBuckets, TokenBucket

# version, issuer (random per coordinator process), expiry (ms since the
# epoch), random
_HEAD = struct.Struct(">B4sQ16s")
_VERSION = 1
_MAC_BYTES = 32
CHALLENGE_BYTES = _HEAD.size + _MAC_BYTES  # 61, under the wire's 64-byte cap

#: Re-enrolments one client may make at once, and per second sustained.
REENROL_BURST = 5
REENROL_PER_SECOND = 0.1


class Challenges:
    """Stateless, single-use enrolment challenges (see the module docstring)."""

    def __init__(
        self, seconds: float, clock: Callable[[], float], key: bytes | None = None
    ) -> None:
        self.seconds = seconds
        self._clock = clock
        self._key = key or secrets.token_bytes(32)
        self._issuer = hashlib.sha256(b"issuer" + self._key).digest()[:4]
        self._lock = threading.Lock()
        # The MACs of admitted enrolments' challenges, oldest first -> expiry.
        self._spent: OrderedDict[bytes, float] = OrderedDict()

    def _mac(self, head: bytes, client_id: str) -> bytes:
        return hmac.new(self._key, head + client_id.encode(), hashlib.sha256).digest()

    def issue(self, client_id: str) -> Challenge:
        expires = self._clock() + self.seconds
        head = _HEAD.pack(
            _VERSION, self._issuer, int(expires * 1000), secrets.token_bytes(16)
        )
        return Challenge(head + self._mac(head, client_id), expires)

    def problem(self, challenge: bytes, client_id: str) -> FedplatError | None:
        """Why ``challenge`` cannot enrol ``client_id`` now, or None. A
        challenge of another coordinator process (a restart between the two
        calls) or an expired one is Unauthenticated: the SDK asks for a fresh
        one; a forged, altered, misdirected or reused one is PermissionDenied."""
        if len(challenge) != CHALLENGE_BYTES:
            return PermissionDenied("not an enrolment challenge")
        head, mac = challenge[: _HEAD.size], challenge[_HEAD.size :]
        version, issuer, expires_ms, _ = _HEAD.unpack(head)
        if version != _VERSION or issuer != self._issuer:
            return Unauthenticated(
                "enrolment challenge of another coordinator process; ask again"
            )
        if not hmac.compare_digest(mac, self._mac(head, client_id)):
            return PermissionDenied(
                "enrolment challenge altered or issued for another client id"
            )
        if expires_ms / 1000 <= self._clock():
            return Unauthenticated("expired enrolment challenge; ask again")
        if mac in self._spent:
            return PermissionDenied("enrolment challenge already used")
        return None

    def spend(self, challenge: bytes) -> bool:
        """Mark an admitted enrolment's challenge used; False if it already was
        (two enrolments raced with one challenge)."""
        mac = challenge[_HEAD.size :]
        expires = _HEAD.unpack(challenge[: _HEAD.size])[2] / 1000
        now = self._clock()
        with self._lock:
            while self._spent:
                oldest, at = next(iter(self._spent.items()))
                if at > now:
                    break
                del self._spent[oldest]
            if mac in self._spent:
                return False
            self._spent[mac] = expires
            return True

    def __len__(self) -> int:
        """Challenges remembered as spent (not yet expired)."""
        return len(self._spent)


class UsableTokens:
    """The digests of the enrolment tokens the run could use, in memory.

    An unknown token makes the store be read again, at most ``reload_burst``
    times at once and ``reloads_per_second`` sustained: a token made after the
    last read is found, and a flood of made-up tokens cannot turn into a flood
    of database reads.
    """

    def __init__(
        self,
        reads: AdmissionReads,
        run_name: str,
        clock: Callable[[], float],
        reloads_per_second: float = 2.0,
        reload_burst: int = 10,
    ) -> None:
        self.reads = reads
        self.run_name = run_name
        self._lock = threading.Lock()
        self._reloads = TokenBucket(reloads_per_second, reload_burst, clock)
        self._digests = reads.usable_token_hashes(run_name)

    def known(self, secret: str) -> bool | None:
        """True if ``secret`` is a usable token as far as the store's last read
        knows; False if it is not, even after a fresh read; None if it is
        unknown and the reload budget is spent (retry: a token made since the
        last read is found within a second)."""
        if not secret.startswith(TOKEN_PREFIX):
            return False
        digest = token_hash(secret)
        if digest in self._digests:
            return True
        # One reload at a time; the others do not wait for it (a thread
        # blocked here is one fewer for every other call).
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if not self._reloads.take():
                return None
            self._digests = self.reads.usable_token_hashes(self.run_name)
            return digest in self._digests
        finally:
            self._lock.release()

    def discard(self, secret: str) -> None:
        """``secret`` is used, revoked or expired: forget it until a reload
        (which reads only usable tokens) says otherwise."""
        self._digests.discard(token_hash(secret))


#: The answer to a re-enrolment under an id the run does not know, or under a
#: key that is not the id's registered one (the SDK then enrols anew).
UNKNOWN_ID = (
    "no client of this run has this id and key; enrol without an id "
    "(a new enrolment needs an admission credential)"
)


class AdmissionLimits:
    """The enrolment rate limit: new clients share one bucket, each known
    client re-enrols from a bucket of its own."""

    def __init__(self, per_second: float, burst: int, clock: Callable[[], float]):
        self._clock = clock
        self._lock = threading.Lock()
        self._new = TokenBucket(per_second, burst, clock)
        # Keys are enrolled clients' ids: bounded by admission.max_clients.
        self._known = KeyedBuckets(REENROL_PER_SECOND, REENROL_BURST, clock)

    def admit(self, client_id: str | None) -> bool:
        """Spend the budget of one admission (``client_id`` None: a new client)."""
        with self._lock:
            if client_id is None:
                return self._new.take()
            return self._known.take(client_id)


class Gate:
    """The checks an enrolment passes before any database transaction and,
    where possible, before its signature is verified (see the module
    docstring): its challenge; a re-enrolment's id and registered key (in
    memory, outside mutual TLS, where the certificate is the identity); a new
    client's place under ``max_clients`` and, under ``tokens``, its token."""

    def __init__(
        self,
        cfg: RunConfig,
        reads: AdmissionReads,
        run_id: str,
        clock: Callable[[], float],
    ) -> None:
        adm = cfg.admission
        self.mode = cfg.admission_mode
        self.max_clients = adm.max_clients
        self.run_name = cfg.run.name
        self.reads = reads
        self.challenges = Challenges(adm.challenge_seconds, clock)
        self.limits = AdmissionLimits(adm.enrol_per_second, adm.enrol_burst, clock)
        self.tokens = (
            UsableTokens(reads, cfg.run.name, clock) if self.mode == "tokens" else None
        )
        # The run's clients (this process or an earlier one) -> registered key.
        self._keys = {c.id: c.public_key or "" for c in reads.list_clients(run_id)}

    def admitted(self, client_id: str, public_key: bytes) -> None:
        self._keys[client_id] = public_key.hex()

    def is_client(self, client_id: str) -> bool:
        """Whether ``client_id`` is one of the run's clients (this process's
        or an earlier one's)."""
        return client_id in self._keys

    def check(
        self, req: EnrollRequest, revoked: set[str]
    ) -> tuple[FedplatError, str] | None:
        """The refusal (error, event kind) ``req`` earns before it costs
        anything, or None."""
        problem = self.challenges.problem(req.challenge, req.client_id)
        if problem is not None:
            return problem, "enrolment_refused"
        if req.client_id:
            return None if self.mode == "mtls" else self._known(req, revoked)
        if len(self._keys) >= self.max_clients:
            return (
                ResourceExhausted(f"the run admits at most {self.max_clients} clients"),
                "enrolment_cap",
            )
        return None if self.tokens is None else self._token(req.enrolment_token)

    def _known(
        self, req: EnrollRequest, revoked: set[str]
    ) -> tuple[FedplatError, str] | None:
        key = self._keys.get(req.client_id)
        if key is None or key != req.public_key.hex():
            # One answer for both: a caller learns nothing about which ids
            # exist (the event kind tells the operator which it was).
            return (
                UnknownClient(UNKNOWN_ID),
                "enrolment_refused" if key is None else "identity_refused",
            )
        if req.client_id in revoked:
            return PermissionDenied("this client was revoked"), "enrolment_refused"
        return None

    def _token(self, secret: str) -> tuple[FedplatError, str] | None:
        assert self.tokens is not None
        if not secret:
            return (
                PermissionDenied(
                    "this run admits clients with an enrolment token "
                    "(fedplat tokens create)"
                ),
                "enrolment_refused",
            )
        known = self.tokens.known(secret)
        if known is None:
            return (
                ResourceExhausted("enrolment token not known yet; retry in a second"),
                "enrolment_refused",
            )
        # Known in memory, or not even after a fresh read: the store says why
        # (a read; in memory a token may have been revoked or used since).
        problem = self.reads.token_problem(secret, run_name=self.run_name)
        if problem is None:
            if known:
                return None
            # Made between the two reads.
            return ResourceExhausted("enrolment token just made; retry"), (
                "enrolment_refused"
            )
        self.tokens.discard(secret)
        return PermissionDenied(problem), "enrolment_refused"


__all__ = [
    "CHALLENGE_BYTES",
    "UNKNOWN_ID",
    "AdmissionLimits",
    "Challenges",
    "Gate",
    "UsableTokens",
]
