"""The coordinator of one run: its parts wired together, and the client API.

Parts with one job each (docs/architecture.md):

- :class:`~fedplat.server.registry.ClientRegistry`: admission, identities,
  sessions, liveness;
- :class:`~fedplat.server.board.TaskBoard`: the open round's tasks, waiting;
- :class:`~fedplat.server.driver.RoundDriver`: the only loop (select, deadline,
  quorum, close);
- :class:`~fedplat.server.intake.Intake`: one upload, checked and decoded into
  its row;
- :mod:`~fedplat.server.aggregation`: the pure aggregation step;
- :class:`~fedplat.server.recorder.Recorder`: every store write (and, through
  :attr:`~fedplat.server.recorder.Recorder.reads`, the parts' store reads).

The coordinator is given the recorder, built on the store by whoever opened it
(the composition root, :mod:`fedplat.server.app`; the simulator; a test), and
opens or resumes its run through it; no part of it holds the store.

:class:`Coordinator` exposes the client-facing calls transport-neutrally (the
in-memory transport calls them directly; the gRPC servicer uses the same parts,
streaming). Domain errors (:mod:`fedplat.protocol.errors`) carry the reason a
client sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from fedplat.server.board import TaskBoard
from fedplat.server.config import RunConfig
from fedplat.server.context import RunContext, build_context
from fedplat.server.driver import RoundDriver, RoundOutcome
from fedplat.server.evaluation import Evaluator
from fedplat.server.intake import Intake, Upload
from fedplat.server.recorder import Recorder
from fedplat.server.refusals import Rejection
from fedplat.server.registry import ClientRegistry, ClientState, PeerIdentity
from fedplat.server.round import Round
from fedplat.server.waiting import Poll, Wakeup, run_sync

from fedplat.proto import serde, streams
from fedplat.protocol.errors import (
    FedplatError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    StaleUpdate,
)
from fedplat.protocol.messages import (
    Challenge,
    Enrollment,
    EnrollRequest,
    ModelPayload,
    SecAggReply,
    SecAggReplyKind,
    SecAggRequest,
    Task,
    TaskKind,
    UpdateHeader,
    UploadAck,
    secagg_statement,
)
from fedplat.protocol.task import SecAggSpec
from fedplat.secagg import SecAggError
from fedplat.security.identity import SECAGG, verify

#: Client metric reports kept per client (one per task it took part in).
MAX_REPORTS_REMEMBERED = 10_000


def _wire(msg: Any) -> int:
    """Every byte of one protobuf message on the wire, gRPC framing included."""
    return int(msg.ByteSize()) + streams.GRPC_FRAME_BYTES


class Coordinator:
    """One run's coordinator (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        recorder: Recorder,
        *,
        evaluator: Evaluator | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.ctx: RunContext = build_context(
            cfg, recorder, evaluator=evaluator, clock=clock
        )
        rec = self.ctx.recorder
        self.registry = ClientRegistry(
            cfg,
            self.ctx.reads,
            rec,
            self.ctx.layout,
            clock=clock,
            on_enrol=self._enrolled,
        )
        self.board = TaskBoard()
        self.board.finished = self.ctx.state.finished
        self.intake = Intake(
            cfg,
            self.ctx.run_id,
            self.ctx.layout,
            self.ctx.plan,
            self.registry,
            self.board,
            rec.rejection,
            clock,
        )
        self.driver = RoundDriver(
            self.ctx, self.registry, self.board, self.intake, clock
        )
        rec.status = lambda: (self.driver.phase, len(self.registry.live()))
        self._reported: set[str] = set()
        if cfg.admission_mode == "open":
            rec.event(
                "admission_open",
                "admission is OPEN: anyone who reaches the port can enrol "
                f"(capped at {cfg.admission.max_clients} clients)",
                level="warning",
            )

    # ---------------------------------------------------------------- state
    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    @property
    def layout(self):  # type: ignore[no-untyped-def]
        return self.ctx.layout

    @property
    def finished(self) -> bool:
        return self.board.finished

    @property
    def completed_rounds(self) -> int:
        return self.ctx.state.model_version

    @property
    def model_version(self) -> int:
        return self.ctx.state.model_version

    @property
    def weights(self) -> torch.Tensor:
        """The current global model ``[d]``."""
        return self.ctx.state.weights

    @property
    def run_record(self):  # type: ignore[no-untyped-def]
        return self.ctx.reads.get_run(self.run_id) or self.ctx.state.record

    def _enrolled(self, c: ClientState) -> None:
        self.ctx.recorder.event(
            "client_enrolled", f"client {c.name!r} enrolled", client_id=c.client_id
        )
        self.board.signal.notify()  # the driver may be waiting for live clients

    def reject(self, kind: str, reason: str, client_id: str | None = None) -> None:
        """A refusal seen by a transport (bad stream framing, parse errors)."""
        self.ctx.recorder.rejection(Rejection(kind, reason, client_id))

    # ---------------------------------------------------------------- enrolment
    def challenge(self, client_id: str = "") -> Challenge:
        return self.registry.challenge(client_id)

    def enroll(
        self, req: EnrollRequest, peer: PeerIdentity | None = None
    ) -> Enrollment:
        return self.registry.enroll(req, peer or PeerIdentity())

    def authenticate(self, client_id: str, token: str) -> ClientState:
        return self.registry.authenticate(client_id, token)

    # ---------------------------------------------------------------- tasks
    def task_for(self, c: ClientState) -> Task | None:
        """The caller's task now (TRAIN or FINISHED), or None to wait."""
        if self.board.finished:
            return Task(kind=TaskKind.FINISHED, run_id=self.run_id)
        found = self.board.assignment(c.client_id)
        if found is None:
            return None
        r, a = found
        secagg = None
        if r.secagg is not None:
            secagg = SecAggSpec(
                r.secagg.config.as_dict(), c.seq, self.ctx.plan.adaptive
            )
        return Task(
            kind=TaskKind.TRAIN,
            run_id=self.run_id,
            round=r.number,
            task_id=a.task_id,
            model_version=r.model_version,
            deadline_unix=r.deadline,
            config=self.ctx.plan.task_config(a.seed, secagg),
            nonce=a.nonce,
        )

    def wait_task(self) -> Task:
        return Task(kind=TaskKind.WAIT, run_id=self.run_id)

    def get_task(self, client_id: str, token: str, wait_seconds: float = 0.0) -> Task:
        c = self.authenticate(client_id, token)
        return run_sync(self.task_poll(c, wait_seconds))

    def task_poll(self, c: ClientState, wait_seconds: float) -> Poll[Task]:
        """The caller's long poll for a task (the one loop; the gRPC servicer
        drives it as a coroutine, the in-memory transport from a thread):
        TRAIN or FINISHED as soon as there is one, WAIT after ``wait_seconds``
        (at most ``server.long_poll_seconds``). Only a round that selects the
        caller, or the run's end, wakes it."""
        wait = wait_seconds if wait_seconds == wait_seconds else 0.0
        wait = max(0.0, min(wait, self.cfg.server.long_poll_seconds))
        waiters = self.board.waiters
        end = time.monotonic() + wait
        while True:
            woken = waiters.register(c.client_id)
            task = self.task_for(c)
            left = end - time.monotonic()
            if task is not None or left <= 0:
                waiters.discard(c.client_id, woken)
                return task if task is not None else self.wait_task()
            try:
                yield woken, min(left, 5.0)
            finally:
                waiters.discard(c.client_id, woken)
            self.registry.touch(c)

    # ---------------------------------------------------------------- download
    def begin_download(
        self, c: ClientState, task_id: str
    ) -> tuple[ModelPayload, Callable[[int], None]]:
        """The model for the caller's open task, and a callback recording how
        many bytes the transport sent."""
        found = self.board.assignment(c.client_id)
        if found is None or found[1].task_id != task_id:
            owner = self.board.task_round(c.client_id, task_id)
            if owner is None and found is None:
                self.reject(
                    "foreign_download",
                    "download for a task that is not the caller's open task",
                    c.client_id,
                )
            raise StaleUpdate(f"task {task_id!r} is not an open task of this client")
        r, a = found
        payload = self.ctx.model.current()
        r.downloaded(a.client_id, self.clock())

        def sent(nbytes: int) -> None:
            r.count(a.client_id, down=nbytes)

        return payload, sent

    def download_model(self, client_id: str, token: str, task_id: str) -> ModelPayload:
        c = self.authenticate(client_id, token)
        with self.registry.slot(c, "download"):
            payload, sent = self.begin_download(c, task_id)
            sent(streams.model_wire_bytes(payload, self.cfg.server.chunk_bytes))
            return payload

    # ---------------------------------------------------------------- upload
    def begin_upload(self, c: ClientState, header: UpdateHeader) -> Upload:
        return self.intake.begin(c, header)

    def upload_update(
        self, client_id: str, token: str, header: UpdateHeader, data: bytes
    ) -> UploadAck:
        """A whole upload at once (in-memory transport)."""
        c = self.authenticate(client_id, token)
        chunk = self.cfg.server.chunk_bytes
        with self.registry.slot(c, "upload"):
            if len(data) != header.total_bytes:
                raise StaleUpdate("declared size differs from the data")
            up = self.begin_upload(c, header)
            up.wire_bytes = streams.update_wire_bytes(header, len(data), chunk)
            try:
                up.start()
                view = memoryview(data)
                for start in range(0, len(view), chunk):
                    up.write(view[start : start + chunk])
                return up.finish()
            except FedplatError as exc:
                up.fail(exc)
                raise

    # ---------------------------------------------------------------- secagg
    def secagg_step(self, c: ClientState, req: SecAggRequest) -> SecAggReply:
        """One secure-aggregation call (see :mod:`fedplat.server.secagg_round`):
        the caller's signed message of the current phase, if any, then its
        reply (WAIT while the phase is open)."""
        with self.board.lock:
            r = self.board.round
            a = r.by_task.get(req.task_id) if r is not None else None
        if r is None or a is None or r.number != req.round:
            raise StaleUpdate(f"task {req.task_id!r} is not an open task")
        if a.client_id != c.client_id:
            self.reject(
                "foreign_task", "secagg call for another client's task", c.client_id
            )
            raise PermissionDenied("this task belongs to another client")
        sa = r.secagg
        if sa is None:
            raise InvalidArgument("this round does not use secure aggregation")
        if req.message:
            if len(req.message) > sa.max_message_bytes:
                raise ResourceExhausted("secure-aggregation message too large")
            fields = secagg_statement(
                self.run_id, r.number, a.task_id, a.nonce, req.message
            )
            if not verify(c.public_key, req.signature, SECAGG, *fields):
                self.reject(
                    "bad_signature",
                    "secure-aggregation message signature does not verify",
                    c.client_id,
                )
                raise PermissionDenied(
                    "secure-aggregation message signature does not verify with "
                    "the client's key"
                )
            with self.board.lock:
                if self.board.round is not r:
                    raise StaleUpdate(f"round {r.number} closed")
                r.count(a.client_id, up=_wire(serde.secagg_request_to_proto(req)))
                try:
                    sa.receive(a.client_id, req.message)
                except SecAggError as exc:
                    self.reject("secagg_refused", str(exc), c.client_id)
            self.board.signal.notify()
        elif req.signature:
            raise InvalidArgument("a poll carries no signature")
        with self.board.lock:
            reply = sa.reply(a.client_id)
            if reply.kind is SecAggReplyKind.DONE:
                r.mark_answered(a.client_id)  # no task left: GetTask waits
            up = 0 if req.message else _wire(serde.secagg_request_to_proto(req))
            r.count(a.client_id, up=up, down=_wire(serde.secagg_reply_to_proto(reply)))
        return reply

    def secagg(self, client_id: str, token: str, req: SecAggRequest) -> SecAggReply:
        """:meth:`secagg_step`, holding a WAIT for up to ``req.wait_seconds``."""
        c = self.authenticate(client_id, token)
        return run_sync(self.secagg_poll(c, req))

    def secagg_poll(
        self,
        c: ClientState,
        req: SecAggRequest,
        first: tuple[Wakeup, SecAggReply] | None = None,
    ) -> Poll[SecAggReply]:
        """The secure-aggregation long poll (the one loop, as :meth:`task_poll`):
        ``req``'s step, then message-less steps while the phase is open, up to
        ``req.wait_seconds``. ``first``: the wakeup taken before the caller made
        ``req``'s step itself (off the event loop), and that step's reply."""
        wait = max(0.0, min(req.wait_seconds, self.cfg.server.long_poll_seconds))
        end = time.monotonic() + wait
        woken, reply = first if first is not None else (None, None)
        while True:
            if reply is None or woken is None:
                woken = self.board.signal.wakeup()
                reply = self.secagg_step(c, req)
            left = end - time.monotonic()
            if reply.kind is not SecAggReplyKind.WAIT or left <= 0:
                return reply
            yield woken, min(left, 5.0)
            req, reply = replace(req, message=b"", signature=b""), None

    # ---------------------------------------------------------------- metrics
    def report_metrics(
        self,
        client_id: str,
        token: str,
        task_id: str,
        round_number: int,
        metrics: dict[str, float],
    ) -> None:
        self.record_metrics(
            self.authenticate(client_id, token), task_id, round_number, metrics
        )

    def record_metrics(
        self, c: ClientState, task_id: str, round_number: int, metrics: dict[str, float]
    ) -> None:
        """The client's own metrics of a task it took part in, once per task;
        written by the recorder in its next batch (no call waits on the store)."""
        number = self.board.task_round(c.client_id, task_id)
        if number is None or number != round_number:
            self.reject(
                "metrics_refused",
                "metrics for a round the client did not take part in",
                c.client_id,
            )
            raise PermissionDenied(
                "metrics may only be reported for a round the "
                "client took part in (its own task)"
            )
        if task_id in self._reported:
            raise StaleUpdate("metrics for this task were already reported")
        if len(self._reported) >= MAX_REPORTS_REMEMBERED:
            self._reported.clear()
        self._reported.add(task_id)
        if metrics:
            self.ctx.recorder.metrics(
                {f"client.{k}": v for k, v in metrics.items()},
                round_number=number,
                client_id=c.client_id,
            )

    # ---------------------------------------------------------------- rounds
    def open_round(self) -> int | None:
        return self.driver.open_round()

    def close_round(self) -> RoundOutcome:
        return self.driver.close_round()

    @property
    def current_round(self) -> Round | None:
        return self.board.round

    def live_clients(self) -> list[str]:
        return [c.client_id for c in self.registry.live()]


__all__ = ["Coordinator", "RoundOutcome"]
