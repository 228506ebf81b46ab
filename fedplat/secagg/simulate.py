"""Run one secure-aggregation round in process, every message through its wire bytes.

This is the in-memory transport of the protocol: simulations, tests and
``bench/secagg.py`` drive the same :class:`SecAggClient` and :class:`SecAggServer`
code that the coordinator will drive over gRPC. Every message is encoded by its
sender and decoded by its receiver, so byte counts are the real ones and the
parsing cost is paid where it would be.

Dropouts are injected by phase: a client in ``drop_after_shares`` shares its keys
and then goes silent (no masked input: its masks must be rebuilt from shares); a
client in ``drop_after_masked`` sends its masked input and then goes silent (no
unmask shares: its self-mask seed must be rebuilt from its neighbours' shares).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from fedplat.secagg.client import SecAggClient
from fedplat.secagg.config import SecAggConfig
from fedplat.secagg.errors import SecAggError, SecAggRejected
from fedplat.secagg.messages import Message, decode, encode
from fedplat.secagg.server import SecAggResult, SecAggServer

__all__ = ["PHASE_ORDER", "SERVER", "Meter", "run_round"]

SERVER = -1  # the server's party id in a Meter
PHASE_ORDER = ("advertise", "share", "masked_input", "unmask")
T = TypeVar("T")


@dataclass
class Meter:
    """Seconds spent and bytes sent/received, keyed by ``(phase, party)``."""

    seconds: dict[tuple[str, int], float] = field(
        default_factory=lambda: defaultdict(float)
    )
    sent: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    received: dict[tuple[str, int], int] = field(
        default_factory=lambda: defaultdict(int)
    )

    def timed(self, phase: str, party: int, fn: Callable[[], T]) -> T:
        """``fn()``, its wall time added to ``(phase, party)``."""
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.seconds[phase, party] += time.perf_counter() - start

    def carry(
        self, phase: str, sender: int, receiver: int, msg: Message, config: SecAggConfig
    ) -> Message:
        """Encode on the sender, count the bytes, decode on the receiver."""
        wire = self.timed(phase, sender, lambda: encode(msg))
        self.sent[phase, sender] += len(wire)
        self.received[phase, receiver] += len(wire)
        return self.timed(phase, receiver, lambda: decode(wire, config))


def run_round(
    config: SecAggConfig,
    updates: Mapping[int, torch.Tensor],
    *,
    drop_after_shares: Collection[int] = (),
    drop_after_masked: Collection[int] = (),
    meter: Meter | None = None,
) -> SecAggResult:
    """One full round over ``updates`` (client id -> float ``[dim]``).

    Returns the server's :class:`SecAggResult`; raises
    :class:`fedplat.secagg.SecAggAborted` if the round cannot complete. A client
    that refuses a server message (raises :class:`SecAggError`) drops out.
    """
    m = meter if meter is not None else Meter()
    clients = {c: SecAggClient(config, c) for c in updates}
    server = SecAggServer(config, clients)
    gone_at = {"masked_input": set(drop_after_shares)}
    gone_at["unmask"] = gone_at["masked_input"] | set(drop_after_masked)

    def deliver(phase: str, inbox: Mapping[int, Message]) -> None:
        for c, msg in inbox.items():
            got = m.carry(phase, c, SERVER, msg, config)
            # A refused message is kept in server.rejections.
            with contextlib.suppress(SecAggRejected):
                m.timed(phase, SERVER, functools.partial(server.receive, got))

    def answer(phase: str, c: int, msg: Message) -> Message | None:
        got = m.carry(phase, SERVER, c, msg, config)
        try:
            return m.timed(phase, c, lambda: clients[c].respond(got, updates[c]))
        except SecAggError:
            return None  # the client refuses and drops out

    deliver(
        "advertise",
        {c: m.timed("advertise", c, cl.advertise) for c, cl in clients.items()},
    )
    for phase in PHASE_ORDER[1:]:
        outbox = m.timed(phase, SERVER, server.close)
        replies = {}
        for c, msg in outbox.items():
            if c in gone_at.get(phase, ()):
                continue
            reply = answer(phase, c, msg)
            if reply is not None:
                replies[c] = reply
        deliver(phase, replies)
    m.timed("unmask", SERVER, server.close)
    return server.result
