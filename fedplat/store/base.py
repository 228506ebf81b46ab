"""Sessions and connection handling shared by every part of the store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Self

from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from fedplat.store.engine import WRITE_TRANSACTION_OPTION, make_engine, resolve_url
from fedplat.store.models import (
    Run,
)
from fedplat.store.schema import migrate as _migrate
from fedplat.store.validate import (
    _ID_MAX,
    StoreError,
    _text,
)


def _reason(exc: BaseException) -> str:
    """A database failure on one line: the driver's own message (SQLAlchemy's
    adds the statement and a "Background on this error" link on more lines),
    whitespace collapsed, so a command can print it as its one-line error."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    if isinstance(cause, FileExistsError) and cause.filename:
        return f"{cause.filename} exists and is not a folder"
    if isinstance(cause, OSError) and cause.strerror and cause.filename:
        return f"{cause.filename}: {cause.strerror}"
    text = " ".join(str(cause).split()) or type(cause).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# --------------------------------------------------------------------------- #
# The store                                                                    #
# --------------------------------------------------------------------------- #


class StoreBase:
    """Thread-safe repository of runs, clients, rounds, participations, metrics,
    events and the contribution ledger.

    Parameters
    ----------
    url
        Any SQLAlchemy URL (``sqlite:///...``, ``postgresql+psycopg://...``) or a
        plain filesystem path, which means a SQLite database at that path (parent
        directories are created).
    migrate
        Run Alembic ``upgrade head`` before use. Read-only clients such as the
        monitor pass ``False`` and rely on the coordinator having migrated.

    Attributes
    ----------
    url
        The resolved SQLAlchemy URL (password included; use ``repr`` to log).

    Notes
    -----
    On SQLite the database runs in WAL mode with a 30 s busy timeout, and write
    transactions begin with ``BEGIN IMMEDIATE``, so concurrent writers queue
    instead of failing with "database is locked".
    """

    url: str

    def __init__(self, url: str, *, migrate: bool = True) -> None:
        if not isinstance(url, str) or not url:
            raise StoreError(f"url must be a non-empty string, got {url!r}")
        try:
            resolved = resolve_url(url)
            self._engine = make_engine(resolved)
        except (SQLAlchemyError, ValueError, OSError) as exc:
            raise StoreError(f"cannot open store {url!r}: {_reason(exc)}") from exc
        self.url = resolved.render_as_string(hide_password=False)
        self._display_url = resolved.render_as_string(hide_password=True)
        self._closed = False
        # expire_on_commit=False: records are built after commit without a
        # round trip to reload attributes the transaction itself just wrote.
        self._reader = sessionmaker(self._engine, expire_on_commit=False)
        self._writer = sessionmaker(
            self._engine.execution_options(**{WRITE_TRANSACTION_OPTION: True}),
            expire_on_commit=False,
        )
        if migrate:
            try:
                _migrate(self._engine)
            except Exception as exc:
                self._engine.dispose()
                raise StoreError(
                    f"cannot migrate store {self._display_url}: {_reason(exc)}"
                ) from exc

    def __repr__(self) -> str:
        return f"Store({self._display_url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every pooled connection. Further calls raise StoreError."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    # ------------------------------------------------------------------ #
    # Sessions                                                             #
    # ------------------------------------------------------------------ #

    @contextmanager
    def _session(self, factory: sessionmaker[Session]) -> Iterator[Session]:
        if self._closed:
            raise StoreError("store is closed")
        try:
            with factory.begin() as session:
                yield session
        except StoreError:
            raise
        except IntegrityError as exc:
            raise StoreError(f"integrity violation: {_reason(exc)}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {_reason(exc)}") from exc

    def _read(self) -> AbstractContextManager[Session]:
        return self._session(self._reader)

    def _write(self) -> AbstractContextManager[Session]:
        return self._session(self._writer)

    @staticmethod
    def _require_run(session: Session, run_id: str, *, lock: bool = False) -> Run:
        _text("run_id", run_id, _ID_MAX)
        run = session.get(Run, run_id, with_for_update=lock or None)
        if run is None:
            raise StoreError(f"unknown run {run_id!r}")
        return run
