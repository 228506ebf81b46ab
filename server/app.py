"""Serve a run: a ``grpc.aio`` server (+ health) around a coordinator.

The event loop runs the server; the round driver and the recorder run in threads
of their own, so aggregation and store writes never block a client's call.

This module is the composition root: it opens the store and builds the recorder
on it (:class:`~fedplat.server.recorder.Recorder`, with its read port); every
other part of the coordinator writes and reads through those, never the store.
``serve`` returns the process's exit status: 0 when the run completed (or was
stopped cleanly to be resumed), 1 when it failed, 2 for configuration errors
(raised as :class:`~fedplat.server.config.ConfigError`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from fedplat.server.checkpoint import CheckpointError, check_writable
from fedplat.server.config import ConfigError, RunConfig
from fedplat.server.coordinator import Coordinator
from fedplat.server.recorder import Recorder
from fedplat.server.servicer import SERVICE, CoordinatorServicer
from fedplat.server.wire import (
    check_fd_headroom,
    control_options,
    grpc_options,
    health_handler,
)
from grpc_health.v1 import health, health_pb2

from fedplat.security.certs import CertError, check_key_pair, load_certificates
from fedplat.store import Store, StoreError

if TYPE_CHECKING:
    from fedplat.control.service import ControlServicer

log = logging.getLogger("fedplat.server")

#: How long an operator's stop waits for the round driver's current step.
OPERATOR_STOP_SECONDS = 600


def _read_pem(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"server.tls.{what} {path}: {exc.strerror}") from None


def _credentials(cfg: RunConfig) -> grpc.ServerCredentials | None:
    """The server's TLS credentials, every file checked first: gRPC itself
    reports a bad certificate or key only as a failure to listen."""
    s = cfg.server
    if s.insecure:
        return None
    if s.tls is None:
        # Whatever sections the run file has: plaintext is never a default.
        raise ConfigError(
            "server: set tls.cert/tls.key, or insecure: true to serve plaintext gRPC"
        )
    cert = _read_pem(s.tls.cert, "cert")
    key = _read_pem(s.tls.key, "key")
    ca = _read_pem(s.tls.client_ca, "client_ca") if s.tls.client_ca else None
    try:
        load_certificates(cert)
    except CertError as exc:
        raise ConfigError(f"server.tls.cert {s.tls.cert}: {exc}") from None
    try:
        check_key_pair(cert, key)
    except CertError as exc:
        raise ConfigError(f"server.tls.key {s.tls.key}: {exc}") from None
    if ca is not None:
        try:
            load_certificates(ca)
        except CertError as exc:
            raise ConfigError(
                f"server.tls.client_ca {s.tls.client_ca}: {exc}"
            ) from None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def _control_credentials(cfg: RunConfig) -> grpc.ServerCredentials | None:
    """The control API's mutual TLS: the server's certificate, and client
    certificates from ``control.operator_ca`` required."""
    if cfg.control is None:
        return None
    tls = cfg.server.tls
    if tls is None:  # the config refuses this; kept for a model built by hand
        raise ConfigError("control needs server.tls")
    path = cfg.control.operator_ca
    try:
        ca = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"control.operator_ca {path}: {exc.strerror}") from None
    try:
        load_certificates(ca)
    except CertError as exc:
        raise ConfigError(f"control.operator_ca {path}: {exc}") from None
    cert = _read_pem(tls.cert, "cert")
    key = _read_pem(tls.key, "key")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def check_listen(address: str) -> None:
    """ConfigError unless ``address`` (HOST:PORT) can be listened on now.

    Checked before the store is touched and before gRPC tries, whose own
    failure says only "Failed to bind" (and logs from C++)."""
    host, _, port = address.rpartition(":")  # the form is checked by the config
    host = host.strip("[]") or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        raise ConfigError(
            f"cannot listen on {address}: unknown host {host!r}"
        ) from None
    errors = []
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            # As gRPC does: a port in TIME_WAIT is free to serve on.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ConfigError(
                        f"cannot listen on {address}: the address is already in "
                        "use (another coordinator?)"
                    ) from None
                errors.append(exc.strerror or str(exc))
    if errors and len(errors) == len(infos):
        raise ConfigError(f"cannot listen on {address}: {errors[0]}")


def preflight(cfg: RunConfig) -> None:
    """What can be checked before a run is opened in the store: TLS files, the
    listening address, the open-file limit the connection cap needs, and the
    checkpoint folder (ConfigError, exit status 2)."""
    _credentials(cfg)
    _control_credentials(cfg)
    check_listen(cfg.server.address)
    if cfg.control is not None:
        check_listen(cfg.control.address)
    check_fd_headroom(cfg.server, cfg.control)
    try:
        check_writable(cfg.checkpoints.dir)
    except CheckpointError as exc:
        raise ConfigError(f"checkpoints.dir: {exc}") from None


class Server:
    """A coordinator served over gRPC: ``await start()``, ``run_until_done()``."""

    def __init__(self, cfg: RunConfig, store: Store | None = None) -> None:
        self.cfg = cfg
        self.store = store or Store(cfg.store.url)
        self.coord = Coordinator(cfg, Recorder(self.store))
        self.stop_event = threading.Event()
        self.stop_reason: str | None = None  # an operator's stop ends the run
        self._stop_lock = threading.Lock()
        self.crashed: BaseException | None = None
        self.port = 0
        self.control_port = 0
        self.control: grpc.aio.Server | None = None
        self.control_servicer: ControlServicer | None = None
        self._driver = threading.Thread(
            target=self._drive, name="fedplat-driver", daemon=True
        )

    def _drive(self) -> None:
        try:
            self.coord.driver.run(self.stop_event)
        except BaseException as exc:  # the run must be marked, whatever happened
            self.crashed = exc
            if isinstance(exc, (CheckpointError, StoreError, OSError)):
                # The environment failed (disk, database), not the code: one
                # line says what, and the run is marked failed with it.
                reason = f"the round driver stopped: {exc}"
                log.error("%s", reason)
            else:
                reason = f"the round driver crashed: {type(exc).__name__}: {exc}"
                log.exception("round driver crashed")
            try:
                self.coord.driver.closer.give_up(reason)
            except Exception:
                log.exception("could not record the crash in the store")
            self.stop_event.set()

    async def start(self) -> None:
        s = self.cfg.server
        creds = _credentials(self.cfg)
        check_fd_headroom(s, self.cfg.control)
        self.server = grpc.aio.server(
            options=grpc_options(s), maximum_concurrent_rpcs=s.max_concurrent_rpcs
        )
        self.health = health.aio.HealthServicer()
        servicer = CoordinatorServicer(self.coord)
        self.server.add_generic_rpc_handlers(
            (servicer.handler(), health_handler(self.health, servicer.outsiders))
        )
        if creds is None:
            log.warning(
                "serving PLAINTEXT gRPC on %s (server.insecure: true): tokens, "
                "models and updates can be read and altered on the network",
                s.address,
            )
        try:
            self.port = (
                self.server.add_insecure_port(s.address)
                if creds is None
                else self.server.add_secure_port(s.address, creds)
            )
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {s.address}: {exc}") from None
        if self.port == 0:
            raise ConfigError(f"cannot listen on {s.address} (in use, or not local)")
        await self.server.start()
        await self._start_control()
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.coord.ctx.recorder.start()
        self._driver.start()
        log.info(
            "coordinator for run %r listening on port %d", self.cfg.run.name, self.port
        )

    def request_stop(self, reason: str) -> str | None:
        """End the run for good (an operator's StopRun): the driver stops at its
        next step and the run is marked failed with ``reason``. Returns ``None``,
        or the reason of the stop already asked for (this one is refused)."""
        with self._stop_lock:
            if self.stop_reason is not None:
                return self.stop_reason
            self.stop_reason = reason
        self.stop_event.set()
        return None

    async def _start_control(self) -> None:
        cfg = self.cfg.control
        creds = _control_credentials(self.cfg)
        if cfg is None or creds is None:
            return
        from fedplat.control.service import (
            MAX_STREAMS,
            ControlLimits,
            ControlServicer,
            ServedRun,
        )

        self.control = grpc.aio.server(
            options=control_options(cfg),
            # Above the slots the servicer counts (calls and log streams), so a
            # refusal says why.
            maximum_concurrent_rpcs=cfg.max_concurrent_rpcs + MAX_STREAMS + 8,
        )
        served = ServedRun(self.coord.run_record.id, self.request_stop)
        limits = ControlLimits(
            max_calls=cfg.max_concurrent_rpcs,
            per_operator=cfg.max_calls_per_operator,
            calls_per_second=cfg.calls_per_second,
            burst=cfg.calls_burst,
            receive_seconds=cfg.receive_seconds,
        )
        servicer = ControlServicer(self.store, served, limits)
        self.control_servicer = servicer
        self.control.add_generic_rpc_handlers((servicer.handler(),))
        try:
            self.control_port = self.control.add_secure_port(cfg.address, creds)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {cfg.address}: {exc}") from None
        if self.control_port == 0:
            raise ConfigError(f"cannot listen on {cfg.address} (in use, or not local)")
        await self.control.start()
        log.info("control API (operators, mutual TLS) on port %d", self.control_port)

    async def wait(self) -> None:
        while not self.stop_event.is_set() and self._driver.is_alive():
            await asyncio.sleep(0.2)

    async def stop(self, grace: float = 2.0) -> None:
        self.stop_event.set()
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        # An operator's stop waits for the driver's current step (a round's
        # close may take minutes), so the run is ended, not left resumable.
        wait = OPERATOR_STOP_SECONDS if self.stop_reason is not None else 10
        await asyncio.to_thread(self._driver.join, wait)
        if self.stop_reason is not None:
            if self._driver.is_alive():
                log.error(
                    "the round driver did not stop within %d s; ending the run "
                    "as the operator asked anyway",
                    wait,
                )
            run = self.coord.run_record
            if run.status not in ("completed", "failed"):
                log.warning("run %s: %s", run.name, self.stop_reason)
                self.coord.driver.closer.give_up(self.stop_reason)
        if self.control is not None:
            if self.control_servicer is not None:
                # Log followers read what is buffered before they end.
                try:
                    await asyncio.to_thread(self.coord.ctx.recorder.flush)
                except StoreError:
                    log.exception("recorder: could not flush before the control stop")
                self.control_servicer.close_streams()
            await self.control.stop(max(grace, 2.0))
        await self.server.stop(grace)
        self.coord.ctx.recorder.stop()
        self.store.close()


class BackgroundServer:
    """A coordinator served from a thread of its own (its own event loop), for
    programs and tests that keep their own main loop::

        srv = BackgroundServer(cfg).start()   # returns once it listens
        ...
        srv.stop()
    """

    def __init__(self, cfg: RunConfig, store: Store | None = None) -> None:
        self.server = Server(cfg, store)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fedplat-server-loop", daemon=True
        )

    @property
    def coord(self) -> Coordinator:
        return self.server.coord

    @property
    def port(self) -> int:
        return self.server.port

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(
            timeout
        )
        return self

    def stop(self, grace: float = 0.0) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop)
        fut.result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def _serve(
    cfg: RunConfig, linger_seconds: float, setup: Callable[[Server], object] | None
) -> int:
    preflight(cfg)
    srv = Server(cfg)
    if setup is not None:  # e.g. fedplat.server.upstream.attach_upstream
        setup(srv)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, srv.stop_event.set)
    await srv.start()
    await srv.wait()
    finished = srv.coord.finished and srv.crashed is None
    if finished and not srv.stop_event.is_set():
        # Let polling clients hear FINISHED before the socket closes.
        await asyncio.sleep(linger_seconds)
    run = srv.coord.run_record
    await srv.stop()
    if srv.crashed is not None:
        return 1
    log.info("run %s: %s after %d rounds", cfg.run.name, run.status, run.current_round)
    if srv.stop_reason is not None and srv.coord.run_record.reason == srv.stop_reason:
        return 0  # ended as an operator asked
    return 1 if run.status == "failed" else 0


def serve(
    cfg: RunConfig,
    *,
    linger_seconds: float = 3.0,
    setup: Callable[[Server], object] | None = None,
) -> int:
    """Run the coordinator until the run ends or SIGINT/SIGTERM; exit status.
    ``setup(server)`` runs before the server starts."""
    return asyncio.run(_serve(cfg, linger_seconds, setup))


__all__ = ["BackgroundServer", "Server", "check_listen", "preflight", "serve"]
