"""``fedplat ledger verify|export``: the contribution ledger of a run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _open_ledger(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """(store, run) for ``--db``/``--run``, or None after printing why not."""
    from fedplat.store import Store, StoreError

    if "://" not in args.db and not Path(args.db).is_file():
        print(f"fedplat: no store at {args.db}", file=sys.stderr)
        return None
    try:
        store = Store(args.db, migrate=False)
        run = store.get_run(args.run) or store.get_run_by_name(args.run)
    except StoreError as exc:
        print(f"fedplat: {exc}", file=sys.stderr)
        return None
    if run is None:
        store.close()
        print(f"fedplat: no run named or with id {args.run!r}", file=sys.stderr)
        return None
    return store, run


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Check a run's contribution ledger; exit 1 and name each bad entry."""
    from fedplat.contribution.ledger_verify import verify_run_ledger
    from fedplat.security.keys import KeyFileError, load_public_key

    try:
        key = load_public_key(args.public_key) if args.public_key else None
    except KeyFileError as exc:
        print(f"fedplat: {exc}", file=sys.stderr)
        return 2
    opened = _open_ledger(args)
    if opened is None:
        return 2
    store, run = opened
    with store:
        report = verify_run_ledger(
            store, run.id, key, require_signature=not args.allow_unsigned
        )
    signer = report.key_id[:16] if report.key_id else "nobody (unsigned)"
    if report.ok:
        print(
            f"ledger of run {run.name!r}: OK, {report.entries} entries, "
            f"head seq {report.head_seq}, signed by key {signer}"
        )
        return 0
    print(
        f"ledger of run {run.name!r}: {len(report.problems)} problem(s) in "
        f"{report.entries} entries"
    )
    for problem in report.problems:
        print(f"  [{problem.kind}] {problem.message}")
    return 1


def cmd_ledger_export(args: argparse.Namespace) -> int:
    """Write a run's ledger as CSV or JSON (JSON includes a verification)."""
    from fedplat.contribution.ledger_export import export_ledger
    from fedplat.contribution.ledger_verify import verify_ledger

    opened = _open_ledger(args)
    if opened is None:
        return 2
    store, run = opened
    with store:
        entries = store.list_ledger_entries(run.id)
        head = store.get_ledger_head(run.id)
    report = verify_ledger(run.id, entries, head, require_signature=False)
    text = export_ledger(run.id, entries, head, args.format, report)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"{len(entries)} entries written to {args.output}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add ``fedplat ledger verify|export``."""
    lg = sub.add_parser("ledger", help="verify or export a run's contribution ledger")
    lsub = lg.add_subparsers(dest="ledger_command", required=True)
    lv = lsub.add_parser("verify", help="check hashes, order and signatures")
    le = lsub.add_parser("export", help="write the ledger as CSV or JSON")
    for sp in (lv, le):
        sp.add_argument("--db", required=True, help="store URL or SQLite path")
        sp.add_argument("--run", required=True, help="run name or id")
    lv.add_argument(
        "--public-key",
        help="PEM of the coordinator's public key to check against "
        "(default: the key stored with the run)",
    )
    lv.add_argument(
        "--allow-unsigned", action="store_true", help="accept a ledger without key"
    )
    lv.set_defaults(func=cmd_ledger_verify)
    le.add_argument(
        "--format",
        choices=("csv", "json"),
        default="json",
        help="csv, or json with a verification report",
    )
    le.add_argument("--output", help="file to write (default: standard output)")
    le.set_defaults(func=cmd_ledger_export)
