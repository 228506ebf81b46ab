"""Who may call what on the control API, and the audit trail of every call.

Every call ends in one audit event in the store: kind ``audit``, filed with no
run (so runs' own event feeds stay theirs) and the run it named, if any, in its
details; who (certificate name, role, fingerprint), what (method and target),
when, and the result (``ok`` or the refusal). Every text field is made
printable first (:func:`printable`: a control character is written as its
escape), so no caller can forge a line of the log or send a terminal escape.
Refusals of one caller are recorded at a bounded rate (:data:`REFUSALS_BURST`
at once, :data:`REFUSALS_PER_SECOND` sustained); a refusal that could not be
recorded is counted and said in that caller's next recorded entry. Allowed
calls are bounded by the servicer's per-certificate call rate.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from fedplat.security.operators import Operator, Role
from fedplat.store import Store, StoreError
from fedplat.transport.limits import KeyedBuckets

log = logging.getLogger("fedplat.control")

#: The least role each method needs (see :mod:`fedplat.security.operators`).
NEEDS: dict[str, Role] = {
    "WhoAmI": "viewer",
    "ListRuns": "viewer",
    "GetRun": "viewer",
    "ListDevices": "viewer",
    "ListTokens": "viewer",
    "ListAudit": "viewer",
    "StreamLog": "viewer",
    "StopRun": "operator",
    "RevokeDevice": "admin",
    "CreateTokens": "admin",
    "RevokeToken": "admin",
    "RevokeOperator": "admin",
}

AUDIT_KIND = "audit"
REFUSALS_BURST = 20
REFUSALS_PER_SECOND = 0.2
#: Callers whose refusal budgets are remembered (the oldest is forgotten).
MAX_CALLERS = 10_000


def printable(text: str, limit: int = 300) -> str:
    """``text`` with every non-printable character escaped (``\\n``,
    ``\\x1b``), cut to ``limit`` characters."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return out[:limit]


@dataclass(frozen=True)
class Caller:
    """Who made a call: an operator, or a certificate that is not one."""

    name: str
    role: str
    fingerprint: str

    @classmethod
    def of(cls, op: Operator) -> Caller:
        return cls(op.name, op.role, op.fingerprint)


class AuditTrail:
    """Writes the audit events (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._budgets = KeyedBuckets(
            REFUSALS_PER_SECOND, REFUSALS_BURST, max_keys=MAX_CALLERS
        )
        self._unrecorded: dict[str, int] = {}

    def _may_record_refusal(self, key: str) -> bool:
        with self._lock:
            if self._budgets.take(key):
                return True
            self._unrecorded[key] = self._unrecorded.get(key, 0) + 1
            return False

    def record(
        self,
        caller: Caller,
        method: str,
        target: str,
        result: str,
        run_id: str | None = None,
    ) -> None:
        """One audit event; a refusal (``result`` not ``ok``) within its budget."""
        key = caller.fingerprint or caller.name
        if result != "ok" and not self._may_record_refusal(key):
            return
        with self._lock:
            missed = self._unrecorded.pop(key, 0)
        details: dict[str, Any] = {
            "operator": printable(caller.name, 64),
            "role": printable(caller.role, 120),
            "fingerprint": printable(caller.fingerprint, 64),
            "method": printable(method, 32),
            "target": printable(target, 200),
            "result": printable(result),
            "run_id": run_id,
        }
        if missed:
            details["refusals_not_recorded_before"] = missed
        d = details
        try:
            self._store.add_event(
                None,
                AUDIT_KIND,
                f"{d['operator']} ({d['role']}) {d['method']} {d['target']}: "
                f"{d['result']}",
                level="info" if result == "ok" else "warning",
                details=details,
            )
        except StoreError:
            log.exception("control: could not record the audit event")


__all__ = ["AUDIT_KIND", "NEEDS", "AuditTrail", "Caller", "printable"]
