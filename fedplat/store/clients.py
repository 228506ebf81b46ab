"""Clients enrolled in runs."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from fedplat.store.base import StoreBase
from fedplat.store.convert import (
    _client_record,
)
from fedplat.store.models import (
    Client,
)
from fedplat.store.records import (
    ClientRecord,
)
from fedplat.store.statuses import (
    CLIENT_STATUSES,
)
from fedplat.store.validate import (
    _ID_MAX,
    _NAME_MAX,
    StoreError,
    _choice,
    _count,
    _encode,
    _now,
    _rowcount,
    _text,
    _try_insert,
)


class ClientsStore(StoreBase):
    """Clients enrolled in runs."""

    # ------------------------------------------------------------------ #
    # Clients                                                              #
    # ------------------------------------------------------------------ #

    def upsert_client(
        self,
        run_id: str,
        client_id: str,
        *,
        name: str,
        num_examples: int,
        info: dict[str, Any] | None = None,
        status: str = "enrolled",
    ) -> ClientRecord:
        """Enroll a client in a run, or update an enrolled one.

        An existing client gets the given ``name``, ``num_examples`` and ``status``
        (policy such as "a banned client stays banned" is the caller's), ``info``
        if given, and ``last_seen`` = now; ``enrolled_at`` is kept.

        Returns
        -------
        ClientRecord
            The client after the upsert.
        """
        _text("client_id", client_id, _ID_MAX)
        _text("name", name, _NAME_MAX)
        _count("num_examples", num_examples)
        _choice("status", status, CLIENT_STATUSES)
        info_json = None if info is None else _encode("info", info)
        now = _now()
        with self._write() as session:
            self._require_run(session, run_id)
            row = session.get(Client, (run_id, client_id))
            if row is None:
                row = Client(
                    run_id=run_id,
                    id=client_id,
                    name=name,
                    status=status,
                    enrolled_at=now,
                    last_seen=now,
                    num_examples=num_examples,
                    info_json=info_json if info_json is not None else "{}",
                )
                if _try_insert(session, row):
                    return _client_record(row)
                row = session.get(Client, (run_id, client_id), populate_existing=True)
                if row is None:  # pragma: no cover - the conflicting row vanished
                    raise StoreError(f"cannot enroll client {client_id!r}")
            row.name = name
            row.num_examples = num_examples
            row.status = status
            row.last_seen = now
            if info_json is not None:
                row.info_json = info_json
            session.flush()
            return _client_record(row)

    def touch_client(
        self, run_id: str, client_id: str, *, status: str | None = None
    ) -> None:
        """Record that a client was heard from now, optionally changing its status."""
        values: dict[str, Any] = {"last_seen": _now()}
        if status is not None:
            values["status"] = _choice("status", status, CLIENT_STATUSES)
        with self._write() as session:
            result = session.execute(
                update(Client)
                .where(Client.run_id == run_id, Client.id == client_id)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if _rowcount(result) == 0:
                raise StoreError(f"unknown client {client_id!r} in run {run_id!r}")

    def get_client(self, run_id: str, client_id: str) -> ClientRecord | None:
        """Return one client of a run, or ``None``."""
        with self._read() as session:
            row = session.get(Client, (run_id, client_id))
            return None if row is None else _client_record(row)

    def list_clients(self, run_id: str) -> list[ClientRecord]:
        """Return the clients of a run, ordered by id."""
        with self._read() as session:
            rows = session.scalars(
                select(Client).where(Client.run_id == run_id).order_by(Client.id)
            )
            return [_client_record(r) for r in rows]
