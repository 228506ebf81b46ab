"""What each control API method does, once its caller is authorized.

Each action is a plain function of the store (it runs in a worker thread):
``(operator, request) -> Done(answer, target, run_id)``, where ``target`` and
``run_id`` are what the audit trail records. Bad input raises
:class:`Refused` with a status and one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc

from fedplat.control.audit import AUDIT_KIND, printable
from fedplat.proto import control_pb2 as pb
from fedplat.security.operators import Operator
from fedplat.store import ClientRecord, RunRecord, Store
from fedplat.store.validate import INT32_MAX
from fedplat.ui.status import client_state, run_view

#: The most tokens one call makes, and the longest they may live.
MAX_TOKENS = 1000
MAX_TOKEN_SECONDS = 365 * 24 * 3600.0
#: The most rows one list answer holds (newest first), and the default.
MAX_LIST = 1000
DEFAULT_LIST = 100
MAX_TEXT = 255


class Refused(Exception):
    """A call refused with ``code`` and a one-line reason."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class ServedRun:
    """The run this coordinator serves, and how to stop it: ``stop(reason)``
    returns ``None``, or the reason of a stop already asked for."""

    run_id: str
    stop: Callable[[str], str | None]


@dataclass(frozen=True)
class Done:
    answer: Any
    target: str = ""
    run_id: str | None = None


def _unix(at: datetime | None) -> float:
    return at.timestamp() if at is not None else 0.0


def _text(value: str, what: str, *, required: bool = True) -> str:
    if required and not value:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{what} is required")
    if len(value) > MAX_TEXT or not value.isprintable():
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{what}: at most {MAX_TEXT} printable characters",
        )
    return value


def _limit(n: int) -> int:
    return min(n or DEFAULT_LIST, MAX_LIST)


class Actions:
    """The methods' bodies (see the module docstring)."""

    def __init__(self, store: Store, served: ServedRun | None) -> None:
        self.store = store
        self.served = served

    # ------------------------------------------------------------- runs
    def _run(self, ref: str) -> RunRecord:
        _text(ref, "run")
        run = self.store.get_run_by_name(ref) or self.store.get_run(ref)
        if run is None:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"no run named or with id {ref!r}")
        return run

    def _run_msg(self, run: RunRecord) -> pb.Run:
        return pb.Run(
            id=run.id,
            name=run.name,
            status=run.status,
            current_round=run.current_round,
            total_rounds=run.total_rounds,
            best_accuracy=math.nan if run.best_accuracy is None else run.best_accuracy,
            phase=run.phase or "",
            live_clients=run.live_clients or 0,
            started_unix=_unix(run.started_at),
            finished_unix=_unix(run.finished_at),
            reason=run.reason or "",
            served_here=self.served is not None and self.served.run_id == run.id,
        )

    def WhoAmI(self, op: Operator, request: pb.Empty) -> Done:
        return Done(pb.Identity(name=op.name, role=op.role, fingerprint=op.fingerprint))

    def ListRuns(self, op: Operator, request: pb.ListRunsRequest) -> Done:
        runs = sorted(self.store.list_runs(), key=lambda r: r.created_at, reverse=True)
        runs = runs[: _limit(request.limit)]
        return Done(pb.RunList(runs=[self._run_msg(r) for r in runs]))

    def GetRun(self, op: Operator, request: pb.RunRef) -> Done:
        run = self._run(request.run)
        return Done(self._run_msg(run), run.name, run.id)

    def StopRun(self, op: Operator, request: pb.StopRunRequest) -> Done:
        run = self._run(request.run)
        why = _text(request.reason, "reason", required=False)
        if self.served is None or self.served.run_id != run.id:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this coordinator does not serve run {run.name!r}",
            )
        if run.status in ("completed", "failed"):
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"run {run.name!r} already ended ({run.status})",
            )
        earlier = self.served.stop(
            f"stopped by operator {op.name}" + (f": {why}" if why else "")
        )
        if earlier is not None:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"run {run.name!r} is already stopping ({earlier})",
            )
        return Done(self._run_msg(run), run.name, run.id)

    def StreamLog(self, op: Operator, request: pb.LogRequest) -> Done:
        """Where the stream of run ``request.run``'s log starts (the servicer
        sends the events: :mod:`fedplat.control.logs`)."""
        from fedplat.control.logs import MAX_TAIL, LogStart, start_after

        run = self._run(request.run)
        if request.after_id > INT32_MAX:  # event ids are int4 in the store
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "after_id: no such event")
        if request.tail > MAX_TAIL:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"tail: at most {MAX_TAIL}")
        if request.from_start and not request.after_id:
            after = 0
        else:
            after = start_after(self.store, run.id, request.after_id, request.tail)
        return Done(LogStart(run.id, after), run.name, run.id)

    # ------------------------------------------------------------- devices
    @staticmethod
    def _device_msg(c: ClientRecord, state: str) -> pb.Device:
        return pb.Device(
            id=c.id,
            name=c.name,
            state=state,
            num_examples=c.num_examples,
            public_key_prefix=(c.public_key or "")[:16],
            enrolled_unix=_unix(c.enrolled_at),
            last_seen_unix=_unix(c.last_seen),
        )

    def ListDevices(self, op: Operator, request: pb.RunRef) -> Done:
        run = self._run(request.run)
        view = run_view(run, datetime.now(UTC))
        devices = [
            self._device_msg(c, client_state(c, view))
            for c in self.store.list_clients(run.id)
        ]
        return Done(pb.DeviceList(devices=devices), run.name, run.id)

    def RevokeDevice(self, op: Operator, request: pb.DeviceRef) -> Done:
        run = self._run(request.run)
        cid = _text(request.id, "id")
        if self.store.get_client(run.id, cid) is None:
            raise Refused(
                grpc.StatusCode.NOT_FOUND, f"no device {cid!r} in run {run.name!r}"
            )
        device = self._device_msg(self.store.revoke_client(run.id, cid), "revoked")
        return Done(device, f"{run.name}/{cid}", run.id)

    # ------------------------------------------------------------- tokens
    def CreateTokens(self, op: Operator, request: pb.CreateTokensRequest) -> Done:
        if not 1 <= request.count <= MAX_TOKENS:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"count: 1 to {MAX_TOKENS}")
        secs = request.expires_seconds
        if not (math.isfinite(secs) and 1 <= secs <= MAX_TOKEN_SECONDS):
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"expires_seconds: 1 to {MAX_TOKEN_SECONDS:.0f}",
            )
        if request.max_examples > 2**31 - 1:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "max_examples too large")
        made = self.store.create_tokens(
            request.count,
            expires_at=datetime.now(UTC) + timedelta(seconds=secs),
            run_name=_text(request.run_name, "run_name", required=False) or None,
            max_examples=request.max_examples or None,
            note=_text(request.note, "note", required=False) or f"by {op.name}",
        )
        tokens = [
            pb.Token(
                id=t.id,
                state="valid",
                run_name=t.run_name or "",
                expires_unix=_unix(t.expires_at),
                note=t.note or "",
                secret=secret,
            )
            for t, secret in made
        ]
        return Done(pb.TokenList(tokens=tokens), f"count={request.count}")

    def ListTokens(self, op: Operator, request: pb.ListTokensRequest) -> Done:
        now = datetime.now(UTC)
        found = sorted(
            self.store.list_tokens(), key=lambda t: t.created_at, reverse=True
        )
        if not request.all:
            found = [t for t in found if t.state(now) == "valid"]
        tokens = [
            pb.Token(
                id=t.id,
                state=t.state(now),
                run_name=t.run_name or "",
                expires_unix=_unix(t.expires_at),
                note=t.note or "",
            )
            for t in found[: _limit(request.limit)]
        ]
        return Done(pb.TokenList(tokens=tokens))

    def RevokeToken(self, op: Operator, request: pb.TokenRef) -> Done:
        tid = _text(request.id, "id")
        if not any(t.id == tid for t in self.store.list_tokens()):
            raise Refused(grpc.StatusCode.NOT_FOUND, f"no enrolment token {tid!r}")
        t = self.store.revoke_token(tid)
        token = pb.Token(
            id=t.id,
            state=t.state(datetime.now(UTC)),
            run_name=t.run_name or "",
            expires_unix=_unix(t.expires_at),
            note=t.note or "",
        )
        return Done(token, tid)

    # ------------------------------------------------------------- operators
    def RevokeOperator(self, op: Operator, request: pb.OperatorRef) -> Done:
        if request.fingerprint == op.fingerprint:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "an operator cannot revoke its own certificate (another admin can)",
            )
        self.store.revoke_operator(
            request.fingerprint,
            name=_text(request.name, "name", required=False) or "?",
            by=op.name,
        )
        return Done(pb.Empty(), request.fingerprint)

    def ListAudit(self, op: Operator, request: pb.AuditRequest) -> Done:
        limit = _limit(request.limit)
        method = _text(request.method, "method", required=False)
        before = (
            datetime.fromtimestamp(request.before_unix, UTC)
            if math.isfinite(request.before_unix) and request.before_unix > 0
            else None
        )
        entries: list[pb.AuditEntry] = []
        # Filters apply to pages of the log, newest first, up to 10 pages.
        for _ in range(10):
            page = self.store.list_events(
                kind=AUDIT_KIND, limit=MAX_LIST, before=before
            )
            for e in page:
                d = e.details
                if method and d.get("method") != method:
                    continue
                if request.refused_only and d.get("result") == "ok":
                    continue
                entries.append(
                    pb.AuditEntry(
                        at_unix=_unix(e.created_at),
                        operator=printable(str(d.get("operator", ""))),
                        role=printable(str(d.get("role", ""))),
                        fingerprint=printable(str(d.get("fingerprint", ""))),
                        method=printable(str(d.get("method", ""))),
                        target=printable(str(d.get("target", ""))),
                        result=printable(str(d.get("result", ""))),
                        run_id=printable(str(d.get("run_id") or "")),
                    )
                )
                if len(entries) >= limit:
                    return Done(pb.AuditList(entries=entries), f"limit={limit}")
            if len(page) < MAX_LIST:
                break
            before = page[-1].created_at
        return Done(pb.AuditList(entries=entries), f"limit={limit}")


__all__ = ["MAX_LIST", "Actions", "Done", "Refused", "ServedRun"]
