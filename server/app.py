"""Serve a run: a gRPC server (+ health service) around a round engine."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType

import grpc
from fedplat.server.config import RunConfig
from fedplat.server.engine import RoundEngine
from fedplat.server.servicer import CoordinatorServicer
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedplat.proto import fedplat_pb2_grpc as pb_grpc
from fedplat.store import Store

log = logging.getLogger("fedplat.server")
SERVICE_NAME = "fedplat.v1.Coordinator"


class Coordinator:
    """A running coordinator: ``start()``, ``wait()``, ``stop()``."""

    def __init__(self, cfg: RunConfig, store: Store | None = None) -> None:
        self.cfg = cfg
        self.store = store or Store(cfg.store.url)
        self.engine = RoundEngine(cfg, self.store)
        self.stop_event = threading.Event()
        s = cfg.server
        self.server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=s.max_workers, thread_name_prefix="fedplat-rpc"
            ),
            options=[
                ("grpc.max_send_message_length", s.max_message_bytes),
                ("grpc.max_receive_message_length", s.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=s.max_workers * 4,
        )
        pb_grpc.add_CoordinatorServicer_to_server(
            CoordinatorServicer(self.engine), self.server
        )
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if s.insecure:
            self.port = self.server.add_insecure_port(s.address)
        else:
            assert s.tls is not None  # guaranteed by config validation
            key = Path(s.tls.key).read_bytes()
            cert = Path(s.tls.cert).read_bytes()
            ca = Path(s.tls.client_ca).read_bytes() if s.tls.client_ca else None
            creds = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
            )
            self.port = self.server.add_secure_port(s.address, creds)
        if self.port == 0:
            raise OSError(f"cannot bind {s.address}")
        self._driver = threading.Thread(
            target=self._drive, name="fedplat-driver", daemon=True
        )

    def _drive(self) -> None:
        try:
            self.engine.run(self.stop_event)
        except Exception:
            log.exception("round driver crashed")
            self.store.add_event(
                self.engine.run_id,
                "coordinator_error",
                "round driver crashed; see the coordinator log",
                level="error",
            )
            self.stop_event.set()

    def start(self) -> None:
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._driver.start()
        log.info(
            "coordinator for run %r listening on port %d", self.cfg.run.name, self.port
        )

    def wait(self) -> None:
        """Block until the run finishes (or stop); keep serving FINISHED briefly."""
        while not self.stop_event.is_set() and self._driver.is_alive():
            self._driver.join(timeout=0.5)

    def stop(self, grace: float = 2.0) -> None:
        self.stop_event.set()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._driver.join(timeout=10)
        self.server.stop(grace).wait()
        self.store.close()


def serve(cfg: RunConfig, *, linger_seconds: float = 3.0) -> int:
    """Run the coordinator until the run completes or SIGINT/SIGTERM; exit code."""
    coord = Coordinator(cfg)

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        coord.stop_event.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    coord.start()
    coord.wait()
    finished = coord.engine.finished
    if finished and not coord.stop_event.is_set():
        # Let polling clients hear FINISHED before the socket closes.
        coord.stop_event.wait(linger_seconds)
    status = coord.engine.run_record.status
    coord.stop()
    return 0 if status == "completed" or not finished else 1
