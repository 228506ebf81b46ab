"""The client registry: admission, identities, sessions, liveness, revocation.

Who may speak, and as whom:

- **Admission** (``admission.mode``): ``tokens`` needs a single-use token from
  ``fedplat tokens create``; ``mtls`` binds the client to its certificate (one
  certificate, one client id); ``open`` admits anyone, capped. Every mode caps the
  number of clients and rate-limits admissions, and every enrolment starts with a
  server challenge (:meth:`ClientRegistry.challenge`). What an attempt costs
  before it is known to be admissible (nothing an honest device needs) is
  :mod:`fedplat.server.admission`'s concern.
- **Identity**: a client registers an Ed25519 public key and proves it holds the
  private key by signing the challenge. Re-enrolling under an existing id needs a
  signature by *that id's registered key* (under mTLS, the certificate suffices
  and the key may rotate): nobody takes over a client by knowing its id or name.
- **Sessions**: enrolment returns a session token bound to the client id that
  expires; only its SHA-256 is kept.
- **Liveness** is the last time a client was heard from; **revocation** (``fedplat
  clients revoke``) is picked up from the store and ends the client's session.

The registry reads the store through the read port
(:class:`~fedplat.server.reads.RegistryReads`) and admits a client through the
recorder (:meth:`~fedplat.server.recorder.Recorder.enrol_client`): enrolment is
the one call that waits for the database, as an admission is durable before it
is answered. Liveness is written in the recorder's batches.

Refusals never reveal the run's model to a caller that is not admitted: the layout
is compared only after the credential checked out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fedplat.server.admission import UNKNOWN_ID, Gate
from fedplat.server.config import RunConfig
from fedplat.server.reads import ClientRecord, RegistryReads
from fedplat.server.recorder import EnrolmentRefused, Recorder
from fedplat.server.refusals import Rejection

from fedplat.protocol.errors import (
    FedplatError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    UnknownClient,
)
from fedplat.protocol.messages import Challenge, Enrollment, EnrollRequest
from fedplat.security.certs import CertError, fingerprint
from fedplat.security.identity import ENROL, verify
from fedplat.security.operators import is_operator_certificate
from fedplat.vectors import Layout

log = logging.getLogger("fedplat.server.registry")


#: The one answer to a call without a valid session (unknown id, wrong token,
#: another client's certificate): the SDK enrols again.
NO_SESSION = "no valid session for this client; enrol"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass
class ClientState:
    """What the coordinator knows about one enrolled client (in memory)."""

    client_id: str
    name: str
    seq: int  # enrolment order: selection and row order, for reproducible runs
    public_key: bytes
    declared_examples: int
    max_examples: int | None
    last_seen: float
    session: bytes = b""
    session_expires: float = 0.0
    revoked: bool = False
    # Under mutual TLS, the certificate the session is bound to (fingerprint).
    cert: str | None = None


@dataclass(frozen=True)
class PeerIdentity:
    """What the transport knows about the caller (its TLS client certificate)."""

    cert_pem: bytes | None = None


class ClientRegistry:
    """Enrolled clients of one run (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        reads: RegistryReads,
        recorder: Recorder,
        layout: Layout,
        *,
        clock: Callable[[], float] = time.time,
        on_enrol: Callable[[ClientState], None] = lambda c: None,
    ) -> None:
        self.cfg = cfg
        self.adm = cfg.admission
        self.mode = cfg.admission_mode
        self.reads = reads
        self.recorder = recorder
        self.run_id = run_id = recorder.run_id
        self.layout = layout
        self.clock = clock
        self._reject = recorder.rejection
        self._on_enrol = on_enrol
        self._on_seen = recorder.seen
        self._lock = threading.RLock()
        self._clients: dict[str, ClientState] = {}
        # (client id, "upload" | "download") in flight: kept by id, so a fresh
        # session (a re-enrolment) cannot open a second upload beside the first.
        self._busy: set[tuple[str, str]] = set()
        self._next_seq = 0
        self._gate = Gate(cfg, reads, run_id, clock)
        self._revoked = set(reads.list_revoked(run_id))
        self._revocations_checked = clock()

    # ---------------------------------------------------------------- refusals
    def _refuse(
        self, exc: FedplatError, kind: str, client_id: str | None = None
    ) -> None:
        # An event names (and spends the budget of) only one of the run's
        # clients: an id a caller merely claims names nobody.
        if client_id is not None and not self._is_client(client_id):
            client_id = None
        self._reject(Rejection(kind, exc.reason, client_id))
        exc.recorded = True
        raise exc

    def _is_client(self, client_id: str) -> bool:
        with self._lock:
            if client_id in self._clients:
                return True
        return self._gate.is_client(client_id)

    # --------------------------------------------------------------- challenge
    def challenge(self, client_id: str) -> Challenge:
        """A single-use challenge for an enrolment as ``client_id`` ("" for a
        new client); stateless, so it costs nothing to issue."""
        return self._gate.challenges.issue(client_id)

    # ----------------------------------------------------------------- enrol
    def enroll(self, req: EnrollRequest, peer: PeerIdentity) -> Enrollment:
        """Admit a client (or re-admit a known one) and start its session."""
        refusal = self._gate.check(req, self._revoked)
        if refusal is not None:
            self._refuse(*refusal)
        # Proof of possession: the caller signs the challenge with the key it
        # presents, so nobody registers (or replays) a key it does not hold.
        if not verify(
            req.public_key,
            req.signature,
            ENROL,
            req.challenge,
            req.client_id,
            req.public_key,
        ):
            self._refuse(
                PermissionDenied("enrolment signature does not verify"),
                "enrolment_refused",
                req.client_id or None,
            )
        cert = self._cert_identity(peer)
        known = self._known(req, cert)
        if known is not None:
            # Continuity: without a certificate, only the registered key may
            # speak for a known id (under mTLS the certificate is the identity).
            if cert is None and known.public_key != req.public_key.hex():
                self._refuse(UnknownClient(UNKNOWN_ID), "identity_refused", known.id)
            if known.revoked_at is not None or known.id in self._revoked:
                self._refuse(
                    PermissionDenied("this client was revoked"),
                    "enrolment_refused",
                    known.id,
                )
        elif req.client_id:
            self._refuse(UnknownClient(UNKNOWN_ID), "enrolment_refused")
        if req.layout != self.layout:
            # Only an admitted caller learns how its model differs from the run's.
            self._refuse(
                InvalidArgument(
                    f"model layout does not match run {self.cfg.run.name!r}: "
                    f"{self.layout.describe_mismatch(req.layout)}"
                ),
                "enrolment_refused",
                known.id if known else None,
            )
        return self._admit(req, known.id if known else None, cert)

    def _cert_identity(self, peer: PeerIdentity) -> str | None:
        if self.mode != "mtls":
            return None
        if peer.cert_pem is None:
            self._refuse(
                PermissionDenied("a client certificate is required"),
                "enrolment_refused",
            )
        if is_operator_certificate(peer.cert_pem or b""):
            # An operator's certificate (docs/control.md) acts on the control
            # API only, never as a device, even from the devices' CA.
            self._refuse(
                PermissionDenied("an operator certificate cannot enrol as a device"),
                "enrolment_refused",
            )
        try:
            return fingerprint(peer.cert_pem or b"")
        except CertError as exc:
            self._refuse(
                PermissionDenied(f"unusable client certificate: {exc}"),
                "enrolment_refused",
            )
        raise AssertionError("unreachable")

    def _known(self, req: EnrollRequest, cert: str | None) -> ClientRecord | None:
        if cert is not None:
            bound = self.reads.find_client(self.run_id, cert_fingerprint=cert)
            if bound is not None and req.client_id not in ("", bound.id):
                self._refuse(
                    PermissionDenied("this certificate is bound to another client id"),
                    "identity_refused",
                    req.client_id or None,
                )
            if bound is not None:
                return bound
        if not req.client_id:
            return None
        known = self.reads.get_client(self.run_id, req.client_id)
        if known is not None and cert is not None and known.cert_fingerprint != cert:
            # The answer an unknown id gets: a certificate holder learns
            # nothing about which ids exist.
            self._refuse(UnknownClient(UNKNOWN_ID), "identity_refused", req.client_id)
        return known

    def _admit(
        self, req: EnrollRequest, client_id: str | None, cert: str | None
    ) -> Enrollment:
        new = client_id is None
        self._spend(req, client_id)
        client_id = client_id or secrets.token_hex(8)
        token = req.enrolment_token if new and self.mode == "tokens" else None
        try:
            rec = self.recorder.enrol_client(
                client_id,
                token=token,
                run_name=self.cfg.run.name,
                name=req.name,
                num_examples=req.num_examples,
                info=dict(req.info),
                public_key=req.public_key.hex(),
                cert_fingerprint=cert,
            )
        except EnrolmentRefused as exc:
            if exc.token:
                self._refuse(PermissionDenied(exc.reason), "enrolment_refused")
            self._refuse(PermissionDenied(exc.reason), "identity_refused", client_id)
        if token is not None:
            assert self._gate.tokens is not None
            self._gate.tokens.discard(token)
        self._gate.admitted(client_id, req.public_key)
        return self._start_session(req, client_id, rec.max_examples, cert)

    def _spend(self, req: EnrollRequest, client_id: str | None) -> None:
        """An admissible enrolment spends its challenge and the rate limit."""
        if not self._gate.challenges.spend(req.challenge):
            self._refuse(
                PermissionDenied("enrolment challenge already used"),
                "enrolment_refused",
                client_id,
            )
        if not self._gate.limits.admit(client_id):
            self._refuse(
                ResourceExhausted(
                    "enrolment rate limit"
                    + ("" if client_id is None else " for this client")
                    + "; retry later"
                ),
                "enrol_rate_limited",
                client_id,
            )

    def _start_session(
        self,
        req: EnrollRequest,
        client_id: str,
        max_examples: int | None,
        cert: str | None,
    ) -> Enrollment:
        token = secrets.token_urlsafe(32)
        now = self.clock()
        expires = now + self.adm.session_seconds
        with self._lock:
            prev = self._clients.get(client_id)
            seq = prev.seq if prev is not None else self._next_seq
            if prev is None:
                self._next_seq += 1
            state = ClientState(
                client_id,
                req.name,
                seq,
                req.public_key,
                req.num_examples,
                max_examples,
                now,
                _digest(token),
                expires,
                cert=cert,
            )
            self._clients[client_id] = state
        self._on_enrol(state)
        s = self.cfg.server
        return Enrollment(
            client_id=client_id,
            token=token,
            run_id=self.run_id,
            run_name=self.cfg.run.name,
            layout=self.layout,
            max_message_bytes=s.max_message_bytes,
            max_update_bytes=s.max_update_bytes,
            session_expires_unix=expires,
        )

    # -------------------------------------------------------------- sessions
    def authenticate(
        self, client_id: str, token: str, peer: PeerIdentity | None = None
    ) -> ClientState:
        """The caller's client if the session token is valid (and, under mutual
        TLS, presented over the certificate the client enrolled with).

        Every failure a caller without the session could cause is the same
        UNAUTHENTICATED answer, so nobody learns which client ids exist."""
        with self._lock:
            c = self._clients.get(client_id)
            now = self.clock()
            if c is None:
                raise Unauthenticated(NO_SESSION)
            if not hmac.compare_digest(c.session, _digest(token)):
                self._refuse(Unauthenticated(NO_SESSION), "unauthenticated", client_id)
            if c.cert is not None and self._peer_cert(peer) != c.cert:
                self._refuse(Unauthenticated(NO_SESSION), "identity_refused", client_id)
            if c.revoked:
                self._refuse(
                    PermissionDenied("this client was revoked"), "revoked", client_id
                )
            if now >= c.session_expires:
                raise Unauthenticated("session expired; enrol again")
            c.last_seen = now
        self._on_seen(client_id)
        return c

    @staticmethod
    def _peer_cert(peer: PeerIdentity | None) -> str | None:
        if peer is None or peer.cert_pem is None:
            return None
        try:
            return fingerprint(peer.cert_pem)
        except CertError:
            return None

    def touch(self, c: ClientState) -> None:
        """The client is still waiting in a long poll: it is alive."""
        with self._lock:
            c.last_seen = self.clock()
        # The store's last_seen follows the registry's, so the monitor's view of
        # liveness is the one the driver selects with.
        self._on_seen(c.client_id)

    @contextmanager
    def slot(self, c: ClientState, kind: str) -> Iterator[None]:
        """At most one upload and one download in flight per client, whatever
        its sessions."""
        key = (c.client_id, kind)
        with self._lock:
            if key in self._busy:
                self._refuse(
                    ResourceExhausted(f"another {kind} of this client is in progress"),
                    f"{kind}_busy",
                    c.client_id,
                )
            self._busy.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(key)

    # --------------------------------------------------------------- queries
    def get(self, client_id: str) -> ClientState | None:
        with self._lock:
            return self._clients.get(client_id)

    def live(self) -> list[ClientState]:
        """Clients heard from within ``liveness_seconds``, in enrolment order."""
        now = self.clock()
        ttl = self.cfg.deadlines.liveness_seconds
        with self._lock:
            alive = [
                c
                for c in self._clients.values()
                if not c.revoked and now - c.last_seen <= ttl
            ]
        return sorted(alive, key=lambda c: c.seq)

    def population(self) -> int:
        """Enrolled clients that are not revoked (live or not)."""
        with self._lock:
            return sum(not c.revoked for c in self._clients.values())

    def weight(self, c: ClientState, declared: int) -> int:
        """The aggregation weight a client's declared example count earns."""
        cap = self.cfg.aggregator.max_examples_per_client
        if c.max_examples is not None:
            cap = min(cap, c.max_examples)
        return max(0, min(declared, cap))

    def refresh_revocations(self) -> list[str]:
        """Pick up revocations made in the store; returns newly revoked ids."""
        now = self.clock()
        if now - self._revocations_checked < self.adm.revocation_poll_seconds:
            return []
        self._revocations_checked = now
        revoked = set(self.reads.list_revoked(self.run_id))
        with self._lock:
            new = sorted(revoked - self._revoked)
            self._revoked = revoked
            for cid in new:
                c = self._clients.get(cid)
                if c is not None:
                    c.revoked = True
        return new


__all__ = ["ClientRegistry", "ClientState", "PeerIdentity"]
