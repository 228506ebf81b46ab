"""Flower's own strategy for a fedplat rule, and a strategy that times its
aggregation step (optionally beside a peer's on the same replies).

Used to compare the two sides on the same app; the mapping states where
Flower's strategy differs from the fedplat rule of the same name.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from typing import Any

from fedplat.server.config import AggregatorSection
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (
    Bulyan,
    FedAvg,
    FedMedian,
    FedTrimmedAvg,
    Krum,
    MultiKrum,
    Strategy,
)

#: fedplat rules that Flower also ships as a strategy.
SHARED_RULES = ("fedavg", "krum", "multi_krum", "median", "trimmed_mean", "bulyan")


def flower_strategy(section: AggregatorSection, num_nodes: int, **kw: Any) -> FedAvg:
    """Flower's strategy for ``section``'s rule over ``num_nodes`` replies.

    Differences from fedplat's rule of the same name: Flower's MultiKrum
    averages the selected models weighted by example counts (fedplat's
    uniformly); Flower's Bulyan selects its ``n - 2f`` candidates with one
    Multi-Krum pass, not by repeated Krum, and averages the ``n - 4f`` values
    closest to the median per coordinate. Pre-aggregators have no Flower
    counterpart.
    """
    if section.pre:
        raise ValueError("Flower's strategies have no pre-aggregators")
    name, p = section.name, dict(section.params)
    f = int(p.get("f", 0))
    if name == "fedavg":
        return FedAvg(**kw)
    if name == "krum":
        return Krum(num_malicious_nodes=f, **kw)
    if name == "multi_krum":
        m = int(p.get("m") or num_nodes - f)
        return MultiKrum(num_malicious_nodes=f, num_nodes_to_select=m, **kw)
    if name == "median":
        return FedMedian(**kw)
    if name == "trimmed_mean":
        # FedTrimmedAvg cuts int(beta * n) per side; (f + 1/4) / n gives f.
        return FedTrimmedAvg(beta=(f + 0.25) / num_nodes, **kw)
    if name == "bulyan":
        return Bulyan(num_malicious_nodes=f, **kw)
    raise ValueError(f"Flower has no strategy for {name!r}; shared: {SHARED_RULES}")


class Timed(Strategy):
    """``primary``'s strategy, timing each ``aggregate_train`` call; with a
    ``peer``, the peer aggregates its own copy of the same replies (its result
    is dropped) and is timed too. Copies are made outside the timed calls
    (Flower's median strategies consume the replies' arrays)."""

    def __init__(self, primary: FedAvg, peer: FedAvg | None = None) -> None:
        self.primary, self.peer = primary, peer
        self.seconds: dict[int, float] = {}
        self.peer_seconds: dict[int, float] = {}

    def summary(self) -> None:
        self.primary.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.peer is not None:
            # The peer sees the same global model (all nodes are sampled).
            peer_config = ConfigRecord(dict(config))
            list(self.peer.configure_train(server_round, arrays, peer_config, grid))
        return self.primary.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        if self.peer is None:
            return self._timed(self.primary, self.seconds, server_round, replies)
        mine, theirs = copy.deepcopy(replies), copy.deepcopy(replies)
        # Alternate which side runs first: neither always finds warm caches.
        if server_round % 2:
            self._timed(self.peer, self.peer_seconds, server_round, theirs)
            return self._timed(self.primary, self.seconds, server_round, mine)
        out = self._timed(self.primary, self.seconds, server_round, mine)
        self._timed(self.peer, self.peer_seconds, server_round, theirs)
        return out

    @staticmethod
    def _timed(
        strategy: FedAvg,
        seconds: dict[int, float],
        server_round: int,
        replies: list[Message],
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        t0 = time.perf_counter()
        out = strategy.aggregate_train(server_round, replies)
        seconds[server_round] = time.perf_counter() - t0
        return out

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.primary.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.primary.aggregate_evaluate(server_round, replies)
