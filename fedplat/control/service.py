"""The control API's servicer: operators' calls, authorized by role, bounded,
audited.

Served on a port of its own with mutual TLS (the composition root,
:mod:`fedplat.server.app`, builds that server with
:func:`fedplat.server.wire.control_options`): the TLS handshake admits only
certificates of the deployment's CA. Each method is served as a stream that
carries one request, so the caller is checked *before* its request is read:

1. the caller's verified certificate must be an operator's
   (:func:`fedplat.security.operators.operator_from_pem`) and not revoked, and
   its role must allow the method (:data:`fedplat.control.audit.NEEDS`), else
   ``PERMISSION_DENIED``;
2. the certificate must be within its call rate and its calls in flight (and
   all calls within the total), else ``RESOURCE_EXHAUSTED``;
3. the request must arrive within ``receive_seconds`` (a caller that never sends
   it gives its slot back), and parse;
4. the action runs in a worker thread (:mod:`fedplat.control.actions`); bad
   input is ``INVALID_ARGUMENT``, an unknown run, device or token ``NOT_FOUND``.

Every call, allowed or refused, ends in one audit event
(:class:`~fedplat.control.audit.AuditTrail`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from fedplat.control import logs
from fedplat.control.actions import Actions, Done, Refused, ServedRun
from fedplat.control.audit import NEEDS, AuditTrail, Caller
from fedplat.control.logs import LOG_END
from fedplat.proto import control_pb2 as pb
from fedplat.proto.streams import Malformed
from fedplat.protocol.errors import FedplatError
from fedplat.security.certs import CertError, fingerprint, inspect_certificate
from fedplat.security.operators import Operator, operator_from_pem
from fedplat.store import Store, StoreError
from fedplat.transport.limits import KeyedBuckets, StreamSlots, read_one
from fedplat.transport.status import status_of

log = logging.getLogger("fedplat.control")

SERVICE = "fedplat.control.v1.Control"
#: Each method's request message.
REQUESTS: dict[str, Any] = {
    "WhoAmI": pb.Empty,
    "ListRuns": pb.ListRunsRequest,
    "GetRun": pb.RunRef,
    "StopRun": pb.StopRunRequest,
    "ListDevices": pb.RunRef,
    "RevokeDevice": pb.DeviceRef,
    "CreateTokens": pb.CreateTokensRequest,
    "ListTokens": pb.ListTokensRequest,
    "RevokeToken": pb.TokenRef,
    "RevokeOperator": pb.OperatorRef,
    "ListAudit": pb.AuditRequest,
}
#: Streams one certificate may hold open at once, and all certificates together
#: (apart from the slots of the other calls).
STREAMS_PER_OPERATOR = 2
MAX_STREAMS = 8
#: How long a log stream waits for its reader to take the next event.
WRITE_SECONDS = 60.0

#: Certificates whose call rates are remembered (the oldest is forgotten).
MAX_RATES = 10_000


@dataclass(frozen=True)
class ControlLimits:
    """What the callers of one control server may hold (``control`` section)."""

    max_calls: int = 16
    per_operator: int = 4
    calls_per_second: float = 1.0
    burst: int = 60
    receive_seconds: float = 10.0


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        try:
            return cls.FromString(raw)
        except DecodeError:
            return Malformed(f"not a {cls.DESCRIPTOR.name} message", len(raw))

    return parse


def _target(request: Any) -> str:
    """What a request names, for the audit trail (run, device, token or
    certificate), before the action checks it."""
    parts = [
        str(getattr(request, f))
        for f in ("run", "id", "fingerprint")
        if getattr(request, f, "")
    ]
    return "/".join(parts)


#: What ends a call with a status: a refusal of the action, the slots, the
#: request's deadline or parse (FedplatError), or a value the store refuses.
REFUSALS = (Refused, FedplatError, StoreError)


def _refusal(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and one-line reason a call ends with for ``exc``."""
    if isinstance(exc, Refused):
        return exc.code, exc.reason
    if isinstance(exc, FedplatError):
        return status_of(exc), exc.reason
    return grpc.StatusCode.INVALID_ARGUMENT, " ".join(str(exc).split())


def _caller(context: grpc.aio.ServicerContext) -> Caller | Operator:
    """The verified operator, or (to audit a refusal) the certificate's holder."""
    pems = (context.auth_context() or {}).get("x509_pem_cert") or []
    if not pems:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
    try:
        return operator_from_pem(pems[0])
    except CertError as exc:
        info = inspect_certificate(pems[0])
        return Caller(info.common_name or "?", f"none ({exc})", fingerprint(pems[0]))


class ControlServicer:
    """See the module docstring; :meth:`handler` is what the server adds."""

    def __init__(
        self,
        store: Store,
        served: ServedRun | None = None,
        limits: ControlLimits | None = None,
    ) -> None:
        self.store = store
        self.limits = limits or ControlLimits()
        self.actions = Actions(store, served)
        self.audit = AuditTrail(store)
        self.slots = StreamSlots(self.limits.per_operator, self.limits.max_calls)
        self.stream_slots = StreamSlots(STREAMS_PER_OPERATOR, MAX_STREAMS)
        self._closing = asyncio.Event()
        self._rates = KeyedBuckets(
            self.limits.calls_per_second, self.limits.burst, max_keys=MAX_RATES
        )

    def handler(self) -> grpc.GenericRpcHandler:
        methods = {
            name: grpc.stream_unary_rpc_method_handler(
                self._method(name),
                request_deserializer=_parser(cls),
                response_serializer=lambda m: m.SerializeToString(),
            )
            for name, cls in REQUESTS.items()
        }
        methods["StreamLog"] = grpc.stream_stream_rpc_method_handler(
            self._stream_log,
            request_deserializer=_parser(pb.LogRequest),
            response_serializer=lambda m: m.SerializeToString(),
        )
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    async def _stream_log(self, requests: AsyncIterator[Any], context: Any) -> None:
        """``StreamLog``: authorized and audited as every call (its one audit
        entry is made when the stream starts), then the events of
        :func:`fedplat.control.logs.stream`, each written within
        :data:`WRITE_SECONDS` (a caller that stops reading gives its slot back).
        A coroutine, so a cancelled call leaves its slot at once."""
        method, who, target = "StreamLog", Caller("?", "none", ""), ""
        started = False
        try:
            op = await self._authorize(method, context)
            who = Caller.of(op)
            with self.stream_slots.hold(op.fingerprint):
                request = await read_one(requests, self.limits.receive_seconds, method)
                target = _target(request)
                done = await asyncio.to_thread(self.actions.StreamLog, op, request)
                await self._audit(who, method, done.target, "ok", done.run_id)
                started = True
                end: list[str] = []
                events = logs.stream(
                    self.store,
                    done.answer,
                    request.follow,
                    closing=self._closing,
                    end=end,
                )
                async for event in events:
                    await asyncio.wait_for(context.write(event), WRITE_SECONDS)
                context.set_trailing_metadata(((LOG_END, end[-1]),))
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the log was not read for {WRITE_SECONDS:g} s",
            )
        except REFUSALS as exc:
            code, reason = _refusal(exc)
            if not started:
                await self._refuse(context, who, method, target, code, reason)
            # A store error mid-stream: the call was audited when it started.
            log.warning("StreamLog of %s for %s ended: %s", target, who.name, reason)
            await context.abort(code, reason)

    def close_streams(self) -> None:
        """The service is stopping: followers end after one last read (before
        the server's grace period runs out), saying why."""
        self._closing.set()

    async def _authorize(self, method: str, context: Any) -> Operator:
        caller = _caller(context)
        if not isinstance(caller, Operator):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"not an operator certificate: {caller.role.removeprefix('none ')}",
            )
        if await asyncio.to_thread(self.store.operator_revoked, caller.fingerprint):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"operator certificate of {caller.name!r} was revoked",
            )
        if not caller.may(NEEDS[method]):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method} needs the {NEEDS[method]} role; "
                f"{caller.name!r} is {caller.role}",
            )
        if not self._rates.take(caller.fingerprint):
            raise Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"more than {self.limits.burst} calls at once or "
                f"{self.limits.calls_per_second:g} per second from this certificate",
            )
        return caller

    def _method(self, method: str) -> Callable[[AsyncIterator[Any], Any], Any]:
        act = getattr(self.actions, method)

        async def serve(requests: AsyncIterator[Any], context: Any) -> Any:
            who: Caller = Caller("?", "none", "")
            done, target = Done(None), ""
            try:
                op = await self._authorize(method, context)
                who = Caller.of(op)
                with self.slots.hold(op.fingerprint):
                    request = await read_one(
                        requests, self.limits.receive_seconds, method
                    )
                    target = _target(request)
                    done = await asyncio.to_thread(act, op, request)
            except REFUSALS as exc:
                await self._refuse(context, who, method, target, *_refusal(exc))
            await self._audit(who, method, done.target, "ok", done.run_id)
            return done.answer

        return serve

    async def _refuse(
        self,
        context: Any,
        who: Caller,
        method: str,
        target: str,
        code: grpc.StatusCode,
        reason: str,
    ) -> None:
        if who.fingerprint == "":
            try:  # a refusal before authorization: name the certificate
                found = _caller(context)
                who = found if isinstance(found, Caller) else Caller.of(found)
            except Refused:
                pass
        await self._audit(who, method, target, reason, None)
        await context.abort(code, reason)

    async def _audit(
        self, who: Caller, method: str, target: str, result: str, run_id: str | None
    ) -> None:
        await asyncio.to_thread(self.audit.record, who, method, target, result, run_id)


__all__ = [
    "MAX_STREAMS",
    "SERVICE",
    "ControlLimits",
    "ControlServicer",
    "Refused",
    "ServedRun",
]
