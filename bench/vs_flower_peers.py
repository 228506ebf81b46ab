"""The peers bench/vs_flower.py runs fedplat against, as process roles.

* ``flower-server`` / ``flower-clients``: Flower's embedded transport
  (the deprecated ``flwr.server.start_server`` / ``flwr.client.start_client``),
  FedAvg over every client, no evaluation; client ``i`` returns the received
  arrays plus ``1e-3 * (i + 1)``.
* ``loop-server`` / ``loop-clients``: the loopback floor: per round the server
  sends the model's bytes to every client over a plain TCP socket (one thread
  per connection) and reads back the same number of bytes from each; no
  framing, hashing, decoding or arithmetic.
* ``grpc-server`` / ``grpc-clients``: the gRPC floor: the same bytes through
  bare ``grpc.aio`` streams (a server-streamed download, a client-streamed
  upload, both as pre-cut ``bytes`` messages of ``--chunk`` bytes with no
  serializer, gRPC's default flow control); no authentication, hashing,
  decoding, arithmetic or store. What the transport costs before fedplat adds
  anything. Unlike fedplat, both directions use ``--chunk`` (fedplat's SDK
  uploads 1 MiB chunks) and neither end fixes its window.

Every server writes ``{"completed_at": [unix seconds per round]}`` to ``--out``:
the time its round's last update was in (aggregated, for Flower).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


# ------------------------------------------------------------ Flower embedded
def flower_server(
    address: str, clients: int, numel: int, rounds: int, out: Path
) -> None:
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerConfig, start_server
    from flwr.server.strategy import FedAvg

    completed: list[float] = []

    class TimedFedAvg(FedAvg):
        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            agg = super().aggregate_fit(server_round, results, failures)
            completed.append(time.time())
            if failures:
                raise RuntimeError(f"round {server_round}: {len(failures)} failures")
            return agg

    strategy = TimedFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=clients,
        min_available_clients=clients,
        initial_parameters=ndarrays_to_parameters([np.zeros(numel, np.float32)]),
    )
    start_server(
        server_address=address,
        config=ServerConfig(num_rounds=rounds),
        strategy=strategy,
    )
    out.write_text(json.dumps({"completed_at": completed}))


def flower_clients(address: str, first: int, count: int) -> None:
    from flwr.client import NumPyClient, start_client

    class Shift(NumPyClient):
        def __init__(self, i: int) -> None:
            self.shift = np.float32(1e-3 * (i + 1))

        def fit(self, parameters: Any, config: Any) -> Any:
            return [p + self.shift for p in parameters], 10, {}

    def run(i: int) -> None:
        start_client(
            server_address=address,
            client=Shift(i).to_client(),
            insecure=True,
            max_retries=20,
            max_wait_time=120,
        )

    _in_threads(run, first, count)


def _in_threads(run: Callable[[int], None], first: int, count: int) -> None:
    """``run(i)`` for clients ``first .. first + count - 1``, one thread each;
    exits 1 if any of them raised (the runner then stops the server)."""
    failed: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            run(i)
        except BaseException as exc:
            failed.append(exc)
            raise

    threads = [
        threading.Thread(target=guarded, args=(i,)) for i in range(first, first + count)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise SystemExit(f"{len(failed)} client(s) failed: {failed[0]!r}")


# ------------------------------------------------------------ loopback floor
def _recv_exact(sock: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def loop_server(port: int, clients: int, numel: int, rounds: int, out: Path) -> None:
    nbytes = 4 * numel
    model = np.zeros(numel, np.float32).tobytes()
    with socket.create_server(("127.0.0.1", port)) as listener:
        conns = [listener.accept()[0] for _ in range(clients)]
    start, end = threading.Barrier(clients + 1), threading.Barrier(clients + 1)

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = memoryview(bytearray(nbytes))
        for _ in range(rounds):
            start.wait()
            conn.sendall(model)
            _recv_exact(conn, buf)
            end.wait()
        conn.close()

    threads = [threading.Thread(target=serve, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    completed = []
    for _ in range(rounds):
        start.wait()
        end.wait()
        completed.append(time.time())
    for t in threads:
        t.join()
    out.write_text(json.dumps({"completed_at": completed}))


def loop_clients(port: int, first: int, count: int, numel: int, rounds: int) -> None:
    def run(i: int) -> None:
        reply = np.full(numel, 1e-3 * (i + 1), np.float32).tobytes()
        buf = memoryview(bytearray(4 * numel))
        for _ in range(600):  # the server may still be starting
            try:
                sock = socket.create_connection(("127.0.0.1", port))
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        else:
            raise ConnectionError(f"no loopback server on port {port}")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with sock:
            for _ in range(rounds):
                _recv_exact(sock, buf)
                sock.sendall(reply)

    _in_threads(run, first, count)


# ------------------------------------------------------------ gRPC floor
def _identity(b: bytes) -> bytes:
    return b


def _grpc_options(max_message: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message),
        ("grpc.max_receive_message_length", max_message),
    ]


def _pieces(data: bytes, chunk: int) -> list[bytes]:
    return [data[i : i + chunk] for i in range(0, len(data), chunk)]


def grpc_server(
    port: int, clients: int, numel: int, rounds: int, out: Path, chunk: int
) -> None:
    """Round ``r`` opens when round ``r - 1``'s last upload is in: a download
    asking for round ``r`` (its request is the round number) waits until then."""
    import asyncio

    import grpc

    model = _pieces(np.zeros(numel, np.float32).tobytes(), chunk)
    completed: list[float] = []

    async def serve() -> None:
        opened = [asyncio.Event() for _ in range(rounds + 1)]
        opened[0].set()
        ups = [0] * rounds

        async def down(request: bytes, context: Any) -> Any:
            r = int(request)
            await opened[r].wait()
            for m in model:
                yield m

        async def up(it: Any, context: Any) -> bytes:
            got = 0
            async for m in it:
                got += len(m)
            if got != 4 * numel:
                raise ValueError(f"upload of {got} bytes, {4 * numel} expected")
            r = len(completed)
            ups[r] += 1
            if ups[r] == clients:
                completed.append(time.time())
                opened[r + 1].set()
            return b""

        server = grpc.aio.server(options=_grpc_options(2 * chunk))
        handlers = {
            "Down": grpc.unary_stream_rpc_method_handler(down, _identity, _identity),
            "Up": grpc.stream_unary_rpc_method_handler(up, _identity, _identity),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("floor", handlers),)
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await opened[rounds].wait()
        await server.stop(5)

    asyncio.run(serve())
    out.write_text(json.dumps({"completed_at": completed}))


def grpc_clients(
    port: int, first: int, count: int, numel: int, rounds: int, chunk: int
) -> None:
    import grpc

    def run(i: int) -> None:
        reply = np.full(numel, 1e-3 * (i + 1), np.float32).tobytes()
        buf = bytearray(4 * numel)
        with grpc.insecure_channel(
            f"127.0.0.1:{port}", options=_grpc_options(2 * chunk)
        ) as ch:
            grpc.channel_ready_future(ch).result(timeout=60)
            down = ch.unary_stream("/floor/Down", _identity, _identity)
            up = ch.stream_unary("/floor/Up", _identity, _identity)
            for r in range(rounds):
                at = 0
                for m in down(str(r).encode()):
                    buf[at : at + len(m)] = m
                    at += len(m)
                view = memoryview(reply)
                up(bytes(view[j : j + chunk]) for j in range(0, len(view), chunk))

    _in_threads(run, first, count)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "role",
        choices=[
            "flower-server",
            "flower-clients",
            "loop-server",
            "loop-clients",
            "grpc-server",
            "grpc-clients",
        ],
    )
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--numel", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--chunk", type=int, default=1 << 20, help="gRPC floor: bytes per message"
    )
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    address = f"127.0.0.1:{a.port}"
    if a.role == "flower-server":
        flower_server(address, a.clients, a.numel, a.rounds, a.out)
    elif a.role == "flower-clients":
        flower_clients(address, a.first, a.count)
    elif a.role == "loop-server":
        loop_server(a.port, a.clients, a.numel, a.rounds, a.out)
    elif a.role == "loop-clients":
        loop_clients(a.port, a.first, a.count, a.numel, a.rounds)
    elif a.role == "grpc-server":
        grpc_server(a.port, a.clients, a.numel, a.rounds, a.out, a.chunk)
    else:
        grpc_clients(a.port, a.first, a.count, a.numel, a.rounds, a.chunk)
    return 0


if __name__ == "__main__":
    sys.exit(main())
