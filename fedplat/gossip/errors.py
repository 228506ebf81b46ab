"""The gossip peers' one error beyond :mod:`fedplat.transport.errors`."""

from __future__ import annotations

from fedplat.transport.errors import FedplatError

__all__ = ["PermissionDenied"]


class PermissionDenied(FedplatError):
    """The caller is not admitted: not a member, speaking as another member, or
    its signature does not verify (``PERMISSION_DENIED``)."""

    code = "permission_denied"
