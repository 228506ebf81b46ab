"""Operator commands through a coordinator's control API: ``fedplat runs``,
``fedplat devices``, ``fedplat audit``, ``fedplat operators``, ``fedplat
whoami`` (and ``fedplat tokens`` without ``--db``). The service and the
operator's certificate come from flags or a profile
(:mod:`fedplat.control.client`); nothing here touches the database."""

from __future__ import annotations

import argparse
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


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
            for r in c.call("ListRuns", pb.Empty()).runs:
                print(_run_line(r))
            return 0
        if args.runs_command == "stop":
            r = c.call(
                "StopRun", pb.StopRunRequest(run=args.id, reason=args.reason or "")
            )
            print(
                f"run {r.name} is stopping (the coordinator ends it after its "
                "current step)"
            )
            return 0
        r = c.call("GetRun", pb.RunRef(run=args.id))
        print(_run_line(r))
        print(f"  started {_when(r.started_unix)}  finished {_when(r.finished_unix)}")
        if r.phase:
            print(f"  phase {r.phase}, {r.live_clients} clients live")
        if r.reason:
            print(f"  reason: {r.reason}")
        return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    with client(args) as c:
        if args.devices_command == "revoke":
            d = c.call("RevokeDevice", pb.DeviceRef(run=args.run, id=args.id))
            print(
                f"device {d.id} ({d.name}) revoked; the coordinator refuses it from "
                "its next call"
            )
            return 0
        for d in c.call("ListDevices", pb.RunRef(run=args.run)).devices:
            print(
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
            print(f"token {t.id} {t.state}")
            return 0
        for t in c.call("ListTokens", pb.Empty()).tokens:
            print(
                f"{t.id}  {t.state:8} expires {_when(t.expires_unix)}  "
                f"run {t.run_name or '*'}"
            )
        return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    with client(args) as c:
        for e in c.call("ListAudit", pb.AuditRequest(limit=args.limit)).entries:
            target = f" {e.target}" if e.target else ""
            print(
                f"{_when(e.at_unix)}  {e.operator} ({e.role})  {e.method}{target}: "
                f"{e.result}"
            )
        return 0


def cmd_operators(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    with client(args) as c:
        c.call(
            "RevokeOperator",
            pb.OperatorRef(fingerprint=args.fingerprint, name=args.name or ""),
        )
        print(f"operator certificate {args.fingerprint[:16]}... revoked")
        return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    from fedplat.control.client import pb

    with client(args) as c:
        me = c.call("WhoAmI", pb.Empty())
        print(f"{me.name} ({me.role}) certificate {me.fingerprint}")
        return 0


def register(sub: Any) -> None:
    """Add ``fedplat runs|devices|audit|operators|whoami``."""
    r = sub.add_parser("runs", help="runs of a coordinator (control API)")
    rsub = r.add_subparsers(dest="runs_command", required=True)
    rl = rsub.add_parser("ls", help="every run the service's store holds")
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

    w = sub.add_parser("whoami", help="who the control API takes you for")
    service_flags(w)
    w.set_defaults(func=cmd_whoami)
