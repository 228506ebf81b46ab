"""In-process simulation: many clients, the real round engine, no sockets.

Clients are ordinary :class:`fedplat.client.Client` objects connected through
:class:`~fedplat.transport.inmemory.InMemoryConnection`, so enrolment (with a real
enrolment token each), signed uploads, the intake's checks and the middleware are
the deployment's. Rounds are driven step by step on a virtual clock
(:mod:`fedplat.sim.engine`): deadlines never expire because the host CPU is slow,
which keeps simulations reproducible, and only the selected clients are stepped in
a round, so a run of 10,000 clients that samples 1% costs 100 clients' work per
round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from fedplat.client import Client
from fedplat.server.config import RunConfig
from fedplat.server.coordinator import RoundOutcome
from fedplat.sim.engine import (
    SimulationResult,
    VirtualClock,
    VirtualCoordinator,
    drive,
    enrol,
    fail_run,
    step_client,
)
from fedplat.store import Store
from fedplat.transport.inmemory import InMemoryConnection

log = logging.getLogger("fedplat.sim")

ClientBuilder = Callable[[int, Callable[[], InMemoryConnection]], Client]


def admit(store: Store, cfg: RunConfig, clients: Sequence[Client]) -> None:
    """Give every client that has none an enrolment token of the run."""
    if cfg.admission_mode != "tokens":
        return
    need = [c for c in clients if not c.enrolment_token]
    if not need:
        return
    expires = datetime.now(UTC) + timedelta(days=1)
    tokens = store.create_tokens(len(need), expires_at=expires, run_name=cfg.run.name)
    for c, (_, secret) in zip(need, tokens, strict=True):
        c.enrolment_token = secret


def simulate(
    cfg: RunConfig,
    build_client: ClientBuilder,
    num_clients: int,
    *,
    store: Store | None = None,
    on_round: Callable[[RoundOutcome], None] | None = None,
) -> SimulationResult:
    """Run ``cfg`` with ``num_clients`` in-process clients until it finishes.

    ``build_client(i, connection_factory)`` returns client ``i`` wired to the given
    in-memory connection factory; every client enrols before round 1 (cheap
    builders such as :class:`fedplat.sim.clients.ReferencePopulation` share one
    model and load a client's data only when it first trains). An error on the
    way marks the run ``failed`` in the store, then propagates.
    """
    own_store = store is None
    store = store or Store(cfg.store.url)
    coord = VirtualCoordinator(cfg, store, clock=VirtualClock())

    def factory() -> InMemoryConnection:
        return InMemoryConnection(coord)

    try:
        clients = [build_client(i, factory) for i in range(num_clients)]
        admit(store, cfg, clients)
        for c in clients:
            enrol(c)
        by_id = {c.client_id: c for c in clients}

        def step_selected(ids: Sequence[str]) -> None:
            for cid in ids:
                step_client(by_id[cid])

        outcomes = drive(coord, step_selected, on_round)
    except BaseException as exc:  # the run must be marked, whatever happened
        fail_run(coord, exc)
        raise
    finally:
        coord.ctx.recorder.flush()
        if own_store:
            store.close()
    return SimulationResult(coord.run_id, outcomes)


__all__ = ["SimulationResult", "VirtualClock", "admit", "simulate"]
