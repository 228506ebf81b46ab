"""Regressions of an attacker's review of issue 23's coordinator (each failed on
the code it was found in):

- an upload whose call was cancelled while its worker thread committed the row
  gave that row back to the pool, so two honest uploads shared one buffer and
  FedAvg's mean was wrong;
- a secure-aggregation survivor that resent a message (or tried an upload) was
  marked rejected, then succeeded at close: an illegal transition that crashed
  the driver and failed the run;
- anyone could hold Health.Watch calls without a bound (every call slot, and a
  receive window of memory each);
- a refusal for an id someone merely claimed named (and spent a budget for)
  that id (under mutual TLS: tests/server/test_tls.py).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from fedplat.server.config import parse_config
from fedplat.server.wire import address_key, health_handler
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedplat.protocol.body import dense_body
from fedplat.protocol.errors import InvalidArgument
from fedplat.protocol.messages import PAYLOAD_V1, UpdateHeader, update_statement
from fedplat.security.identity import UPDATE
from fedplat.sim import simulate
from fedplat.sim.engine import VirtualClock, VirtualCoordinator
from fedplat.sim.simulation import admit
from fedplat.store import Store
from fedplat.transport.inmemory import InMemoryConnection
from fedplat.transport.limits import StreamSlots
from tests.support import digits_client, run_config


# ---------------------------------------------------------------- uploads
def _begin(coord: VirtualCoordinator, c: Any, value: float) -> Any:
    task = c.conn.get_task(0.0)
    body = dense_body(torch.full((coord.layout.numel,), value))
    h = UpdateHeader(
        task.task_id, task.round, 10, c.layout, body.nbytes, body.sha256, PAYLOAD_V1
    )
    sig = c.identity.sign(UPDATE, *update_statement(c.run_id, h, task.nonce))
    up = coord.begin_upload(coord.registry.get(c.client_id), replace(h, signature=sig))
    up.start()
    for piece in body.chunks(1 << 20):
        up.write(piece)
    return up


def test_a_cancelled_upload_never_gives_its_committed_row_back(tmp_path: Path) -> None:
    cfg = parse_config(run_config(tmp_path, rounds=2, clients=4, quorum=1))
    store = Store(cfg.store.url)
    coord = VirtualCoordinator(cfg, store, clock=VirtualClock())
    clients = [digits_client(i, lambda: InMemoryConnection(coord), 4) for i in range(4)]
    admit(store, cfg, clients)
    for c in clients:
        c.enroll()
    coord.keep_alive()
    coord.open_round()
    r = coord.current_round
    assert r is not None
    acc = r.accumulator
    attacker = _begin(coord, clients[0], 1e-3)
    in_commit, go = threading.Event(), threading.Event()
    real = acc.commit

    def paused(a: Any, buf: torch.Tensor) -> None:
        in_commit.set()
        go.wait(10)
        real(a, buf)

    acc.commit = paused  # type: ignore[method-assign]
    finishing = threading.Thread(target=attacker.finish)
    finishing.start()
    assert in_commit.wait(10)
    # The transport gave up on the call meanwhile: its fail() (a thread of its
    # own, as the servicer runs it) must wait for the commit, then do nothing.
    failing = threading.Thread(
        target=attacker.fail, args=(InvalidArgument("upload interrupted"),)
    )
    failing.start()
    failing.join(0.3)
    assert failing.is_alive()
    go.set()
    finishing.join(10)
    failing.join(10)
    acc.commit = real  # type: ignore[method-assign]
    attacker.fail(InvalidArgument("and again"))  # a second fail: still nothing
    for i, value in ((1, 2e-3), (2, 3e-3), (3, 4e-3)):
        _begin(coord, clients[i], value).finish()
    mean = acc.sum / acc.total_weight  # type: ignore[union-attr]
    assert float(mean[0]) == pytest.approx(2.5e-3, rel=1e-6)
    assert r.num_succeeded() == 4
    store.close()


# ---------------------------------------------------------------- secagg
@pytest.mark.parametrize("message", [3, 4])
def test_a_resent_secure_aggregation_message_does_not_fail_the_run(
    tmp_path: Path, message: int
) -> None:
    raw = run_config(
        tmp_path, rounds=2, clients=5,
        aggregator={"name": "fedavg", "weighted": False},
        selection={"sampling": "poisson", "rate": 1.0, "quorum": 1},
        deadlines={"round_seconds": 60},
        privacy={
            "mode": "central", "noise_multiplier": 0.05, "clip_norm": 1.0,
            "secure_aggregation": {"phase_seconds": 4.0, "dropout_rate": 0.2},
        },
    )  # fmt: skip
    cfg = parse_config(raw)

    class Resend:
        """Client 0's connection: its ``message``-th protocol message twice."""

        def __init__(self, inner: Any) -> None:
            self.inner, self.n = inner, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def secagg(self, req: Any) -> Any:
            reply = self.inner.secagg(req)
            if req.message:
                self.n += 1
                if self.n == message:
                    self.inner.secagg(req)  # the same signed message, resent
            return reply

    def build(i: int, factory: Any) -> Any:
        return digits_client(i, (lambda: Resend(factory())) if i == 0 else factory, 5)

    res = simulate(cfg, build, 5)
    assert [(r.completed, r.num_succeeded) for r in res.rounds] == [(True, 5)] * 2


# ---------------------------------------------------------------- health
def test_health_calls_are_capped_per_address_and_watch_ends() -> None:
    async def main() -> tuple[list[Any], float]:
        servicer = health.aio.HealthServicer()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (health_handler(servicer, StreamSlots(2, 4), watch_seconds=0.5),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                req = health_pb2.HealthCheckRequest(service="")
                watches = [stub.Watch(req) for _ in range(3)]
                got: list[Any] = []
                for w in watches:
                    try:
                        got.append([m.status async for m in w])
                    except grpc.aio.AioRpcError as exc:
                        got.append(exc.code())
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                await stub.Check(req, timeout=5)  # slots are free again
                return got, loop.time() - t0
        finally:
            await server.stop(0)

    got, _ = asyncio.run(main())
    # Two watches held their address's two slots until they ended (after
    # watch_seconds, with SERVING); the third was refused.
    assert got.count([health_pb2.HealthCheckResponse.SERVING]) == 2
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in got


def test_ipv6_callers_share_their_64() -> None:
    assert address_key("ipv6:[2001:db8::1]:443") == "ipv6:2001:db8::/64"
    assert address_key("ipv6:[2001:db8::ffff:7]:5") == "ipv6:2001:db8::/64"
    assert address_key("ipv6:[::ffff:10.0.0.1]:99") == "ipv4:10.0.0.1"
    assert address_key("ipv4:1.2.3.4:5678") == "ipv4:1.2.3.4"
