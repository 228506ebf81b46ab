"""The read port: every store read a running coordinator makes.

The recorder (:mod:`fedplat.server.recorder`) is the only writer of the store;
the parts of a run read through :class:`StoreReader`, which holds the store
privately and offers exactly the reads they make. Each part that is handed a
reader of its own is typed by the protocol below naming what it reads:

- :class:`RunReads`: opening or resuming the run (:mod:`fedplat.server.runstate`);
- :class:`AdmissionReads`: the enrolment gate (:mod:`fedplat.server.admission`):
  the usable tokens' digests, why a token cannot enrol, the run's clients;
- :class:`RegistryReads`: the registry (:mod:`fedplat.server.registry`), the
  gate's reads and a client by id or certificate, and the revocations.

Through the run's context: the closer reads the run's rounds (the best
checkpoint), the coordinator the run's record, an edge driver a round's
participations (:mod:`fedplat.server.upstream`), and the contribution
accountant its ledger (:class:`fedplat.contribution.ContributionStore`).

Nothing here is read on behalf of a client's call except at enrolment, which
waits for the database by nature (a durable admission before the answer); the
gate reads tokens in memory first, at a bounded reload rate
(:class:`fedplat.server.admission.UsableTokens`).

The records returned, and the store's token digest, are this port's output
types, re-exported deliberately so that server/ needs no other door to the store.
"""

from __future__ import annotations

from typing import Protocol

from fedplat.store import (
    ClientRecord,
    LedgerEntryRecord,
    LedgerHeadRecord,
    ParticipationRecord,
    RoundRecord,
    RunRecord,
    Store,
)
from fedplat.store.clients import TOKEN_PREFIX, token_hash


class RunReads(Protocol):
    """What opening or resuming a run reads."""

    def get_run_by_name(self, name: str) -> RunRecord | None: ...

    def last_completed_round(self, run_id: str) -> RoundRecord | None: ...


class AdmissionReads(Protocol):
    """What the enrolment gate reads (tokens in memory first, see the module
    docstring)."""

    def usable_token_hashes(self, run_name: str) -> set[str]: ...

    def token_problem(self, secret: str, *, run_name: str) -> str | None: ...

    def list_clients(self, run_id: str) -> list[ClientRecord]: ...


class RegistryReads(AdmissionReads, Protocol):
    """What the client registry reads (its gate's reads included)."""

    def get_client(self, run_id: str, client_id: str) -> ClientRecord | None: ...

    def find_client(
        self, run_id: str, *, cert_fingerprint: str
    ) -> ClientRecord | None: ...

    def list_revoked(self, run_id: str) -> list[str]: ...


class StoreReader:
    """The store, read only, as far as server/ reads it (module docstring)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    # -------------------------------------------------------------- runs
    def get_run(self, run_id: str) -> RunRecord | None:
        return self._store.get_run(run_id)

    def get_run_by_name(self, name: str) -> RunRecord | None:
        return self._store.get_run_by_name(name)

    # -------------------------------------------------------------- rounds
    def last_completed_round(self, run_id: str) -> RoundRecord | None:
        return self._store.last_completed_round(run_id)

    def list_rounds(self, run_id: str) -> list[RoundRecord]:
        return self._store.list_rounds(run_id)

    def list_participations(
        self, run_id: str, round_number: int
    ) -> list[ParticipationRecord]:
        return self._store.list_participations(run_id, round_number)

    # -------------------------------------------------------------- clients
    def get_client(self, run_id: str, client_id: str) -> ClientRecord | None:
        return self._store.get_client(run_id, client_id)

    def find_client(self, run_id: str, *, cert_fingerprint: str) -> ClientRecord | None:
        return self._store.find_client(run_id, cert_fingerprint=cert_fingerprint)

    def list_clients(self, run_id: str) -> list[ClientRecord]:
        return self._store.list_clients(run_id)

    def list_revoked(self, run_id: str) -> list[str]:
        return self._store.list_revoked(run_id)

    # -------------------------------------------------------------- tokens
    def usable_token_hashes(self, run_name: str) -> set[str]:
        return self._store.usable_token_hashes(run_name)

    def token_problem(self, secret: str, *, run_name: str) -> str | None:
        return self._store.token_problem(secret, run_name=run_name)

    # -------------------------------------------------------------- ledger
    def list_ledger_entries(self, run_id: str) -> list[LedgerEntryRecord]:
        return self._store.list_ledger_entries(run_id)

    def get_ledger_head(self, run_id: str) -> LedgerHeadRecord | None:
        return self._store.get_ledger_head(run_id)


__all__ = [
    "TOKEN_PREFIX",
    "AdmissionReads",
    "ClientRecord",
    "ParticipationRecord",
    "RegistryReads",
    "RoundRecord",
    "RunReads",
    "RunRecord",
    "StoreReader",
    "token_hash",
]
