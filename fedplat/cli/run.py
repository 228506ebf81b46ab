"""``fedplat coordinator`` and ``fedplat client``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fedplat.cli.common import (
    APP_DIR_HELP,
    CliError,
    add_import_paths,
    add_partition_arg,
    json_arg,
)
from fedplat.protocol.errors import FedplatError

log = logging.getLogger("fedplat.cli")


def cmd_coordinator(args: argparse.Namespace) -> int:
    from fedplat.server.app import serve
    from fedplat.server.config import load_config

    add_import_paths(args.app_dir)
    overrides: dict[str, Any] = {}
    if args.address:
        overrides.setdefault("server", {})["address"] = args.address
    if args.db:
        overrides["store"] = {"url": args.db}
    upstream = _upstream(args)
    cfg = load_config(args.config, overrides=overrides)
    setup = None
    if upstream is not None:
        from fedplat.server.upstream import attach_upstream, check_edge_config

        check_edge_config(cfg)

        def setup(srv: Any) -> None:
            attach_upstream(srv.coord, upstream)

    try:
        code = serve(cfg, setup=setup)
    except OSError as exc:  # store, checkpoint and config errors: see main()
        raise CliError(str(exc)) from None
    print_summary(cfg.store.url, cfg.run.name)
    return code


def print_summary(db: str, run_name: str) -> None:
    """What the run came to, and the command that exports its model (stdout)."""
    from fedplat.store import Store, StoreError
    from fedplat.summary import export_command, run_summary, summary_lines
    from fedplat.ui import display_url

    try:
        with Store(db, migrate=False) as store:
            run = store.get_run_by_name(run_name)
            if run is None:
                return
            summary = run_summary(store, run.id)
    except StoreError as exc:  # the run itself is over; say why there is no summary
        log.warning("no end-of-run summary: %s", exc)
        return
    print("\n".join(summary_lines(summary)), flush=True)
    command = export_command(summary, display_url(db))
    if command is not None:
        print(f"export the final model with:\n  {command}", flush=True)


def cmd_client(args: argparse.Namespace) -> int:
    from fedplat.client import Client
    from fedplat.reference.clients import ReferenceSpec, reference_parts

    partition, pparams = args.partition
    try:
        parts = reference_parts(
            ReferenceSpec(
                label_flip=args.label_flip,
                dataset=args.dataset,
                model=args.model,
                model_params=args.model_params,
                num_partitions=args.num_partitions,
                partition_id=args.partition_id,
                partition=partition,
                partition_params=pparams,
                seed=args.seed,
            )
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    root, key, chain, token = _client_credentials(args)
    middleware: list[Any] = []
    if args.attack:
        from fedplat.reference.byzantine import AttackLayer

        log.warning(
            "client %s runs the %r attack (evaluation only)", args.name, args.attack
        )
        middleware.append(AttackLayer(args.attack, args.attack_params))
    client = Client(
        args.address,
        parts.model,
        parts.train,
        num_examples=parts.num_examples,
        name=args.name or f"client-{args.partition_id}",
        insecure=args.insecure,
        root_certificates=root,
        private_key=key,
        certificate_chain=chain,
        enrolment_token=token,
        state_dir=args.state_dir,
        give_up_after=args.give_up_after,
        middleware=middleware,
    )

    def _on_signal(signum: int, frame: Any) -> None:
        client.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    try:
        client.run()
    except ConnectionError as exc:
        log.error("%s", exc)
        return 2
    except FedplatError as exc:  # refused, revoked, TLS: logged by the client
        print(f"fedplat: {exc.reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror}") from None


def _client_credentials(
    args: argparse.Namespace, prefix: str = ""
) -> tuple[bytes | None, bytes | None, bytes | None, str | None]:
    """CA, client key and certificate (mTLS), enrolment token from the flags
    ``--[PREFIX-]insecure``, ``root-cert``, ``cert``, ``key``, ``token(-file)``."""

    def arg(name: str) -> Any:
        return getattr(args, prefix + name, None)

    def flag(name: str) -> str:
        return "--" + (prefix + name).replace("_", "-")

    if arg("insecure") and (arg("root_cert") or arg("cert")):
        raise CliError(
            f"{flag('insecure')} cannot be combined with {flag('root_cert')} "
            f"or {flag('cert')}"
        )
    if bool(arg("cert")) != bool(arg("key")):
        raise CliError(f"{flag('cert')} and {flag('key')} go together (mutual TLS)")
    token = arg("token") or (
        os.environ.get("FEDPLAT_ENROLMENT_TOKEN") if not prefix else None
    )
    if arg("token_file"):
        raw = _read(arg("token_file"), "token file") or b""
        token = raw.decode("utf-8", "replace").strip()
    root = _read(arg("root_cert"), "CA file")
    key = _read(arg("key"), "key file")
    chain = _read(arg("cert"), "certificate file")
    # gRPC reports unusable PEM files only as a connection that never comes up.
    from fedplat.security.certs import CertError, check_key_pair, load_certificates

    try:
        if root is not None:
            load_certificates(root)
    except CertError as exc:
        raise CliError(f"{flag('root_cert')} {arg('root_cert')}: {exc}") from None
    try:
        if chain is not None and key is not None:
            check_key_pair(chain, key)
    except CertError as exc:
        raise CliError(
            f"{flag('cert')} {arg('cert')} / {flag('key')} {arg('key')}: {exc}"
        ) from None
    return root, key, chain, token or None


def _upstream(args: argparse.Namespace) -> Any:
    """The edge's settings from ``--upstream*`` (None without ``--upstream``)."""
    from fedplat.server.upstream import UpstreamSettings

    given = [a for a in vars(args) if a.startswith("upstream_") and getattr(args, a)]
    if not args.upstream:
        if given:
            raise CliError(f"--{given[0].replace('_', '-')} needs --upstream")
        return None
    if not args.upstream_state_dir:
        raise CliError(
            "--upstream needs --upstream-state-dir (the edge's identity at the root)"
        )
    if not args.upstream_insecure and not args.upstream_root_cert:
        raise CliError(
            "--upstream needs --upstream-root-cert (the root's CA), or "
            "--upstream-insecure for plaintext"
        )
    margin = 5.0 if args.upstream_margin is None else args.upstream_margin
    if margin < 0:
        raise CliError("--upstream-margin must be >= 0")
    root, key, chain, token = _client_credentials(args, "upstream_")
    return UpstreamSettings(
        address=args.upstream,
        state_dir=args.upstream_state_dir,
        name=args.upstream_name or "edge",
        insecure=args.upstream_insecure,
        root_certificates=root,
        private_key=key,
        certificate_chain=chain,
        enrolment_token=token,
        margin_seconds=margin,
    )


def _add_upstream_args(c: argparse.ArgumentParser) -> None:
    g = c.add_argument_group(
        "edge of a root coordinator (hierarchical aggregation, docs/scale.md)"
    )
    g.add_argument(
        "--upstream",
        metavar="ADDR",
        help="run as an edge: aggregate this run's clients and send one update "
        "per task of the root coordinator at ADDR (HOST:PORT)",
    )
    g.add_argument(
        "--upstream-token-file", help="file holding the edge's enrolment token"
    )
    g.add_argument("--upstream-root-cert", help="PEM file of the root's CA")
    g.add_argument("--upstream-cert", help="the edge's certificate (mutual TLS)")
    g.add_argument("--upstream-key", help="the edge's private key (mutual TLS)")
    g.add_argument(
        "--upstream-insecure",
        action="store_true",
        help="plaintext gRPC to the root (no TLS)",
    )
    g.add_argument(
        "--upstream-state-dir",
        help="folder keeping the edge's identity at the root across restarts",
    )
    g.add_argument("--upstream-name", help="the edge's client name at the root")
    g.add_argument(
        "--upstream-margin",
        type=float,
        default=None,
        help="seconds before the root task's deadline at which the edge closes "
        "its round to upload in time (default 5)",
    )


def register(sub: Any) -> None:
    """Add ``fedplat coordinator`` and ``fedplat client``."""
    c = sub.add_parser("coordinator", help="serve a run defined by a config file")
    c.add_argument("--config", required=True, help="run file (.toml, .yaml)")
    c.add_argument("--address", help="override server.address (HOST:PORT)")
    c.add_argument("--db", help="override store.url (SQLite path or database URL)")
    c.add_argument("--app-dir", help=APP_DIR_HELP)
    _add_upstream_args(c)
    c.set_defaults(func=cmd_coordinator)

    k = sub.add_parser(
        "client", help="a reference client training on one data partition"
    )
    k.add_argument("--address", required=True, help="coordinator HOST:PORT")
    k.add_argument("--insecure", action="store_true", help="plaintext gRPC (no TLS)")
    k.add_argument("--root-cert", help="PEM file of the CA that signed the server cert")
    k.add_argument("--cert", help="client certificate PEM (mutual TLS)")
    k.add_argument("--key", help="client private key PEM (mutual TLS)")
    k.add_argument(
        "--token",
        help="enrolment token (prefer --token-file or $FEDPLAT_ENROLMENT_TOKEN: "
        "a token on the command line is visible to every user through ps)",
    )
    k.add_argument("--token-file", help="file holding the enrolment token")
    k.add_argument(
        "--dataset", default="fashion_mnist", help="bundled dataset to train on"
    )
    k.add_argument("--model", default="mlp", help="registered model (as the run's)")
    k.add_argument(
        "--model-params",
        type=json_arg,
        default={},
        help="model keyword arguments as a JSON object, e.g. '{\"hidden\": [64]}'",
    )
    add_partition_arg(k)
    k.add_argument(
        "--num-partitions", type=int, default=10, help="clients the data is split over"
    )
    k.add_argument(
        "--partition-id", type=int, required=True, help="this client's share, 0-based"
    )
    k.add_argument("--seed", type=int, default=0, help="partition and model seed")
    k.add_argument("--name", help="client name (default client-PARTITION_ID)")
    k.add_argument(
        "--state-dir", help="folder keeping the client's identity across restarts"
    )
    k.add_argument(
        "--attack",
        help="evaluation only: send a Byzantine update "
        "(sign_flip, gaussian, random, alie, ipm, mimic)",
    )
    k.add_argument(
        "--attack-params",
        type=json_arg,
        default={},
        help="the attack's parameters as a JSON object",
    )
    k.add_argument(
        "--label-flip",
        action="store_true",
        help="evaluation only: train on flipped labels",
    )
    k.add_argument(
        "--give-up-after",
        type=float,
        default=None,
        help="exit when the coordinator is unreachable this long (seconds)",
    )
    k.set_defaults(func=cmd_client)
