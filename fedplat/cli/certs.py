"""``fedplat certs``: a CA, server and client certificates for (mutual) TLS."""

from __future__ import annotations

import argparse
from typing import Any

from fedplat.cli.common import CliError


def cmd_certs(args: argparse.Namespace) -> int:
    from fedplat.security.certs import CA_CERT, CertError, create_ca, issue, issue_peer

    try:
        if args.certs_command == "ca":
            made = [create_ca(args.dir, name=args.cn, days=args.days)]
        elif args.certs_command == "server":
            made = [
                issue(
                    args.dir,
                    args.name,
                    server=True,
                    sans=tuple(args.san),
                    days=args.days,
                )
            ]
        elif args.certs_command == "peer":
            made = [
                issue_peer(args.dir, n, sans=tuple(args.san), days=args.days)
                for n in args.name
            ]
        elif args.certs_command == "operator":
            from fedplat.security.operators import issue_operator

            made = [issue_operator(args.dir, args.name, role=args.role, days=args.days)]
        elif args.certs_command == "client":
            names = (
                [f"{args.name}-{i}" for i in range(args.count)]
                if args.count is not None
                else [args.name]
            )
            made = [issue(args.dir, n, server=False, days=args.days) for n in names]
        else:  # init: everything a deployment needs, skipping what exists
            from pathlib import Path

            d = Path(args.dir)
            made = []
            if not (d / CA_CERT).exists():
                made.append(create_ca(d, days=args.days * 4))
            if not (d / "server.pem").exists():
                made.append(issue(d, "server", server=True, sans=tuple(args.san)))
            for i in range(args.clients):
                if not (d / f"client-{i}.pem").exists():
                    made.append(issue(d, f"client-{i}", server=False))
    except CertError as exc:
        raise CliError(str(exc)) from exc
    except OSError as exc:
        raise CliError(
            f"cannot write certificates in {args.dir}: {exc.strerror or exc}"
        ) from None
    for m in made:
        print(f"{m.cert_path}  key {m.key_path}  sha256 {m.fingerprint[:16]}")
    return 0


def register(sub: Any) -> None:
    """Add ``fedplat certs ca|server|client|peer|operator|init``."""
    c = sub.add_parser(
        "certs", help="make a CA and server/client certificates for TLS and mTLS"
    )
    csub = c.add_subparsers(dest="certs_command", required=True)
    ca = csub.add_parser("ca", help="create ca.pem and ca.key in --dir")
    ca.add_argument("--cn", default="fedplat CA", help="the CA's common name")
    srv = csub.add_parser("server", help="a server certificate signed by the CA")
    srv.add_argument("--name", default="server", help="file stem (NAME.pem, NAME.key)")
    cli = csub.add_parser("client", help="client certificate(s) signed by the CA")
    cli.add_argument("--name", default="client", help="file stem and common name")
    cli.add_argument("--count", type=int, help="make NAME-0 .. NAME-(COUNT-1)")
    peer = csub.add_parser(
        "peer",
        help="gossip peer certificate(s): server+client usage, common name = node "
        "id, DNS name ID.peer.fedplat.invalid (what other peers verify)",
    )
    peer.add_argument(
        "--name",
        action="append",
        required=True,
        help="node id (repeatable); letters, digits and '-'",
    )
    op = csub.add_parser(
        "operator",
        help="an operator's client certificate for the control API, its role "
        "signed in (viewer: read; operator: + stop runs; admin: + tokens, "
        "devices, operators)",
    )
    op.add_argument("name", help="operator name (common name and file stem)")
    op.add_argument(
        "--role",
        required=True,
        choices=("viewer", "operator", "admin"),
        help="what the holder may do through the control API",
    )
    init = csub.add_parser(
        "init", help="CA + server cert (+ --clients client certs), skipping existing"
    )
    init.add_argument("--clients", type=int, default=0, help="client certs to make")
    for sp in (srv, init, peer):
        sp.add_argument(
            "--san",
            action="append",
            default=[],
            help="DNS name or IP the server is reached at (repeatable; "
            "default localhost and 127.0.0.1)",
        )
    for sp in (ca, srv, cli, peer, op, init):
        sp.add_argument("--dir", required=True, help="folder holding the CA and certs")
        sp.add_argument("--days", type=int, default=825, help="validity in days")
        sp.set_defaults(func=cmd_certs)
