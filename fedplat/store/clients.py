"""Clients enrolled in runs, their identities, and enrolment tokens.

A client's identity is its registered Ed25519 public key (and, under mutual TLS,
its certificate fingerprint); both are unique within a run, so no second client
id can claim them. Enrolment tokens are single use: only their SHA-256 is stored,
and :meth:`ClientsStore.consume_token` marks one used in the same transaction that
checks it, so two enrolments racing with one token cannot both win.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from fedplat.store.base import StoreBase
from fedplat.store.convert import _client_record, _token_record
from fedplat.store.models import Client, EnrolmentToken
from fedplat.store.records import ClientRecord, EnrolmentTokenRecord
from fedplat.store.statuses import (
    CLIENT_STATUSES,
)
from fedplat.store.validate import (
    _ID_MAX,
    _NAME_MAX,
    StoreError,
    _aware,
    _choice,
    _count,
    _encode,
    _now,
    _rowcount,
    _sha_hex,
    _text,
)

TOKEN_PREFIX = "fpt1."
MAX_TOKENS_PER_CALL = 100_000


class TokenError(StoreError):
    """An enrolment token is unknown, used, expired, revoked or for another run."""


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _check_prefix(secret: object) -> None:
    if not isinstance(secret, str) or not secret.startswith(TOKEN_PREFIX):
        raise TokenError("not an enrolment token")


def _check_token(row: EnrolmentToken | None, run_name: str, now: datetime) -> None:
    """Raise a :class:`TokenError` naming why ``row`` cannot be used now."""
    if row is None:
        raise TokenError("unknown enrolment token")
    if row.revoked_at is not None:
        raise TokenError(f"enrolment token {row.id} was revoked")
    if row.used_at is not None:
        raise TokenError(f"enrolment token {row.id} was already used")
    if row.expires_at <= now:
        raise TokenError(f"enrolment token {row.id} expired")
    if row.run_name is not None and row.run_name != run_name:
        raise TokenError(f"enrolment token {row.id} is for another run")


def _spend(
    session: Session, secret: str, run_id: str, run_name: str, client_id: str
) -> EnrolmentToken:
    """Mark the token ``secret`` used by ``client_id`` in ``session`` (locked
    for update, so two racing enrolments cannot both spend it)."""
    now = _now()
    row = session.scalar(
        select(EnrolmentToken)
        .where(EnrolmentToken.token_hash == token_hash(secret))
        .with_for_update()
    )
    _check_token(row, run_name, now)
    assert row is not None
    row.used_at = now
    row.used_run_id = run_id
    row.used_client_id = client_id
    return row


def _client_values(
    client_id: str,
    *,
    name: str,
    num_examples: int,
    info: dict[str, Any] | None,
    status: str,
    public_key: str | None,
    cert_fingerprint: str | None,
    max_examples: int | None,
    token_id: str | None,
) -> dict[str, Any]:
    """A client row's values, checked against the schema (StoreError)."""
    _text("client_id", client_id, _ID_MAX)
    _text("name", name, _NAME_MAX)
    _count("num_examples", num_examples)
    _choice("status", status, CLIENT_STATUSES)
    for field, value in (
        ("public_key", public_key),
        ("cert_fingerprint", cert_fingerprint),
    ):
        if value is not None:
            _sha_hex(field, value)
    if max_examples is not None:
        _count("max_examples", max_examples, minimum=1)
    return {
        "client_id": client_id,
        "name": name,
        "num_examples": num_examples,
        "info_json": None if info is None else _encode("info", info),
        "status": status,
        "public_key": public_key,
        "cert_fingerprint": cert_fingerprint,
        "max_examples": max_examples,
        "token_id": token_id,
    }


class ClientsStore(StoreBase):
    """Clients enrolled in runs."""

    def upsert_client(
        self,
        run_id: str,
        client_id: str,
        *,
        name: str,
        num_examples: int,
        info: dict[str, Any] | None = None,
        status: str = "enrolled",
        public_key: str | None = None,
        cert_fingerprint: str | None = None,
        max_examples: int | None = None,
        token_id: str | None = None,
    ) -> ClientRecord:
        """Enroll a client in a run, or update an enrolled one.

        An existing client gets the given ``name``, ``num_examples`` and
        ``status``, ``info`` if given, and ``last_seen`` = now; ``enrolled_at``,
        and the identity fields unless given, are kept. A public key or
        certificate already registered to another client of the run is refused.
        """
        values = _client_values(
            client_id,
            name=name,
            num_examples=num_examples,
            info=info,
            status=status,
            public_key=public_key,
            cert_fingerprint=cert_fingerprint,
            max_examples=max_examples,
            token_id=token_id,
        )
        with self._write() as session:
            return self._upsert_in(session, run_id, values)

    def enrol_with_token(
        self,
        secret: str,
        *,
        run_id: str,
        run_name: str,
        client_id: str,
        name: str,
        num_examples: int,
        info: dict[str, Any] | None = None,
        public_key: str | None = None,
    ) -> ClientRecord:
        """Spend an enrolment token and enrol ``client_id`` with it, in one
        transaction: a client the store refuses (a key registered to another
        client, a value out of range) leaves the token unused. The token's
        ``max_examples`` becomes the client's cap."""
        _check_prefix(secret)
        values = _client_values(
            client_id,
            name=name,
            num_examples=num_examples,
            info=info,
            status="active",
            public_key=public_key,
            cert_fingerprint=None,
            max_examples=None,
            token_id=None,
        )
        with self._write() as session:
            row = _spend(session, secret, run_id, run_name, client_id)
            values["max_examples"] = row.max_examples
            values["token_id"] = row.id
            return self._upsert_in(session, run_id, values)

    def _upsert_in(
        self, session: Session, run_id: str, v: dict[str, Any]
    ) -> ClientRecord:
        client_id = v["client_id"]
        self._require_run(session, run_id)
        self._check_identity_free(
            session, run_id, client_id, v["public_key"], v["cert_fingerprint"]
        )
        row = session.get(Client, (run_id, client_id))
        now = _now()
        if row is None:
            row = Client(
                run_id=run_id,
                id=client_id,
                enrolled_at=now,
                info_json=v["info_json"] if v["info_json"] is not None else "{}",
            )
            session.add(row)
        row.name = v["name"]
        row.num_examples = v["num_examples"]
        row.status = v["status"]
        row.last_seen = now
        for key in ("info_json", "public_key", "cert_fingerprint"):
            if v[key] is not None:
                setattr(row, key, v[key])
        for key in ("max_examples", "token_id"):
            if v[key] is not None:
                setattr(row, key, v[key])
        session.flush()
        return _client_record(row)

    @staticmethod
    def _check_identity_free(
        session: Session,
        run_id: str,
        client_id: str,
        public_key: str | None,
        cert_fingerprint: str | None,
    ) -> None:
        for column, value, what in (
            (Client.public_key, public_key, "public key"),
            (Client.cert_fingerprint, cert_fingerprint, "certificate"),
        ):
            if value is None:
                continue
            owner = session.scalar(
                select(Client.id).where(Client.run_id == run_id, column == value)
            )
            if owner is not None and owner != client_id:
                raise StoreError(
                    f"this {what} is already registered to another client of the run"
                )

    def find_client(
        self,
        run_id: str,
        *,
        public_key: str | None = None,
        cert_fingerprint: str | None = None,
    ) -> ClientRecord | None:
        """The client of a run registered with this public key or certificate."""
        query = select(Client).where(Client.run_id == run_id)
        if public_key is not None:
            query = query.where(Client.public_key == public_key)
        elif cert_fingerprint is not None:
            query = query.where(Client.cert_fingerprint == cert_fingerprint)
        else:
            raise StoreError("give public_key or cert_fingerprint")
        with self._read() as session:
            row = session.scalar(query)
            return None if row is None else _client_record(row)

    def touch_client(
        self, run_id: str, client_id: str, *, status: str | None = None
    ) -> None:
        """Record that a client was heard from now, optionally changing its status."""
        if self.touch_clients(run_id, [client_id], status=status) == 0:
            raise StoreError(f"unknown client {client_id!r} in run {run_id!r}")

    def touch_clients(
        self,
        run_id: str,
        client_ids: Sequence[str],
        *,
        status: str | None = None,
        when: datetime | None = None,
    ) -> int:
        """Set ``last_seen`` (and ``status``) of several clients in one statement;
        revoked clients keep their status. Returns the number of rows touched."""
        if not client_ids:
            return 0
        values: dict[str, Any] = {"last_seen": _now() if when is None else when}
        query = update(Client).where(
            Client.run_id == run_id, Client.id.in_(list(client_ids))
        )
        if status is not None:
            values["status"] = _choice("status", status, CLIENT_STATUSES)
            query = query.where(Client.revoked_at.is_(None))
        with self._write() as session:
            result = session.execute(
                query.values(**values).execution_options(synchronize_session=False)
            )
            return _rowcount(result)

    def revoke_client(self, run_id: str, client_id: str) -> ClientRecord:
        """Revoke a client: it can no longer enrol, poll or upload in the run."""
        with self._write() as session:
            row = session.get(Client, (run_id, client_id))
            if row is None:
                raise StoreError(f"unknown client {client_id!r} in run {run_id!r}")
            if row.revoked_at is None:
                row.revoked_at = _now()
            row.status = "revoked"
            session.flush()
            return _client_record(row)

    def list_revoked(self, run_id: str) -> list[str]:
        """Ids of the run's revoked clients."""
        with self._read() as session:
            return list(
                session.scalars(
                    select(Client.id).where(
                        Client.run_id == run_id, Client.revoked_at.is_not(None)
                    )
                )
            )

    def get_client(self, run_id: str, client_id: str) -> ClientRecord | None:
        """Return one client of a run, or ``None``."""
        with self._read() as session:
            row = session.get(Client, (run_id, client_id))
            return None if row is None else _client_record(row)

    def count_clients(self, run_id: str) -> int:
        """How many clients are enrolled in a run."""
        with self._read() as session:
            return int(
                session.scalar(
                    select(func.count())
                    .select_from(Client)
                    .where(Client.run_id == run_id)
                )
                or 0
            )

    def list_clients(self, run_id: str) -> list[ClientRecord]:
        """Return the clients of a run, ordered by id."""
        with self._read() as session:
            rows = session.scalars(
                select(Client).where(Client.run_id == run_id).order_by(Client.id)
            )
            return [_client_record(r) for r in rows]

    # ------------------------------------------------------------ tokens

    def create_tokens(
        self,
        count: int,
        *,
        expires_at: datetime,
        run_name: str | None = None,
        max_examples: int | None = None,
        note: str | None = None,
    ) -> list[tuple[EnrolmentTokenRecord, str]]:
        """Make ``count`` single-use tokens; returns each record with its secret
        (shown once: only the secret's SHA-256 is stored)."""
        _count("count", count, minimum=1)
        if count > MAX_TOKENS_PER_CALL:
            raise StoreError(f"at most {MAX_TOKENS_PER_CALL} tokens at a time")
        expires = _aware("expires_at", expires_at)
        now = _now()
        if expires <= now:
            raise StoreError("expires_at must be in the future")
        if run_name is not None:
            _text("run_name", run_name, _NAME_MAX)
        if note is not None:
            _text("note", note, _NAME_MAX)
        if max_examples is not None:
            _count("max_examples", max_examples, minimum=1)
        made = []
        for _ in range(count):
            tid = secrets.token_hex(6)
            secret = f"{TOKEN_PREFIX}{tid}.{secrets.token_urlsafe(32)}"
            made.append(
                (
                    EnrolmentToken(
                        id=tid,
                        token_hash=token_hash(secret),
                        run_name=run_name,
                        note=note,
                        max_examples=max_examples,
                        created_at=now,
                        expires_at=expires,
                    ),
                    secret,
                )
            )
        with self._write() as session:
            session.add_all([row for row, _ in made])
            session.flush()
            return [(_token_record(row), secret) for row, secret in made]

    def consume_token(
        self, secret: str, *, run_id: str, run_name: str, client_id: str
    ) -> EnrolmentTokenRecord:
        """Mark the token used by ``client_id``; a :class:`TokenError` (a
        StoreError) names why it cannot be used."""
        _check_prefix(secret)
        with self._write() as session:
            row = _spend(session, secret, run_id, run_name, client_id)
            session.flush()
            return _token_record(row)

    def list_tokens(self) -> list[EnrolmentTokenRecord]:
        with self._read() as session:
            rows = session.scalars(
                select(EnrolmentToken).order_by(EnrolmentToken.created_at)
            )
            return [_token_record(r) for r in rows]

    def token_problem(self, secret: str, *, run_name: str) -> str | None:
        """Why ``secret`` cannot enrol a client of ``run_name`` now (the
        message :meth:`consume_token` would raise), or None; reads only."""
        try:
            _check_prefix(secret)
            with self._read() as session:
                row = session.scalar(
                    select(EnrolmentToken).where(
                        EnrolmentToken.token_hash == token_hash(secret)
                    )
                )
                _check_token(row, run_name, _now())
        except TokenError as exc:
            return str(exc)
        return None

    def usable_token_hashes(self, run_name: str) -> set[str]:
        """The SHA-256 digests of the tokens ``run_name`` could enrol a client
        with now: not used, not revoked, not expired, for this run or any run
        (:meth:`consume_token` stays the authority; this is a prefilter)."""
        query = select(EnrolmentToken.token_hash).where(
            EnrolmentToken.used_at.is_(None),
            EnrolmentToken.revoked_at.is_(None),
            EnrolmentToken.expires_at > _now(),
            (EnrolmentToken.run_name.is_(None)) | (EnrolmentToken.run_name == run_name),
        )
        with self._read() as session:
            return set(session.scalars(query))

    def revoke_token(self, token_id: str) -> EnrolmentTokenRecord:
        with self._write() as session:
            row = session.get(EnrolmentToken, token_id)
            if row is None:
                raise StoreError(f"no enrolment token {token_id!r}")
            if row.revoked_at is None:
                row.revoked_at = _now()
            session.flush()
            return _token_record(row)
