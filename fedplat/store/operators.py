"""Operator revocations (the control API's certificates; see
:mod:`fedplat.security.operators`)."""

from __future__ import annotations

import re

from sqlalchemy import select

from fedplat.store.base import StoreBase
from fedplat.store.models import OperatorRevocation
from fedplat.store.validate import _NAME_MAX, StoreError, _now, _text

_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


def _fingerprint(value: object) -> str:
    if not isinstance(value, str) or not _FINGERPRINT.match(value):
        raise StoreError("fingerprint must be 64 lowercase hex digits (SHA-256)")
    return value


class OperatorsStore(StoreBase):
    def revoke_operator(self, fingerprint: str, *, name: str, by: str) -> bool:
        """Revoke the operator certificate ``fingerprint``; ``False`` if it
        already was (the first revocation's record is kept)."""
        fp = _fingerprint(fingerprint)
        row = OperatorRevocation(
            fingerprint=fp,
            name=_text("name", name, _NAME_MAX),
            revoked_by=_text("by", by, _NAME_MAX),
            revoked_at=_now(),
        )
        with self._write() as session:
            if session.get(OperatorRevocation, fp) is not None:
                return False
            session.add(row)
            return True

    def unrevoke_operator(self, fingerprint: str) -> bool:
        """Accept the operator certificate ``fingerprint`` again (the store's
        owner undoing a revocation); ``False`` if it was not revoked."""
        fp = _fingerprint(fingerprint)
        with self._write() as session:
            row = session.get(OperatorRevocation, fp)
            if row is None:
                return False
            session.delete(row)
            return True

    def operator_revoked(self, fingerprint: str) -> bool:
        """Whether the operator certificate ``fingerprint`` is revoked."""
        with self._read() as session:
            return (
                session.get(OperatorRevocation, _fingerprint(fingerprint)) is not None
            )

    def list_operator_revocations(self) -> list[tuple[str, str, str]]:
        """``(fingerprint, name, revoked_by)`` of every revocation, oldest first."""
        query = select(OperatorRevocation).order_by(OperatorRevocation.revoked_at)
        with self._read() as session:
            return [
                (r.fingerprint, r.name, r.revoked_by) for r in session.scalars(query)
            ]


__all__ = ["OperatorsStore"]
