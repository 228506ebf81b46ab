"""The store's API: a thread-safe repository over the fedplat database.

Every public method runs in its own short transaction on its own ``Session``, so
the coordinator may call a single :class:`Store` from many threads. Results are
detached frozen dataclasses (:mod:`fedplat.store.records`); ORM objects never leave
the store package.

Inputs are validated at this boundary, and every failure (bad input, unknown run or
client, integrity or connection errors) surfaces as :class:`StoreError`, so callers
need to catch one exception type. The methods live in one module per table group
(runs, clients, rounds, events, ledger_rows, operators); :class:`Store` composes them.
"""

from __future__ import annotations

from fedplat.store.clients import ClientsStore
from fedplat.store.events import EventsStore
from fedplat.store.ledger_rows import LedgerStore
from fedplat.store.operators import OperatorsStore
from fedplat.store.rounds import RoundsStore
from fedplat.store.runs import RunsStore
from fedplat.store.validate import StoreError


class Store(
    RunsStore, ClientsStore, RoundsStore, EventsStore, LedgerStore, OperatorsStore
):
    """Thread-safe repository of runs, clients, rounds, participations, metrics,
    events, the contribution ledger and operator revocations (see
    :class:`fedplat.store.base.StoreBase` for the URL and migration parameters)."""


__all__ = ["Store", "StoreError"]
