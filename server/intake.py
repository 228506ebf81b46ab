"""Intake: one upload, checked before its body is read, decoded into its row.

:meth:`Intake.begin` takes an authenticated client and the upload's header and
refuses, before a byte of the body is read: a task that is not this client's open
task (another client's, a closed round's, a replay), a second upload, a late one,
a wrong layout or encoding, more bytes than the run's payload can have, a zero
weight for a weighted rule, and a signature that does not verify with the
client's registered key over (run, round, task, the task's nonce, payload
SHA-256, examples, encoding). Refusals up to the signature check leave the task
open (a stolen session cannot burn a client's round); after it, the update is
the key holder's, and its failures are recorded as the client's.

:class:`Upload` then hashes each piece as it arrives and decodes it straight into
the client's row (:mod:`fedplat.protocol.codec`); :meth:`Upload.finish` checks the
digest, finiteness and magnitude, clips for central DP, caps the weight (the
token's, the run's and the round's cap, :mod:`fedplat.server.bounds`) and hands
the row and its norm to the round's accumulator, which bounds the norm.
Everything refused becomes a (rate-limited) event; nothing touches the store
until the round closes. No gRPC here: the same code serves the gRPC servicer
and the in-memory transport.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable

import torch
from fedplat.server.accumulator import Accepted
from fedplat.server.board import TaskBoard
from fedplat.server.config import RunConfig
from fedplat.server.refusals import Rejection
from fedplat.server.registry import ClientRegistry, ClientState
from fedplat.server.round import Assignment, Delivery, Round
from fedplat.server.uplink_plan import UplinkPlan

from fedplat.compression.wire import PayloadError
from fedplat.protocol.codec import PayloadSink, check_payload_size, max_payload_bytes
from fedplat.protocol.errors import (
    DuplicateUpdate,
    FedplatError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    StaleUpdate,
)
from fedplat.protocol.messages import (
    PAYLOAD_V1,
    UpdateHeader,
    UploadAck,
    update_statement,
)
from fedplat.protocol.outcomes import OutcomeStatus
from fedplat.security.identity import UPDATE, verify
from fedplat.vectors import Layout, all_finite, count_nonfinite


def checked_norm(vec: torch.Tensor) -> float:
    """The L2 norm of a finite ``[d]`` float32 update; InvalidArgument if it holds
    NaN or Inf. One BLAS pass (a dot product) serves both checks: a NaN or Inf
    makes it non-finite; only then (or on a float32 overflow of a huge but finite
    row) does the exact elementwise check run."""
    squared = float(torch.dot(vec, vec))
    if math.isfinite(squared):
        return math.sqrt(squared)
    if not all_finite(vec):
        raise InvalidArgument(
            f"update holds {count_nonfinite(vec)} non-finite values (NaN or Inf)"
        )
    return float(torch.linalg.vector_norm(vec, dtype=torch.float64))


class Intake:
    """Validates and decodes uploads of the open round (see module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_id: str,
        layout: Layout,
        plan: UplinkPlan,
        registry: ClientRegistry,
        board: TaskBoard,
        on_reject: Callable[[Rejection], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.layout = layout
        self.plan = plan
        self.registry = registry
        self.board = board
        self._reject = on_reject
        self.clock = clock
        self.max_bytes = min(
            cfg.server.max_update_bytes, max_payload_bytes(layout.numel)
        )

    # -------------------------------------------------------------- begin
    def _refuse(
        self,
        exc: FedplatError,
        kind: str,
        client: ClientState,
        round_number: int | None = None,
    ) -> FedplatError:
        self._reject(
            Rejection(
                kind,
                exc.reason,
                client.client_id,
                {"round": round_number} if round_number else {},
            )
        )
        return exc

    def begin(self, client: ClientState, header: UpdateHeader) -> Upload:
        """Check an upload's header (see module docstring); open its row."""
        cid = client.client_id
        with self.board.lock:
            r = self.board.round
            a = r.by_task.get(header.task_id) if r is not None else None
            if r is None or a is None:
                closed = self.board.closed_round_of(header.task_id)
                if closed is not None:
                    raise self._refuse(
                        StaleUpdate(
                            f"round {closed} is closed; task {header.task_id} is over"
                        ),
                        "late_update",
                        client,
                        closed,
                    )
                raise self._refuse(
                    StaleUpdate(f"task {header.task_id!r} is not an open task"),
                    "unknown_task",
                    client,
                )
            if a.client_id != cid:
                raise self._refuse(
                    PermissionDenied("this task belongs to another client"),
                    "foreign_task",
                    client,
                    r.number,
                )
            if r.answered(cid):
                raise self._refuse(
                    DuplicateUpdate(
                        f"an update for task {header.task_id} (round {r.number}) was "
                        "already received"
                    ),
                    "duplicate_update",
                    client,
                    r.number,
                )
            if header.round != r.number:
                raise self._refuse(
                    StaleUpdate(
                        f"update is for round {header.round}, open round is {r.number}"
                    ),
                    "wrong_round",
                    client,
                    r.number,
                )
        try:
            # Before anything is decided about the client: under secure
            # aggregation its outcome is the protocol's, not an upload's.
            r.accumulator.check_upload()
        except PayloadError as exc:
            raise self._refuse(
                InvalidArgument(str(exc)), "update_rejected", client, r.number
            ) from None
        self._check_header(client, header, r, a)
        if self.clock() > r.deadline:
            self._settle(r, a, OutcomeStatus.LATE, f"round {r.number} deadline passed")
            raise self._refuse(
                StaleUpdate(f"round {r.number} deadline passed"),
                "late_update",
                client,
                r.number,
            )
        try:
            check_payload_size(header.total_bytes, self.layout.numel)
        except PayloadError as exc:
            self._settle(r, a, OutcomeStatus.REJECTED, str(exc))
            raise self._refuse(
                InvalidArgument(str(exc)), "update_rejected", client, r.number
            ) from None
        return Upload(self, r, a, client, header)

    def _check_header(
        self, client: ClientState, header: UpdateHeader, r: Round, a: Assignment
    ) -> None:
        """Checks that leave the task open (the header is not yet attributed)."""
        if header.encoding != PAYLOAD_V1:
            raise self._refuse(
                InvalidArgument(
                    f"unknown encoding {header.encoding!r}; expected {PAYLOAD_V1}"
                ),
                "update_rejected",
                client,
                r.number,
            )
        if header.layout != self.layout:
            raise self._refuse(
                InvalidArgument(
                    "update layout does not match the model: "
                    f"{self.layout.describe_mismatch(header.layout)}"
                ),
                "update_rejected",
                client,
                r.number,
            )
        if header.total_bytes > self.max_bytes:
            raise self._refuse(
                ResourceExhausted(
                    f"update of {header.total_bytes} bytes exceeds the limit of "
                    f"{self.max_bytes} bytes"
                ),
                "update_oversize",
                client,
                r.number,
            )
        if header.num_examples < 1 and self.cfg.aggregator.is_weighted:
            raise self._refuse(
                InvalidArgument("num_examples must be >= 1 for a weighted aggregator"),
                "update_rejected",
                client,
                r.number,
            )
        fields = update_statement(self.run_id, header, a.nonce)
        if not verify(client.public_key, header.signature, UPDATE, *fields):
            raise self._refuse(
                PermissionDenied(
                    "update signature does not verify with the client's key"
                ),
                "bad_signature",
                client,
                r.number,
            )

    def _settle(
        self,
        r: Round,
        a: Assignment,
        status: OutcomeStatus,
        reason: str,
        wire_bytes: int = 0,
    ) -> None:
        """Record a final, attributable failure of the client's round."""
        if r.settle(a.client_id, status, reason, wire_bytes):
            self.board.signal.notify()


class Upload:
    """One upload in progress (created by :meth:`Intake.begin`)."""

    def __init__(
        self,
        intake: Intake,
        r: Round,
        a: Assignment,
        client: ClientState,
        header: UpdateHeader,
    ) -> None:
        self.intake, self.r, self.a, self.client = intake, r, a, client
        self.header = header
        self._hash = hashlib.sha256()
        self.wire_bytes = 0  # every byte of the messages, set by the transport
        # write, finish and fail exclude each other: a transport that gives up
        # on a call (cancelled) while a worker thread still writes or commits
        # the row must not release that row under it.
        self._lock = threading.Lock()
        self._done = False
        self.row: torch.Tensor | None = None
        self.sink: PayloadSink | None = None

    def start(self) -> None:
        """Take the row the body is decoded into (after the transport admitted
        the upload among its concurrent ones: a row is model-sized)."""
        self.row = self.r.accumulator.acquire(self.a.row)
        plan = self.intake.plan
        self.sink = PayloadSink(
            self.row,
            self.header.total_bytes,
            plan.decoder(self.r.accumulator.sketch_space),
            seed=plan.seed,
            round=self.r.number,
            d=self.intake.layout.numel,
        )

    def write(self, data: memoryview | bytes) -> None:
        assert self.sink is not None, "start() first"
        with self._lock, self.r.writing():  # the round does not seal under it
            if self._done:
                raise StaleUpdate("this upload has ended")
            try:
                self._hash.update(data)
                self.sink.write(data)
            except PayloadError as exc:
                raise InvalidArgument(f"bad payload: {exc}") from None

    def finish(self) -> UploadAck:
        """Check and accept the update (or raise with the reason)."""
        h, r = self.header, self.r
        assert self.sink is not None, "start() first"
        if self._hash.hexdigest() != h.sha256:
            raise InvalidArgument("update checksum mismatch (corrupted or truncated)")
        # Decoding the last piece, clipping and committing touch the row: the
        # round does not seal (nor its rows move) until this is done.
        with self._lock, r.writing():
            if self._done:
                raise StaleUpdate("this upload has ended")
            try:
                vec = self.sink.finish()
            except PayloadError as exc:
                raise InvalidArgument(f"bad payload: {exc}") from None
            norm = checked_norm(vec)
            limit = self.intake.cfg.server.max_update_norm
            if norm > limit:
                raise InvalidArgument(
                    f"update norm {norm:.3g} exceeds the plausible maximum {limit:.3g}"
                )
            clipped = self.intake.plan.clip_row(vec, norm)
            self._commit(vec, norm, clipped)
        self.intake.board.signal.notify()
        return UploadAck(True, f"update for round {r.number} accepted", self.wire_bytes)

    def _commit(self, vec: torch.Tensor, norm: float, clipped: bool) -> None:
        h, r, a, intake = self.header, self.r, self.a, self.intake
        # The averaging weight: the example count capped by the token, the run
        # and the round (its weight bound) for a weighted rule; 1 otherwise
        # (robust rules, central DP's unweighted mean).
        examples = intake.registry.weight(self.client, h.num_examples)
        weighted = intake.cfg.aggregator.is_weighted
        weight = r.accumulator.bounds.weigh(examples) if weighted else 1.0
        accepted = Accepted(
            a.client_id,
            a.row,
            weight,
            norm,
            weight_capped=weighted and weight < h.num_examples,
        )
        r.reserve(a.client_id)  # nobody else commits this row
        try:
            r.accumulator.commit(accepted, vec)
        except BaseException:
            r.unreserve(a.client_id, "the update could not be added", self.wire_bytes)
            self._done = True
            raise
        r.succeed(
            a.client_id,
            Delivery(
                bytes_up=self.wire_bytes,
                num_examples=h.num_examples,
                weight=weight if weighted else float(examples),
                train_loss=h.metrics.get("train_loss"),
                metrics=h.metrics,
                clipped=clipped,
            ),
            intake.clock(),
        )
        self._done = True

    def fail(self, exc: FedplatError) -> None:
        """Release the row; record the failure as the client's (the header was
        signed by its key) unless the round moved on. Waits for a write or
        finish in progress; a no-op once the update was committed or failed."""
        with self._lock:
            if self._done:
                return
            self._done = True
            if self.row is not None:
                self.r.accumulator.release(self.a.row, self.row)
        late = isinstance(exc, StaleUpdate)
        status = OutcomeStatus.LATE if late else OutcomeStatus.REJECTED
        if not isinstance(exc, DuplicateUpdate):
            self.intake._settle(self.r, self.a, status, exc.reason, self.wire_bytes)
        if not exc.recorded:
            self.intake._reject(
                Rejection(
                    "update_rejected",
                    exc.reason,
                    self.client.client_id,
                    {"round": self.r.number},
                )
            )
            exc.recorded = True


__all__ = ["Intake", "Upload"]
