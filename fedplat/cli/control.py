"""Operator commands through a coordinator's control API: ``fedplat runs``
(``ls``, ``show``, ``stop``, ``logs``),
``fedplat devices``, ``fedplat audit``, ``fedplat operators``, ``fedplat
whoami`` (and ``fedplat tokens`` without ``--db``). The service and the
operator's certificate come from flags or a profile
(:mod:`fedplat.control.client`); nothing here touches the database."""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedplat.cli.common import CliError


def service_flags(p: argparse.ArgumentParser) -> None:
    """``--profile``, ``--service``, ``--ca``, ``--cert``, ``--key``."""
    g = p.add_argument_group("control API (flags override the profile)")
    g.add_argument(
        "--profile",
        help="profile file (default: $FEDPLAT_PROFILE, or "
        "~/.config/fedplat/profile.yaml)",
    )
    g.add_argument("--service", help="the control API's HOST:PORT")
    g.add_argument("--ca", help="the deployment's CA certificate (PEM)")
    g.add_argument("--cert", help="your operator certificate (fedplat certs operator)")
    g.add_argument("--key", help="its private key")


def client(args: argparse.Namespace) -> Any:
    from fedplat.control.client import ControlClient, load_profile

    profile = load_profile(
        args.profile, service=args.service, ca=args.ca, cert=args.cert, key=args.key
    )
    return ControlClient(profile)


def _say(text: str) -> None:
    """Print a line of what the service answered, control characters escaped
    (a name or a target cannot move the terminal's cursor or forge a line)."""
    from fedplat.control.audit import printable

    print(printable(text, 10_000))


def _when(unix: float) -> str:
    if not unix:
        return "-"
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _run_line(r: Any) -> str:
    acc = "-" if math.isnan(r.best_accuracy) else f"{r.best_accuracy:.4f}"
    here = " (served here)" if r.served_here else ""
    return (
        f"{r.name}  {r.status:9} round {r.current_round}/{r.total_rounds}  "
        f"best {acc}  id {r.id}{here}"
    )


def cmd_runs(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    with client(args) as c:
        if args.runs_command == "ls":
            for r in c.call("ListRuns", pb.ListRunsRequest(limit=args.limit)).runs:
                _say(_run_line(r))
            return 0
        if args.runs_command == "stop":
            r = c.call(
                "StopRun", pb.StopRunRequest(run=args.id, reason=args.reason or "")
            )
            _say(
                f"run {r.name} is stopping (the coordinator ends it after its "
                "current step)"
            )
            return 0
        r = c.call("GetRun", pb.RunRef(run=args.id))
        _say(_run_line(r))
        _say(f"  started {_when(r.started_unix)}  finished {_when(r.finished_unix)}")
        if r.phase:
            _say(f"  phase {r.phase}, {r.live_clients} clients live")
        if r.reason:
            _say(f"  reason: {r.reason}")
        return 0


#: Reopens of a follower's stream after a dropped connection, in a row.
FOLLOW_RETRIES = 5


def _event_line(e: Any) -> str:
    at = _when(e.at_unix)
    where = f" round {e.round}" if e.round else ""
    who = f" {e.client}" if e.client else ""
    return f"{at} {e.level.upper():7} {e.kind}{where}{who}: {e.message}"


def cmd_logs(args: argparse.Namespace) -> int:
    """``fedplat runs logs RUN``: the run's events, oldest first; with
    ``--follow``, new ones as they come until the run ends (a stream the service
    ends after its time, or a dropped connection, is reopened where it stopped)."""
    try:
        return _follow_log(args)
    except BrokenPipeError:  # | head: the reader has what it wanted
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130


def _follow_log(args: argparse.Namespace) -> int:
    from fedplat.control.client import ControlError, pb
    from fedplat.control.logs import LOG_END, MAX_TAIL

    if not 1 <= args.tail <= MAX_TAIL:
        raise CliError(f"--tail must be 1 to {MAX_TAIL:,}")
    after, retries = 0, 0
    with client(args) as c:
        while True:
            request = pb.LogRequest(
                run=args.id,
                after_id=after,
                tail=args.tail,
                follow=args.follow,
                from_start=args.all,
            )
            trailer: dict[str, str] = {}
            try:
                for e in c.stream("StreamLog", request, trailer=trailer):
                    _say(_event_line(e))
                    after, retries = e.id, 0
                    if args.follow:
                        sys.stdout.flush()  # a follower's reader sees each line
            except ControlError as exc:
                # A follower whose connection dropped (the service restarting,
                # a network blip) reopens where it stopped, a few times.
                lost = str(exc).startswith(("UNAVAILABLE", "CANCELLED"))
                if not (args.follow and lost and retries < FOLLOW_RETRIES):
                    raise
                retries += 1
                time.sleep(2.0 * retries)
                continue
            sys.stdout.flush()
            end = trailer.get(LOG_END, "")
            if end == "time-limit":
                continue  # the service ends a stream after 50 minutes
            if end in ("closing", "interrupted"):
                why = "stopped" if end == "closing" else "is gone (run interrupted)"
                print(
                    f"fedplat: the run's coordinator {why}; the log ends here",
                    file=sys.stderr,
                )
                return 1
            return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    with client(args) as c:
        if args.devices_command == "revoke":
            d = c.call("RevokeDevice", pb.DeviceRef(run=args.run, id=args.id))
            _say(
                f"device {d.id} ({d.name}) revoked; the coordinator refuses it from "
                "its next call"
            )
            return 0
        for d in c.call("ListDevices", pb.RunRef(run=args.run)).devices:
            _say(
                f"{d.id}  {d.state:11} {d.name}  key {d.public_key_prefix or '-'}  "
                f"examples {d.num_examples}  last seen {_when(d.last_seen_unix)}"
            )
        return 0


def tokens_via_service(args: argparse.Namespace) -> int:
    """``fedplat tokens create|list|revoke`` through the control API."""
    from fedplat.control.client import pb

    with client(args) as c:
        if args.tokens_command == "create":
            made = c.call(
                "CreateTokens",
                pb.CreateTokensRequest(
                    count=args.count,
                    expires_seconds=args.expires.total_seconds(),
                    run_name=args.run or "",
                    max_examples=args.max_examples or 0,
                    note=args.note or "",
                ),
            ).tokens
            out = "".join(t.secret + "\n" for t in made)
            if args.output:
                p = Path(args.output)
                p.write_text(out)
                p.chmod(0o600)
                print(f"{len(made)} tokens written to {p}", file=sys.stderr)
            else:
                sys.stdout.write(out)
            return 0
        if args.tokens_command == "revoke":
            t = c.call("RevokeToken", pb.TokenRef(id=args.id))
            _say(f"token {t.id} {t.state}")
            return 0
        request = pb.ListTokensRequest(limit=1000, all=args.all)
        for t in c.call("ListTokens", request).tokens:
            _say(
                f"{t.id}  {t.state:8} expires {_when(t.expires_unix)}  "
                f"run {t.run_name or '*'}"
            )
        return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    with client(args) as c:
        request = pb.AuditRequest(
            limit=args.limit, refused_only=args.refused, method=args.method or ""
        )
        for e in c.call("ListAudit", request).entries:
            target = f" {e.target}" if e.target else ""
            _say(
                f"{_when(e.at_unix)}  {e.operator} ({e.role})  {e.method}{target}: "
                f"{e.result}"
            )
        return 0


def cmd_operators(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    if args.operators_command in ("unrevoke", "revoked"):
        return _operators_in_store(args)
    with client(args) as c:
        c.call(
            "RevokeOperator",
            pb.OperatorRef(fingerprint=args.fingerprint, name=args.name or ""),
        )
        _say(f"operator certificate {args.fingerprint[:16]}... revoked")
        return 0


def _operators_in_store(args: argparse.Namespace) -> int:
    """``fedplat operators revoked|unrevoke --db URL``: the store's owner lists
    or undoes revocations (e.g. after a leaked admin certificate revoked the
    others), with the database's credentials, not an operator's."""
    from fedplat.cli.admin import _open
    from fedplat.store import StoreError

    with _open(args.db) as store:
        try:
            if args.operators_command == "revoked":
                for fp, name, by in store.list_operator_revocations():
                    _say(f"{fp}  {name}  revoked by {by}")
                return 0
            done = store.unrevoke_operator(args.fingerprint)
        except StoreError as exc:
            raise CliError(str(exc)) from None
    _say(
        f"operator certificate {args.fingerprint[:16]}... accepted again"
        if done
        else f"operator certificate {args.fingerprint[:16]}... was not revoked"
    )
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    with client(args) as c:
        me = c.call("WhoAmI", pb.Empty())
        _say(f"{me.name} ({me.role}) certificate {me.fingerprint}")
        return 0


def register(sub: Any) -> None:
    """Add ``fedplat runs|devices|audit|operators|whoami``."""
    r = sub.add_parser("runs", help="runs of a coordinator (control API)")
    rsub = r.add_subparsers(dest="runs_command", required=True)
    rl = rsub.add_parser("ls", help="the runs the service's store holds, newest first")
    rl.add_argument("--limit", type=int, default=100, help="at most this many (1000)")
    rs = rsub.add_parser("show", help="one run")
    rs.add_argument("id", help="run name or id")
    rt = rsub.add_parser(
        "stop", help="end a run the coordinator serves (operator role)"
    )
    rt.add_argument("id", help="run name or id")
    rt.add_argument("--reason", help="recorded with the stop")
    for sp in (rl, rs, rt):
        service_flags(sp)
        sp.set_defaults(func=cmd_runs)
    rg = rsub.add_parser("logs", help="a run's event log, oldest first")
    rg.add_argument("id", help="run name or id")
    rg.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing new events until the run ends",
    )
    rg.add_argument(
        "--tail",
        type=int,
        default=100,
        help="start at the N-th newest event (default 100; at most 10,000)",
    )
    rg.add_argument(
        "--all", action="store_true", help="from the run's first event (not the tail)"
    )
    service_flags(rg)
    rg.set_defaults(func=cmd_logs)

    d = sub.add_parser("devices", help="a run's devices (control API)")
    dsub = d.add_subparsers(dest="devices_command", required=True)
    dl = dsub.add_parser("ls", help="the run's devices and their states")
    dr = dsub.add_parser("revoke", help="revoke a device (admin role)")
    dr.add_argument("id", help="device (client) id")
    for sp in (dl, dr):
        sp.add_argument("--run", required=True, help="run name or id")
        service_flags(sp)
        sp.set_defaults(func=cmd_devices)

    a = sub.add_parser("audit", help="the control API's audit log, newest first")
    a.add_argument("--limit", type=int, default=50, help="entries (at most 1000)")
    a.add_argument("--refused", action="store_true", help="refused calls only")
    a.add_argument("--method", help="calls of this method only (e.g. StopRun)")
    service_flags(a)
    a.set_defaults(func=cmd_audit)

    o = sub.add_parser("operators", help="operator certificates (control API)")
    osub = o.add_subparsers(dest="operators_command", required=True)
    orv = osub.add_parser("revoke", help="refuse an operator certificate (admin role)")
    orv.add_argument(
        "fingerprint", help="SHA-256 of the certificate (fedplat whoami shows it)"
    )
    orv.add_argument("--name", help="whose it is (recorded)")
    service_flags(orv)
    orv.set_defaults(func=cmd_operators)
    oun = osub.add_parser(
        "unrevoke", help="accept a revoked certificate again (in the store: --db)"
    )
    oun.add_argument("fingerprint", help="SHA-256 of the certificate")
    ols = osub.add_parser(
        "revoked", help="the revoked certificates (in the store: --db)"
    )
    for sp in (oun, ols):
        sp.add_argument("--db", required=True, help="store URL or SQLite path")
        sp.set_defaults(func=cmd_operators)

    w = sub.add_parser("whoami", help="who the control API takes you for")
    service_flags(w)
    w.set_defaults(func=cmd_whoami)
