"""Operator commands on a store: ``fedplat tokens`` (``--db``; without it the
control API, :mod:`fedplat.cli.control`), ``fedplat clients``, ``fedplat store
check``."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fedplat.cli.common import CliError
from fedplat.cli.control import service_flags

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_arg(text: str) -> timedelta:
    """``90s``, ``30m``, ``24h`` or ``7d``."""
    m = _DURATION.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 24h or 7d")
    return timedelta(seconds=float(m.group(1)) * _UNIT[m.group(2)])


def _open(db: str) -> Any:
    from fedplat.store import Store, StoreError

    if "://" not in db and not Path(db).is_file():
        raise CliError(f"no store at {db}")
    try:
        return Store(db, migrate=False)
    except StoreError as exc:
        raise CliError(str(exc)) from None


def _run(store: Any, name: str) -> Any:
    run = store.get_run_by_name(name) or store.get_run(name)
    if run is None:
        raise CliError(f"no run named or with id {name!r}")
    return run


def cmd_tokens(args: argparse.Namespace) -> int:
    from fedplat.store import Store, StoreError

    if args.db is None:
        from fedplat.cli.control import tokens_via_service

        return tokens_via_service(args)
    try:
        if args.tokens_command == "create":
            with Store(args.db) as store:  # creating tokens may precede any run
                made = store.create_tokens(
                    args.count,
                    expires_at=datetime.now(UTC) + args.expires,
                    run_name=args.run,
                    max_examples=args.max_examples,
                    note=args.note,
                )
            out = "\n".join(secret for _, secret in made) + "\n"
            if args.output:
                p = Path(args.output)
                p.write_text(out)
                p.chmod(0o600)
                print(f"{len(made)} tokens written to {p}", file=sys.stderr)
            else:
                sys.stdout.write(out)
            return 0
        with _open(args.db) as store:
            if args.tokens_command == "revoke":
                t = store.revoke_token(args.id)
                print(f"token {t.id} revoked")
                return 0
            now = datetime.now(UTC)
            for t in store.list_tokens():
                used = f" by {t.used_client_id}" if t.used_client_id else ""
                print(
                    f"{t.id}  {t.state(now):8} expires {t.expires_at:%Y-%m-%d %H:%M}"
                    f"  run {t.run_name or '*'}{used}"
                )
            return 0
    except StoreError as exc:
        raise CliError(str(exc)) from None


def cmd_clients(args: argparse.Namespace) -> int:
    from fedplat.store import StoreError

    with _open(args.db) as store:
        run = _run(store, args.run)
        try:
            if args.clients_command == "revoke":
                c = store.revoke_client(run.id, args.id)
                print(
                    f"client {c.id} ({c.name}) revoked; the coordinator refuses it "
                    "from its next call"
                )
                return 0
        except StoreError as exc:
            raise CliError(str(exc)) from None
        # The monitor's states (fedplat.ui.status): a finished run's clients
        # read "finished", a silent one "lost", whatever the stored row says.
        from fedplat.ui.status import client_state, run_view

        view = run_view(run, datetime.now(UTC))
        for c in store.list_clients(run.id):
            key = (c.public_key or "")[:16]
            print(
                f"{c.id}  {client_state(c, view):11} {c.name}  key {key or '-'}  "
                f"examples {c.num_examples}"
            )
    return 0


def cmd_store_check(args: argparse.Namespace) -> int:
    from fedplat.store.check import check_store

    with _open(args.db) as store:
        if args.run is not None:
            _run(store, args.run)
        problems = check_store(store, args.run)
    if not problems:
        print("store check: OK")
        return 0
    for p in problems:
        print(f"  {p}")
    print(f"store check: {len(problems)} problem(s)")
    return 1


def register(sub: Any) -> None:
    """Add ``fedplat tokens``, ``fedplat clients`` and ``fedplat store``."""
    t = sub.add_parser("tokens", help="enrolment tokens (admission mode tokens)")
    tsub = t.add_subparsers(dest="tokens_command", required=True)
    tc = tsub.add_parser("create", help="make single-use enrolment tokens")
    tc.add_argument("--count", type=int, default=1, help="how many tokens")
    tc.add_argument(
        "--expires",
        type=duration_arg,
        default=duration_arg("24h"),
        help="validity, e.g. 24h or 7d (default 24h)",
    )
    tc.add_argument("--run", help="only for the run of this name (default: any)")
    tc.add_argument(
        "--max-examples",
        type=int,
        help="cap on the aggregation weight of the client it admits",
    )
    tc.add_argument("--note", help="a note kept with the tokens")
    tc.add_argument(
        "--output",
        help="write the tokens to this file (mode 0600) instead of standard output",
    )
    tl = tsub.add_parser("list", help="tokens and their state (never the secrets)")
    tl.add_argument(
        "--all",
        action="store_true",
        help="with the control API: also used, expired and revoked tokens",
    )
    tr = tsub.add_parser("revoke", help="revoke an unused token")
    tr.add_argument("id", help="token id (the part after 'fpt1.')")
    for sp in (tc, tl, tr):
        sp.add_argument(
            "--db",
            help="store URL or SQLite path (bootstrap, or a stopped service); "
            "without it, through the control API",
        )
        service_flags(sp)
        sp.set_defaults(func=cmd_tokens)

    c = sub.add_parser("clients", help="list or revoke a run's clients")
    csub = c.add_subparsers(dest="clients_command", required=True)
    cl = csub.add_parser("list", help="the run's clients and their identities")
    cr = csub.add_parser("revoke", help="revoke a client (its session ends)")
    cr.add_argument("id", help="client id")
    for sp in (cl, cr):
        sp.add_argument("--db", required=True, help="store URL or SQLite path")
        sp.add_argument("--run", required=True, help="run name or id")
        sp.set_defaults(func=cmd_clients)

    s = sub.add_parser("store", help="check a store's invariants")
    ssub = s.add_subparsers(dest="store_command", required=True)
    sc = ssub.add_parser(
        "check",
        help="verify every closed round, counters and ledger; exit 1 on a problem",
    )
    sc.add_argument("--db", required=True, help="store URL or SQLite path")
    sc.add_argument("--run", help="one run (name or id); default every run")
    sc.set_defaults(func=cmd_store_check)
