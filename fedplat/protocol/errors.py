"""Domain errors shared by the coordinator, the transports and the client SDK.

Each error carries a human-readable reason and a transport-neutral ``code``; the gRPC
servicer maps codes to status codes and the gRPC client maps them back
(:mod:`fedplat.transport.status`, the one module that knows gRPC's), so the SDK and
the in-memory transport see the same exceptions.
"""

from __future__ import annotations


class FedplatError(Exception):
    """Base class; ``code`` names the status a transport reports."""

    code = "internal"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        # Set once the refusal is stored as an event, so no layer stores it twice.
        self.recorded = False


class InvalidArgument(FedplatError):
    """Malformed, oversize, wrong-shape or non-finite input."""

    code = "invalid_argument"


class Unauthenticated(FedplatError):
    """Missing or wrong client credentials."""

    code = "unauthenticated"


class PermissionDenied(FedplatError):
    """Authenticated, or not, but not allowed: admission refused, revoked, a
    signature that does not verify, another client's task."""

    code = "permission_denied"


class UnknownClient(FedplatError):
    """The client id is not enrolled in this run (e.g. the coordinator restarted)."""

    code = "not_found"


class StaleUpdate(FedplatError):
    """The update belongs to a round or task that is closed (late or wrong round)."""

    code = "failed_precondition"


class DuplicateUpdate(FedplatError):
    """The client already uploaded an update for this task."""

    code = "already_exists"


class Unavailable(FedplatError):
    """The peer cannot be reached now; retry with backoff."""

    code = "unavailable"


class TlsError(FedplatError):
    """A TLS failure no retry can fix (certificate, plaintext/TLS mismatch)."""

    code = "failed_precondition"


class ResourceExhausted(FedplatError):
    """A transport-level size limit was hit."""

    code = "resource_exhausted"


ERRORS_BY_CODE: dict[str, type[FedplatError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        UnknownClient,
        StaleUpdate,
        DuplicateUpdate,
        Unavailable,
        ResourceExhausted,
    )
}
