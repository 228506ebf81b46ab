"""The control API's audit trail as the monitor shows it (Streamlit-free).

Each audit event (kind ``audit``, written by :mod:`fedplat.control.audit`) is
one row: when, who (certificate name, role, fingerprint prefix), what (method
and target), the result, and the run it concerns (kept in the event's details:
audit events are filed with no run, so runs' own feeds stay theirs). The values
come from certificates and callers, so the page shows them as table cells (text,
never Markdown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from fedplat.store import EventRecord

AUDIT_COLUMNS = [
    "time", "operator", "role", "method", "target", "result", "run", "fingerprint",
]  # fmt: skip


def audit_frame(
    events: Sequence[EventRecord], run_names: Mapping[str, str]
) -> pd.DataFrame:
    """Rows of ``events`` (newest first, as the store lists them); ``run_names``
    maps run ids to names (an unknown id is shown as it is)."""
    rows = []
    for e in events:
        d = e.details
        rows.append(
            {
                "time": e.created_at,
                "operator": str(d.get("operator", "")),
                "role": str(d.get("role", "")),
                "method": str(d.get("method", "")),
                "target": str(d.get("target", "")),
                "result": str(d.get("result", "")),
                "run": _run(e.run_id or d.get("run_id"), run_names),
                "fingerprint": str(d.get("fingerprint", ""))[:16],
            }
        )
    return pd.DataFrame(rows, columns=AUDIT_COLUMNS)


def _run(run_id: object, run_names: Mapping[str, str]) -> str:
    if not run_id:
        return ""
    return run_names.get(str(run_id), str(run_id))


def refused(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows whose call was refused."""
    return frame[frame["result"] != "ok"]


__all__ = ["AUDIT_COLUMNS", "audit_frame", "refused"]
