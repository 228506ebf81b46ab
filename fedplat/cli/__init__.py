"""The ``fedplat`` command.

Subcommands: ``coordinator`` (serve a run), ``client`` (a reference client),
``sim`` (simulation in process or on Ray), ``demo``, ``monitor`` (the web monitor),
``ledger`` (verify or export a contribution ledger), ``gossip`` (peer-to-peer
learning), ``certs`` (a CA for TLS), ``tokens``, ``clients`` and ``store check``
(operator commands on a store), ``runs``, ``devices``, ``audit``, ``operators``
and ``whoami`` (through a coordinator's control API), ``export`` (a run's model
as a file) and ``list`` (registered names). Each lives in a module of this
package with a ``register(sub)`` function; user errors print one line and exit
with status 2.
"""

from __future__ import annotations

import argparse
import sys

from fedplat.cli import (
    admin,
    certs,
    control,
    demo,
    export,
    gossip,
    ledger,
    listing,
    monitor,
    run,
    sim,
)
from fedplat.cli.common import CliError, setup_logging, user_errors

_COMMANDS = (
    run,
    sim,
    demo,
    monitor,
    ledger,
    gossip,
    certs,
    admin,
    control,
    export,
    listing,
)
DESCRIPTION = (
    "fedplat: federated learning with a gRPC coordinator, a client SDK, "
    "in-process simulation, a web monitor of runs, a tamper-evident contribution "
    "ledger and peer-to-peer gossip learning."
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedplat", description=DESCRIPTION)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS:
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(args.func(args))
    except user_errors() as exc:
        print(f"fedplat: {exc}", file=sys.stderr)
        return 2


__all__ = ["CliError", "build_parser", "main"]
