"""The control API's servicer: operators' calls, authorized by role and audited.

Served on a port of its own with mutual TLS (the composition root,
:mod:`fedplat.server.app`, builds that server): the TLS handshake admits only
certificates of the deployment's CA, and each call then reads the caller's
verified certificate (:func:`fedplat.security.operators.operator_from_pem`),
refuses a certificate that is not an operator's or was revoked, and checks the
role against :data:`fedplat.control.audit.NEEDS`. A call the role does not allow
is ``PERMISSION_DENIED``; bad input is ``INVALID_ARGUMENT``, an unknown run,
device or token ``NOT_FOUND``; every call is audited
(:class:`~fedplat.control.audit.AuditTrail`). Store calls run in worker threads,
off the event loop.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc

from fedplat.control.audit import AUDIT_KIND, NEEDS, AuditTrail, Caller
from fedplat.proto import control_pb2 as pb
from fedplat.proto import control_pb2_grpc
from fedplat.security.certs import CertError
from fedplat.security.operators import Operator, operator_from_pem
from fedplat.store import ClientRecord, RunRecord, Store, StoreError
from fedplat.ui.status import client_state, run_view

T = TypeVar("T")

#: The most tokens one call makes, and the longest they may live.
MAX_TOKENS = 1000
MAX_TOKEN_SECONDS = 365 * 24 * 3600.0
MAX_AUDIT = 1000
MAX_TEXT = 255


class Refused(Exception):
    """A call refused with ``code`` and a one-line reason."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class ServedRun:
    """The run this coordinator serves, and how to stop it (``stop(reason)``)."""

    run_id: str
    stop: Callable[[str], None]


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


def _caller(context: grpc.aio.ServicerContext) -> Caller | Operator:
    """The verified operator, or (to audit a refusal) the certificate's holder."""
    pems = (context.auth_context() or {}).get("x509_pem_cert") or []
    if not pems:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
    try:
        return operator_from_pem(pems[0])
    except CertError as exc:
        from fedplat.security.certs import fingerprint, inspect_certificate

        info = inspect_certificate(pems[0])
        return Caller(info.common_name or "?", f"none: {exc}", fingerprint(pems[0]))


class ControlServicer(control_pb2_grpc.ControlServicer):
    """See the module docstring."""

    def __init__(self, store: Store, served: ServedRun | None = None) -> None:
        self.store = store
        self.served = served
        self.audit = AuditTrail(store)

    # ------------------------------------------------------------- plumbing
    async def _call(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        target: str,
        act: Callable[[Operator], tuple[T, str | None]],
    ) -> T:
        """Authorize, run ``act(operator)`` in a thread (it returns the answer
        and the run id to file the audit event under), audit, answer."""
        caller: Caller | Operator = Caller("?", "none", "")
        run_id: str | None = None
        try:
            caller = _caller(context)
            if not isinstance(caller, Operator):
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "not an operator certificate "
                    f"({caller.role.removeprefix('none: ')})",
                )
            op = caller
            revoked = await asyncio.to_thread(
                self.store.operator_revoked, op.fingerprint
            )
            if revoked:
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"operator certificate of {op.name!r} was revoked",
                )
            if not op.may(NEEDS[method]):
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{method} needs the {NEEDS[method]} role; "
                    f"{op.name!r} is {op.role}",
                )
            answer, run_id = await asyncio.to_thread(act, op)
        except Refused as exc:
            await self._audit(caller, method, target, exc.reason, run_id)
            await context.abort(exc.code, exc.reason)
        except StoreError as exc:
            reason = " ".join(str(exc).split())
            await self._audit(caller, method, target, reason, run_id)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        await self._audit(caller, method, target, "ok", run_id)
        return answer

    async def _audit(
        self,
        caller: Caller | Operator,
        method: str,
        target: str,
        result: str,
        run_id: str | None,
    ) -> None:
        who = caller if isinstance(caller, Caller) else Caller.of(caller)
        await asyncio.to_thread(self.audit.record, who, method, target, result, run_id)

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

    # ------------------------------------------------------------- runs
    async def WhoAmI(self, request: pb.Empty, context: Any) -> pb.Identity:
        return await self._call(
            "WhoAmI",
            context,
            "",
            lambda op: (
                pb.Identity(name=op.name, role=op.role, fingerprint=op.fingerprint),
                None,
            ),
        )

    async def ListRuns(self, request: pb.Empty, context: Any) -> pb.RunList:
        def act(op: Operator) -> tuple[pb.RunList, None]:
            runs = self.store.list_runs()
            return pb.RunList(runs=[self._run_msg(r) for r in runs]), None

        return await self._call("ListRuns", context, "", act)

    async def GetRun(self, request: pb.RunRef, context: Any) -> pb.Run:
        def act(op: Operator) -> tuple[pb.Run, str]:
            run = self._run(request.run)
            return self._run_msg(run), run.id

        return await self._call("GetRun", context, request.run[:MAX_TEXT], act)

    async def StopRun(self, request: pb.StopRunRequest, context: Any) -> pb.Run:
        def act(op: Operator) -> tuple[pb.Run, str]:
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
            self.served.stop(
                f"stopped by operator {op.name}" + (f": {why}" if why else "")
            )
            return self._run_msg(run), run.id

        return await self._call("StopRun", context, request.run[:MAX_TEXT], act)

    # ------------------------------------------------------------- devices
    def _device_msg(self, c: ClientRecord, state: str) -> pb.Device:
        return pb.Device(
            id=c.id,
            name=c.name,
            state=state,
            num_examples=c.num_examples,
            public_key_prefix=(c.public_key or "")[:16],
            enrolled_unix=_unix(c.enrolled_at),
            last_seen_unix=_unix(c.last_seen),
        )

    async def ListDevices(self, request: pb.RunRef, context: Any) -> pb.DeviceList:
        def act(op: Operator) -> tuple[pb.DeviceList, str]:
            run = self._run(request.run)
            view = run_view(run, datetime.now(UTC))
            devices = [
                self._device_msg(c, client_state(c, view))
                for c in self.store.list_clients(run.id)
            ]
            return pb.DeviceList(devices=devices), run.id

        return await self._call("ListDevices", context, request.run[:MAX_TEXT], act)

    async def RevokeDevice(self, request: pb.DeviceRef, context: Any) -> pb.Device:
        def act(op: Operator) -> tuple[pb.Device, str]:
            run = self._run(request.run)
            cid = _text(request.id, "id")
            if self.store.get_client(run.id, cid) is None:
                raise Refused(
                    grpc.StatusCode.NOT_FOUND, f"no device {cid!r} in run {run.name!r}"
                )
            return self._device_msg(
                self.store.revoke_client(run.id, cid), "revoked"
            ), run.id

        target = f"{request.run[:MAX_TEXT]}/{request.id[:MAX_TEXT]}"
        return await self._call("RevokeDevice", context, target, act)

    # ------------------------------------------------------------- tokens
    async def CreateTokens(
        self, request: pb.CreateTokensRequest, context: Any
    ) -> pb.TokenList:
        def act(op: Operator) -> tuple[pb.TokenList, None]:
            if not 1 <= request.count <= MAX_TOKENS:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT, f"count: 1 to {MAX_TOKENS}"
                )
            secs = request.expires_seconds
            if not (math.isfinite(secs) and 0 < secs <= MAX_TOKEN_SECONDS):
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"expires_seconds: more than 0, at most {MAX_TOKEN_SECONDS:.0f}",
                )
            if request.max_examples > 2**31 - 1:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT, "max_examples too large"
                )
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
            return pb.TokenList(tokens=tokens), None

        return await self._call("CreateTokens", context, f"count={request.count}", act)

    async def ListTokens(self, request: pb.Empty, context: Any) -> pb.TokenList:
        def act(op: Operator) -> tuple[pb.TokenList, None]:
            now = datetime.now(UTC)
            tokens = [
                pb.Token(
                    id=t.id,
                    state=t.state(now),
                    run_name=t.run_name or "",
                    expires_unix=_unix(t.expires_at),
                    note=t.note or "",
                )
                for t in self.store.list_tokens()
            ]
            return pb.TokenList(tokens=tokens), None

        return await self._call("ListTokens", context, "", act)

    async def RevokeToken(self, request: pb.TokenRef, context: Any) -> pb.Token:
        def act(op: Operator) -> tuple[pb.Token, None]:
            t = self.store.revoke_token(_text(request.id, "id"))
            return pb.Token(
                id=t.id,
                state=t.state(datetime.now(UTC)),
                run_name=t.run_name or "",
                expires_unix=_unix(t.expires_at),
                note=t.note or "",
            ), None

        return await self._call("RevokeToken", context, request.id[:MAX_TEXT], act)

    # ------------------------------------------------------------- operators
    async def RevokeOperator(self, request: pb.OperatorRef, context: Any) -> pb.Empty:
        def act(op: Operator) -> tuple[pb.Empty, None]:
            self.store.revoke_operator(
                request.fingerprint,
                name=_text(request.name, "name", required=False) or "?",
                by=op.name,
            )
            return pb.Empty(), None

        return await self._call(
            "RevokeOperator", context, request.fingerprint[:MAX_TEXT], act
        )

    async def ListAudit(self, request: pb.AuditRequest, context: Any) -> pb.AuditList:
        def act(op: Operator) -> tuple[pb.AuditList, None]:
            limit = min(request.limit or 100, MAX_AUDIT)
            entries = []
            for e in self.store.list_events(kind=AUDIT_KIND, limit=limit):
                d = e.details
                entries.append(
                    pb.AuditEntry(
                        at_unix=_unix(e.created_at),
                        operator=str(d.get("operator", "")),
                        role=str(d.get("role", "")),
                        fingerprint=str(d.get("fingerprint", "")),
                        method=str(d.get("method", "")),
                        target=str(d.get("target", "")),
                        result=str(d.get("result", "")),
                    )
                )
            return pb.AuditList(entries=entries), None

        return await self._call("ListAudit", context, f"limit={request.limit}", act)


__all__ = ["ControlServicer", "Refused", "ServedRun"]
