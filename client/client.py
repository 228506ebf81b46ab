"""The client SDK an edge app embeds.

::

    client = Client("coord.example:50051", model, train_fn, num_examples=len(data),
                    root_certificates=ca_pem)
    client.run()             # blocking; or client.start() ... client.stop()

``train_fn(model, config)`` trains ``model`` in place on local data; ``config`` is the
round's training settings from the coordinator (epochs, batch_size, lr, ...). It
returns a :class:`FitResult` (or just the number of examples used). The SDK downloads
the global model, calls ``train_fn``, sends ``new - global`` through the middleware
chain, and survives coordinator restarts and network loss with exponential backoff.

Identity: the client keeps an Ed25519 key (``state_dir/identity.key``, created on
first start), registers its public half at enrolment and signs every update with
it; the coordinator admits it with an ``enrolment_token`` (or its TLS client
certificate). Errors no retry can fix (a refused enrolment or model, a TLS
certificate that does not verify) stop the client with one clear message.

Memory: during a round the client holds the model and one model-sized vector
(the global model, overwritten in place by the update that is sent from it), plus
what gRPC buffers: a fixed receive window per stream (``stream_window_bytes``,
4 MiB; ``None`` for gRPC's auto-tuned window, which can grow to hold much more
of a large model). A fixed window caps one download's speed at the window per
round trip (4 MiB per 100 ms is about 40 MB/s): raise it on long, fast links.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from fedplat.client.backoff import Backoff
from fedplat.client.middleware import ByteCounter, Middleware, chain
from fedplat.client.secagg import SecAggParticipant, secagg_vector
from fedplat.client.uplink import UplinkLayer

from fedplat.protocol.body import EncodedBody, dense_body
from fedplat.protocol.errors import (
    DuplicateUpdate,
    FedplatError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    StaleUpdate,
    TlsError,
    Unauthenticated,
    Unavailable,
    UnknownClient,
)
from fedplat.protocol.messages import (
    PAYLOAD_V1,
    EnrollRequest,
    OutgoingUpdate,
    Task,
    TaskKind,
    UpdateHeader,
    UploadAck,
    update_statement,
)
from fedplat.security.identity import ENROL, UPDATE, Identity
from fedplat.transport.base import DEFAULT_STREAM_WINDOW, Connection
from fedplat.vectors import (
    Layout,
    all_finite,
    delta_into,
    layout_of,
    load_vector,
)

log = logging.getLogger("fedplat.client")


@dataclass(frozen=True)
class FitResult:
    """What ``train_fn`` reports: examples used and any scalar metrics."""

    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)


TrainFn = Callable[[torch.nn.Module, Mapping[str, Any]], "FitResult | int | Any"]
EvalFn = Callable[[torch.nn.Module], Mapping[str, float]]


def _as_fit_result(out: Any, default_examples: int) -> FitResult:
    if isinstance(out, FitResult):
        return out
    if isinstance(out, int):
        return FitResult(out)
    if out is None:
        return FitResult(default_examples)
    n = getattr(out, "num_examples", None)
    if isinstance(n, int):
        metrics = {}
        loss = getattr(out, "mean_loss", None)
        if isinstance(loss, float):
            metrics["train_loss"] = loss
        return FitResult(n, metrics)
    raise TypeError(
        "train_fn must return FitResult, an int, or an object with "
        f"num_examples; got {type(out).__name__}"
    )


def _grpc_factory(address: str, opts: Any) -> Callable[[], Connection]:
    """New gRPC connections to ``address`` (``opts``: ``ChannelOptions``)."""
    from fedplat.transport.grpc import GrpcConnection

    def factory() -> Connection:
        return GrpcConnection(address, opts)

    return factory


class Client:
    """A federated client (see module docstring)."""

    def __init__(
        self,
        address: str | None,
        model: torch.nn.Module,
        train_fn: TrainFn,
        eval_fn: EvalFn | None = None,
        *,
        num_examples: int = 0,
        name: str | None = None,
        enrolment_token: str | None = None,
        insecure: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        connection_factory: Callable[[], Connection] | None = None,
        middleware: Sequence[Middleware] = (),
        state_dir: str | os.PathLike[str] | None = None,
        identity: Identity | None = None,
        backoff: Backoff | None = None,
        poll_seconds: float = 10.0,
        give_up_after: float | None = None,
        info: Mapping[str, str] | None = None,
        stream_window_bytes: int | None = DEFAULT_STREAM_WINDOW,
    ) -> None:
        if connection_factory is None:
            if address is None:
                raise ValueError("give an address or a connection_factory")
            from fedplat.transport.grpc import ChannelOptions

            connection_factory = _grpc_factory(
                address,
                ChannelOptions(
                    insecure=insecure,
                    root_certificates=root_certificates,
                    private_key=private_key,
                    certificate_chain=certificate_chain,
                    stream_window_bytes=stream_window_bytes,
                ),
            )
        self.model = model
        self.layout: Layout = layout_of(model)
        self.train_fn = train_fn
        self.eval_fn = eval_fn
        self.num_examples = num_examples
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.enrolment_token = enrolment_token or ""
        self._factory = connection_factory
        self.counter = ByteCounter()
        self.state_dir = Path(state_dir) if state_dir is not None else None
        if identity is None:
            identity = (
                Identity.load_or_create(self.state_dir / "identity.key")
                if self.state_dir is not None
                else Identity.generate()
            )
        self.identity = identity
        # Innermost: compression and privacy as the coordinator's task asks.
        self.uplink = UplinkLayer(self.layout, self.state_dir)
        self._send = chain(
            [self.counter, *middleware, self.uplink], self._terminal_send
        )
        self.backoff = backoff or Backoff()
        self.poll_seconds = poll_seconds
        self.give_up_after = give_up_after
        self.info = dict(info or {})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Connection | None = None
        self.client_id = self._load_client_id()
        self.run_id = ""
        self.enrolled = False
        self.rounds_done = 0
        self.finished = False
        self._global: torch.Tensor | None = None
        self._pending: tuple[str, UpdateHeader, EncodedBody] | None = None
        self._secagg: SecAggParticipant | None = None
        self._wait = poll_seconds
        self.last_error: str | None = None

    # --------------------------------------------------------------- persistence
    def _state_file(self) -> Path | None:
        return self.state_dir / "client.json" if self.state_dir is not None else None

    def _load_client_id(self) -> str:
        f = self._state_file()
        if f is None or not f.is_file():
            return ""
        try:
            data = json.loads(f.read_text())
            return str(data.get("client_id", "")) if isinstance(data, dict) else ""
        except (OSError, json.JSONDecodeError):
            log.warning("ignoring unreadable client state %s", f)
            return ""

    def _save_client_id(self) -> None:
        f = self._state_file()
        if f is None:
            return
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps({"client_id": self.client_id, "name": self.name}))
        os.replace(tmp, f)

    # --------------------------------------------------------------- connection
    @property
    def conn(self) -> Connection:
        if self._conn is None:
            self._conn = self._factory()
        return self._conn

    def _reset_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # closing a broken channel must not mask the real error
                log.debug("error closing connection", exc_info=True)
        self._conn = None
        self.enrolled = False

    def enroll(self) -> None:
        """Prove the identity key on a fresh challenge and start a session."""
        try:
            e = self._enroll_as(self.client_id)
        except UnknownClient:
            if not self.client_id:
                raise
            # The coordinator does not know our id (a new run or store): enrol
            # as a new client (this needs an admission credential again).
            log.info(
                "client %s: %s unknown to the coordinator; enrolling anew",
                self.name,
                self.client_id,
            )
            e = self._enroll_as("")
        self.client_id = e.client_id
        self.run_id = e.run_id
        self.enrolled = True
        self._save_client_id()
        log.info(
            "client %s enrolled in run %s as %s", self.name, e.run_name, e.client_id
        )

    def _enroll_as(self, client_id: str):  # type: ignore[no-untyped-def]
        ch = self.conn.challenge(client_id)
        key = self.identity.public_key
        return self.conn.enroll(
            EnrollRequest(
                name=self.name,
                num_examples=self.num_examples,
                layout=self.layout,
                client_id=client_id,
                info=self.info,
                public_key=key,
                challenge=ch.challenge,
                signature=self.identity.sign(ENROL, ch.challenge, client_id, key),
                enrolment_token="" if client_id else self.enrolment_token,
            )
        )

    # --------------------------------------------------------------- work
    def _terminal_send(self, upd: OutgoingUpdate) -> UploadAck:
        body = upd.body if upd.body is not None else dense_body(upd.vector)
        header = UpdateHeader(
            task_id=upd.task.task_id,
            round=upd.task.round,
            num_examples=upd.num_examples,
            layout=self.layout,
            total_bytes=body.nbytes,
            sha256=body.sha256,
            encoding=PAYLOAD_V1,
            metrics=dict(upd.metrics),
        )
        statement = update_statement(self.run_id, header, upd.task.nonce)
        header = replace(header, signature=self.identity.sign(UPDATE, *statement))
        self._pending = (upd.task.task_id, header, body)
        ack = self.conn.upload_update(header, body)
        self._pending = None
        return ack

    def _secagg_step(self) -> None:
        sa = self._secagg
        assert sa is not None
        if not sa.done and sa.advance(
            self.conn, self.identity, self.run_id, self._wait
        ):
            self.rounds_done += 1
            log.info("client %s: secure aggregation over: %s", self.name, sa.reason)

    def handle_task(self, task: Task) -> None:
        """Train on one TRAIN task and upload the update (or, under secure
        aggregation, take the next step of the protocol)."""
        if self._secagg is not None and self._secagg.task.task_id == task.task_id:
            self._secagg_step()
            return
        self._secagg = None
        if self._pending is not None and self._pending[0] == task.task_id:
            # The upload was interrupted (network loss): resend, don't retrain.
            _, header, body = self._pending
            self.conn.upload_update(header, body)
            self._pending = None
            self.rounds_done += 1
            return
        self._pending = None
        if self._global is None:
            self._global = torch.empty(self.layout.numel, dtype=torch.float32)
        info = self.conn.download_model(task.task_id, self._global)
        if info.layout != self.layout:
            raise InvalidArgument(
                "global model layout differs from the local model: "
                f"{self.layout.describe_mismatch(info.layout)}"
            )
        load_vector(self.model, self._global, self.layout)
        t0 = time.perf_counter()
        self.model.train()
        fit = _as_fit_result(
            self.train_fn(self.model, task.config.train_config()), self.num_examples
        )
        metrics = {**fit.metrics, "train_seconds": time.perf_counter() - t0}
        delta = delta_into(self.model, self._global, self.layout)
        if not all_finite(delta):
            raise InvalidArgument(
                "local training produced non-finite weights; not uploading"
            )
        if task.config.secagg is not None:
            vec = secagg_vector(task, delta, self.uplink)
            self._secagg = SecAggParticipant(task, vec)
            self._secagg_step()
            return
        ack = self._send(
            OutgoingUpdate(
                task=task, vector=delta, num_examples=fit.num_examples, metrics=metrics
            )
        )
        log.info(
            "client %s: round %d update sent (%d bytes): %s",
            self.name,
            task.round,
            ack.bytes_received,
            ack.message,
        )
        self.rounds_done += 1
        if self.eval_fn is not None:
            ev = {k: float(v) for k, v in self.eval_fn(self.model).items()}
            self.conn.report_metrics(task.task_id, task.round, ev)

    def step(self, wait_seconds: float | None = None) -> Task:
        """Enrol if needed, poll once, handle the task; returns the task seen."""
        if not self.enrolled:
            self.enroll()
        self._wait = self.poll_seconds if wait_seconds is None else wait_seconds
        task = self.conn.get_task(self._wait)
        if task.kind is TaskKind.FINISHED:
            self.finished = True
        elif task.kind is TaskKind.TRAIN:
            try:
                self.handle_task(task)
            except (StaleUpdate, DuplicateUpdate) as exc:
                log.warning("client %s: update not taken: %s", self.name, exc.reason)
            except InvalidArgument as exc:
                # The coordinator refused this update; the next round may go better.
                self.last_error = exc.reason
                log.error("client %s: update rejected: %s", self.name, exc.reason)
        return task

    def run(self) -> None:
        """Participate until the run finishes or :meth:`stop` is called.

        Raises the error that stopped it when no retry can help
        (:class:`PermissionDenied`, :class:`InvalidArgument` on enrolment,
        :class:`TlsError`), or :class:`ConnectionError` after ``give_up_after``.
        """
        attempt = 0
        failing_since: float | None = None
        while not self._stop.is_set():
            try:
                task = self.step()
                attempt, failing_since = 0, None
                if task.kind is TaskKind.FINISHED:
                    log.info(
                        "client %s: run finished after %d rounds",
                        self.name,
                        self.rounds_done,
                    )
                    return
                if task.kind is TaskKind.WAIT and task.retry_after > 0:
                    self._stop.wait(min(task.retry_after, 5.0))
            except (UnknownClient, Unauthenticated) as exc:
                # A coordinator restart or an expired session: enrol again.
                log.info("client %s: re-enrolling (%s)", self.name, exc.reason)
                self.enrolled = False
                self._stop.wait(self.backoff.delay(0))
            except (Unavailable, ResourceExhausted) as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if (
                    self.give_up_after is not None
                    and now - failing_since > self.give_up_after
                ):
                    raise ConnectionError(
                        f"coordinator unreachable for {now - failing_since:.0f}s: "
                        f"{exc.reason}"
                    ) from exc
                delay = self.backoff.delay(attempt)
                attempt += 1
                log.warning(
                    "client %s: %s; retry in %.1fs", self.name, exc.reason, delay
                )
                if isinstance(exc, Unavailable):
                    self._reset_connection()
                self._stop.wait(delay)
            except (InvalidArgument, PermissionDenied, TlsError) as exc:
                # Refused enrolment, wrong model, revoked, TLS: not retryable.
                self.last_error = exc.reason
                log.error("client %s: stopped: %s", self.name, exc.reason)
                raise
            except FedplatError as exc:
                log.warning("client %s: %s", self.name, exc)
                self._stop.wait(self.backoff.delay(attempt))
                attempt += 1
        self._reset_connection()

    def start(self) -> threading.Thread:
        """Run in a background thread (for apps that keep their own main loop)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("client already started")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run_safely, name=f"fedplat-{self.name}", daemon=True
        )
        self._thread.start()
        return self._thread

    def _run_safely(self) -> None:
        try:
            self.run()
        except Exception as exc:
            self.last_error = str(exc)
            log.error("client %s stopped with an error: %s", self.name, exc)

    def request_stop(self) -> None:
        """Ask :meth:`run` to return after the current step (safe in a signal
        handler: it only sets a flag)."""
        self._stop.set()

    def stop(self, timeout: float | None = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._reset_connection()
