"""``fedplat coordinator``, ``fedplat client`` and ``fedplat sim``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fedplat.cli.common import (
    APP_DIR_HELP,
    PARTITION_HELP,
    CliError,
    add_import_paths,
    json_arg,
    partition_arg,
)
from fedplat.transport.errors import FedplatError

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
    cfg = load_config(args.config, overrides=overrides)
    try:
        return serve(cfg)
    except OSError as exc:  # store, checkpoint and config errors: see main()
        raise CliError(str(exc)) from None


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
    args: argparse.Namespace,
) -> tuple[bytes | None, bytes | None, bytes | None, str | None]:
    """CA, client key and certificate (mTLS), enrolment token."""
    if args.insecure and (args.root_cert or args.cert):
        raise CliError("--insecure cannot be combined with --root-cert or --cert")
    if bool(args.cert) != bool(args.key):
        raise CliError("--cert and --key go together (mutual TLS)")
    token = args.token or os.environ.get("FEDPLAT_ENROLMENT_TOKEN")
    if args.token_file:
        raw = _read(args.token_file, "token file") or b""
        token = raw.decode("utf-8", "replace").strip()
    root = _read(args.root_cert, "CA file")
    key = _read(args.key, "key file")
    chain = _read(args.cert, "certificate file")
    # gRPC reports unusable PEM files only as a connection that never comes up.
    from fedplat.security.certs import CertError, check_key_pair, load_certificates

    try:
        if root is not None:
            load_certificates(root)
    except CertError as exc:
        raise CliError(f"--root-cert {args.root_cert}: {exc}") from None
    try:
        if chain is not None and key is not None:
            check_key_pair(chain, key)
    except CertError as exc:
        raise CliError(f"--cert {args.cert} / --key {args.key}: {exc}") from None
    return root, key, chain, token or None


def cmd_sim(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fedplat.client import Client
    from fedplat.reference.clients import ReferenceSpec, reference_parts
    from fedplat.server.config import load_config
    from fedplat.server.evaluation import build_model
    from fedplat.sim import simulate
    from fedplat.store import Store

    add_import_paths(args.app_dir)
    cfg = load_config(args.config)
    partition, pparams = args.partition
    n = args.clients

    def build(i: int, factory: Any) -> Client:
        parts = reference_parts(
            ReferenceSpec(
                dataset=cfg.data.dataset,
                model=cfg.model.name or "mlp",
                model_params=cfg.model.params if cfg.model.name else {},
                num_partitions=n,
                partition_id=i,
                partition=partition,
                partition_params=pparams,
                seed=cfg.run.seed,
            )
        )
        # A model.factory run: the reference client trains the app's model on the
        # bundled dataset (its inputs must fit the model).
        model = parts.model if cfg.model.factory is None else build_model(cfg)
        return Client(
            None,
            model,
            parts.train,
            num_examples=parts.num_examples,
            name=f"sim-{i}",
            connection_factory=factory,
        )

    # Opened before the progress bar, so a bad store is a clean one-line error.
    store = Store(cfg.store.url)
    bar = tqdm(
        total=cfg.run.rounds,
        desc=f"sim {cfg.run.name}",
        unit="round",
        disable=args.no_progress,
    )

    def on_round(o: Any) -> None:
        if o.completed:
            bar.update(1)
            if o.accuracy is not None:
                bar.set_postfix(acc=f"{o.accuracy:.4f}")

    try:
        res = simulate(cfg, build, n, on_round=on_round, store=store)
    finally:
        bar.close()
        store.close()
    print(
        json.dumps(
            {
                "run_id": res.run_id,
                "rounds": len(res.rounds),
                "final_accuracy": res.final_accuracy,
                "store": cfg.store.url,
            }
        )
    )
    return 0


def _add_data_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--partition",
        type=partition_arg,
        default=("iid", {}),
        help=f"how the dataset is split over clients: {PARTITION_HELP}",
    )


def register(sub: Any) -> None:
    """Add ``fedplat coordinator``, ``fedplat client`` and ``fedplat sim``."""
    c = sub.add_parser("coordinator", help="serve a run defined by a config file")
    c.add_argument("--config", required=True, help="run file (.toml, .yaml)")
    c.add_argument("--address", help="override server.address (HOST:PORT)")
    c.add_argument("--db", help="override store.url (SQLite path or database URL)")
    c.add_argument("--app-dir", help=APP_DIR_HELP)
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
    _add_data_args(k)
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

    s = sub.add_parser(
        "sim", help="simulate N in-process clients through the round engine"
    )
    s.add_argument("--config", required=True, help="run file (.toml, .yaml)")
    s.add_argument("--clients", type=int, default=10, help="in-process clients")
    s.add_argument("--app-dir", help=APP_DIR_HELP)
    _add_data_args(s)
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sim)
