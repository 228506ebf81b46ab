"""In-process simulation: many clients, the real round engine, no sockets.

Clients are ordinary :class:`fedplat.client.Client` objects connected through
:class:`~fedplat.transport.inmemory.InMemoryConnection`, so enrolment (with a real
enrolment token each), signed uploads, the intake's checks and the middleware are
the deployment's. Rounds are driven step by step on a virtual clock: deadlines never
expire because the host CPU is slow, which keeps simulations reproducible.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fedplat.client import Client
from fedplat.server.config import RunConfig
from fedplat.server.coordinator import Coordinator, RoundOutcome
from fedplat.store import Store
from fedplat.transport.inmemory import InMemoryConnection

log = logging.getLogger("fedplat.sim")


class VirtualClock:
    """A clock that moves only when told to (seconds since the epoch)."""

    def __init__(self, start: float = 1.7e9) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass(frozen=True)
class SimulationResult:
    run_id: str
    rounds: list[RoundOutcome]

    @property
    def final_accuracy(self) -> float | None:
        done = [
            r.accuracy for r in self.rounds if r.completed and r.accuracy is not None
        ]
        return done[-1] if done else None


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


def _secure_aggregation(
    coord: Coordinator, r: Any, selected: Sequence[Client], clock: VirtualClock
) -> None:
    """Step the selected clients through the protocol's phases; a phase that
    waits for a client that stopped answering closes at its deadline (the clock
    jumps there)."""
    sa = r.secagg
    while not coord.driver.round_done(r):
        phase = sa.phase
        for c in selected:
            c.step(wait_seconds=0.0)
        if not coord.driver.round_done(r) and sa.phase == phase:
            clock.t = max(clock.t, sa.phase_deadline)


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
    in-memory connection factory.
    """
    own_store = store is None
    store = store or Store(cfg.store.url)
    clock = VirtualClock()
    coord = Coordinator(cfg, store, clock=clock)

    def factory() -> InMemoryConnection:
        return InMemoryConnection(coord)

    clients: Sequence[Client] = [build_client(i, factory) for i in range(num_clients)]
    admit(store, cfg, clients)
    outcomes: list[RoundOutcome] = []
    # Only the selected clients act in a round; everyone else polls once per half
    # liveness window (virtual seconds), which keeps them live: a client that is
    # not selected costs nothing per round, so thousands of clients at a small
    # sampling rate cost what the sampled ones do.
    every = cfg.deadlines.liveness_seconds / 2.0
    last_poll: float | None = None
    try:
        for c in clients:
            c.enroll()
        by_id = {c.client_id: c for c in clients}
        while not coord.finished:
            if last_poll is None or clock() - last_poll >= every:
                for c in clients:  # a poll marks the client live
                    c.step(wait_seconds=0.0)
                last_poll = clock()
            live = len(coord.live_clients())
            if live < cfg.selection.min_available:
                raise RuntimeError(
                    f"only {live} clients live, min_available is "
                    f"{cfg.selection.min_available}"
                )
            if coord.open_round() is None:
                break
            r = coord.current_round
            assert r is not None
            selected = [by_id[cid] for cid in r.assignments]
            for c in selected:
                c.step(wait_seconds=0.0)
            if r.secagg is not None:
                _secure_aggregation(coord, r, selected, clock)
            clock.advance(1.0)
            outcome = coord.close_round()
            outcomes.append(outcome)
            if on_round is not None:
                on_round(outcome)
    finally:
        coord.ctx.recorder.flush()
        if own_store:
            store.close()
    return SimulationResult(coord.run_id, outcomes)
