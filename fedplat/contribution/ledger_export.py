"""Export a run's contribution ledger as CSV or JSON (JSON with its verification)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from fedplat.contribution.ledger import StoredEntry, StoredHead
from fedplat.contribution.ledger_verify import LedgerReport

EXPORT_FORMATS = ("csv", "json")


def export_rows(entries: Sequence[StoredEntry]) -> list[dict[str, Any]]:
    """One flat dict per entry: chain fields plus the decoded content."""
    rows = []
    for e in entries:
        try:
            payload = json.loads(e.payload_json)
        except ValueError:
            payload = {}
        rows.append(
            {
                "seq": e.seq,
                "round": e.round_number,
                "client_id": e.client_id,
                "attempt": payload.get("attempt"),
                "scores": payload.get("scores", {}),
                "credit": payload.get("credit"),
                "flags": payload.get("flags", []),
                "suspect": payload.get("suspect"),
                "cumulative": payload.get("cumulative"),
                "reward_share": payload.get("reward_share"),
                "reward": payload.get("reward"),
                "entry_hash": e.entry_hash,
                "prev_hash": e.prev_hash,
                "signature": e.signature,
            }
        )
    return rows


def export_ledger(
    run_id: str,
    entries: Sequence[StoredEntry],
    head: StoredHead | None,
    fmt: str,
    report: LedgerReport | None = None,
) -> str:
    """Render a ledger as CSV (one row per entry, ``score.<name>`` columns) or
    JSON (run, head, verification report and entries)."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {list(EXPORT_FORMATS)}")
    rows = export_rows(entries)
    if fmt == "json":
        doc: dict[str, Any] = {
            "run_id": run_id,
            "head": None
            if head is None
            else {
                "seq": head.seq,
                "head_hash": head.head_hash,
                "signature": head.signature,
                "key_id": head.key_id,
                "public_key_pem": head.public_key_pem,
            },
            "entries": rows,
        }
        if report is not None:
            doc["verification"] = {
                "ok": report.ok,
                "problems": [
                    {"kind": p.kind, "seq": p.seq, "message": p.message}
                    for p in report.problems
                ],
            }
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    names = sorted({k for r in rows for k in r["scores"]})
    buf = io.StringIO()
    columns = [
        "seq",
        "round",
        "client_id",
        "attempt",
        *(f"score.{n}" for n in names),
        "credit",
        "flags",
        "suspect",
        "cumulative",
        "reward_share",
        "reward",
        "entry_hash",
        "prev_hash",
        "signature",
    ]
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        flat = {k: v for k, v in r.items() if k not in ("scores", "flags")}
        flat.update({f"score.{n}": r["scores"].get(n) for n in names})
        flat["flags"] = ";".join(r["flags"])
        writer.writerow(flat)
    return buf.getvalue()
