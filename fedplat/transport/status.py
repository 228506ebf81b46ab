"""The one mapping between fedplat's domain errors and gRPC status codes.

Servicers (coordinator and gossip peers) answer a :class:`FedplatError` with
:func:`status_of` its code and its reason; clients turn a failed RPC back into the
domain error with :func:`error_from_rpc`, so the SDK and the in-memory transport
see the same exceptions. TLS failures that no retry can fix (a certificate that
does not verify, TLS against a plaintext server) become :class:`TlsError`.
"""

from __future__ import annotations

import grpc

from fedplat.protocol.errors import (
    ERRORS_BY_CODE,
    FedplatError,
    TlsError,
    Unavailable,
)

STATUS_BY_CODE: dict[str, grpc.StatusCode] = {
    "invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "already_exists": grpc.StatusCode.ALREADY_EXISTS,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "internal": grpc.StatusCode.INTERNAL,
}
CODE_BY_STATUS = {v: k for k, v in STATUS_BY_CODE.items()}

_TRANSIENT = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    None,
)


def status_of(exc: FedplatError) -> grpc.StatusCode:
    return STATUS_BY_CODE.get(exc.code, grpc.StatusCode.INTERNAL)


def _tls_problem(details: str) -> str | None:
    d = details.upper()
    if "CERTIFICATE_VERIFY_FAILED" in d or "CERTIFICATE VERIFY FAILED" in d:
        return (
            "the coordinator's TLS certificate does not verify against the CA "
            "given (wrong CA file, or a name/IP the certificate does not cover)"
        )
    if "WRONG_VERSION_NUMBER" in d or "HTTP_REQUEST" in d:
        return "TLS to a coordinator that serves plaintext: connect with --insecure"
    if "CERTIFICATE_REQUIRED" in d or "PEER DID NOT RETURN A CERTIFICATE" in d:
        return "the coordinator requires a client certificate (mutual TLS)"
    return None


def error_from_rpc(exc: grpc.RpcError, *, plaintext: bool = False) -> FedplatError:
    """Map a failed RPC back to the domain error the SDK handles."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    if code in _TRANSIENT:
        tls = _tls_problem(details)
        if tls is not None:
            return TlsError(tls)
        reason = f"{code.name if code else 'error'}: {details}"
        if plaintext and ("Socket closed" in details or "reset" in details):
            reason += (
                " (a plaintext connection was closed: if the coordinator serves "
                "TLS, connect with its CA instead of --insecure)"
            )
        return Unavailable(reason)
    cls = ERRORS_BY_CODE.get(CODE_BY_STATUS.get(code, ""), FedplatError)
    return cls(details)


__all__ = ["CODE_BY_STATUS", "STATUS_BY_CODE", "error_from_rpc", "status_of"]
