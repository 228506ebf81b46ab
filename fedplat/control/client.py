"""Reaching a coordinator's control API: where it is and with which certificate.

A *profile* names the service and the operator's credentials; flags override
it field by field::

    # ~/.config/fedplat/profile.yaml (or $FEDPLAT_PROFILE, or --profile PATH)
    service: coordinator.example:50061
    ca: certs/ca.pem            # the deployment's CA (verifies the service)
    cert: certs/alice.pem       # fedplat certs operator alice --role admin
    key: certs/alice.key

Relative paths in a profile are relative to the profile's folder. Errors are
:class:`ControlError` with one line (the CLI prints it and exits 2).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from fedplat.proto import control_pb2 as pb
from fedplat.proto import control_pb2_grpc

DEFAULT_PROFILE = Path("~/.config/fedplat/profile.yaml")
FIELDS = ("service", "ca", "cert", "key")
#: Seconds a control call may take.
CALL_SECONDS = 30.0


class ControlError(Exception):
    """A control call or its setup failed (one line)."""


@dataclass(frozen=True)
class Profile:
    service: str
    ca: Path
    cert: Path
    key: Path


def _profile_file(path: str | None) -> Path | None:
    if path:
        return Path(path).expanduser()
    env = os.environ.get("FEDPLAT_PROFILE")
    if env:
        return Path(env).expanduser()
    default = DEFAULT_PROFILE.expanduser()
    return default if default.is_file() else None


def load_profile(path: str | None = None, **flags: str | None) -> Profile:
    """The profile at ``path`` (or the default), with ``flags`` overriding."""
    found: dict[str, Any] = {}
    where = _profile_file(path)
    if where is not None:
        try:
            data = yaml.safe_load(where.read_text())
        except OSError as exc:
            raise ControlError(f"profile {where}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ControlError(f"profile {where}: not YAML ({exc})") from None
        if not isinstance(data, dict) or set(data) - set(FIELDS):
            raise ControlError(
                f"profile {where}: a mapping of {', '.join(FIELDS)} (no other keys)"
            )
        for k in ("ca", "cert", "key"):
            if k in data and data[k] is not None:
                data[k] = str(where.parent / Path(str(data[k])).expanduser())
        found.update({k: str(v) for k, v in data.items() if v is not None})
    found.update({k: v for k, v in flags.items() if v})
    missing = [k for k in FIELDS if not found.get(k)]
    if missing:
        raise ControlError(
            f"no {', '.join(missing)} for the control API: give --service, --ca, "
            "--cert and --key, or a profile (--profile, $FEDPLAT_PROFILE or "
            f"{DEFAULT_PROFILE})"
        )
    return Profile(
        found["service"], Path(found["ca"]), Path(found["cert"]), Path(found["key"])
    )


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ControlError(f"{what} {path}: {exc.strerror}") from None


class ControlClient:
    """A channel to the control API; each method is one call (see control.proto)."""

    def __init__(self, profile: Profile) -> None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(profile.ca, "ca"),
            private_key=_read(profile.key, "key"),
            certificate_chain=_read(profile.cert, "cert"),
        )
        self.service = profile.service
        self._channel = grpc.secure_channel(profile.service, creds)
        self._stub = control_pb2_grpc.ControlStub(self._channel)

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._channel.close()

    def call(self, method: str, request: Any) -> Any:
        """``method(request)``; a gRPC error becomes a :class:`ControlError`."""
        try:
            return getattr(self._stub, method)(request, timeout=CALL_SECONDS)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def stream(
        self,
        method: str,
        request: Any,
        timeout: float | None = None,
        trailer: dict[str, str] | None = None,
    ) -> Iterator[Any]:
        """The messages of the streaming ``method(request)``, as they come;
        once it ends, its trailing metadata is put in ``trailer``."""
        try:
            call = getattr(self._stub, method)(request, timeout=timeout)
            yield from call
            if trailer is not None:
                trailer.update((k, str(v)) for k, v in call.trailing_metadata() or ())
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.RpcError) -> ControlError:
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        name = code.name if code is not None else "ERROR"
        if code == grpc.StatusCode.UNAVAILABLE:
            detail = (
                f"cannot reach the control API at {self.service} ({detail}; is "
                "the certificate from the service's CA?)"
            )
        return ControlError(f"{name}: {' '.join(str(detail).split())}")


__all__ = [
    "DEFAULT_PROFILE",
    "ControlClient",
    "ControlError",
    "Profile",
    "load_profile",
    "pb",
]
