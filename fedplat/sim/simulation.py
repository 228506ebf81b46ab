"""In-process simulation: many clients, the real round engine, no sockets.

Clients are ordinary :class:`fedplat.client.Client` objects connected through
:class:`~fedplat.transport.inmemory.InMemoryConnection`, so uploads pass the same
encoding, validation and middleware as in deployment. Rounds are driven step by step
on a virtual clock: deadlines never expire because the host CPU is slow, which keeps
simulations reproducible.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedplat.client import Client
from fedplat.server.config import RunConfig
from fedplat.server.engine import RoundEngine, RoundOutcome
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
    engine = RoundEngine(cfg, store, clock=clock)

    def factory() -> InMemoryConnection:
        return InMemoryConnection(engine)

    clients: Sequence[Client] = [build_client(i, factory) for i in range(num_clients)]
    outcomes: list[RoundOutcome] = []
    try:
        for c in clients:
            c.enroll()
        while not engine.finished:
            for c in clients:  # a poll marks the client live
                c.step(wait_seconds=0.0)
            if len(engine.live_clients()) < cfg.selection.min_available:
                raise RuntimeError(
                    f"only {len(engine.live_clients())} clients live, "
                    f"min_available is {cfg.selection.min_available}"
                )
            engine.open_round()
            for c in clients:
                c.step(wait_seconds=0.0)
            clock.advance(1.0)
            outcome = engine.close_round()
            outcomes.append(outcome)
            if on_round is not None:
                on_round(outcome)
    finally:
        if own_store:
            store.close()
    return SimulationResult(engine.run_id, outcomes)
