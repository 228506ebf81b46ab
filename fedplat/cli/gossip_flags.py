"""Command-line flags of ``fedplat gossip node`` and ``fedplat gossip run``."""

from __future__ import annotations

import argparse

from fedplat.cli.common import json_arg


def timing_flags(sp: argparse.ArgumentParser) -> None:
    """Heartbeat, liveness and round pacing of a peer."""
    sp.add_argument("--heartbeat", type=float, default=0.5, help="seconds")
    sp.add_argument(
        "--dead-after",
        type=float,
        default=3.0,
        help="silence (s) after which a neighbour counts as dead",
    )
    sp.add_argument(
        "--round-timeout",
        type=float,
        default=10.0,
        help="max seconds to wait for neighbours' models",
    )
    sp.add_argument(
        "--linger",
        type=float,
        default=5.0,
        help="keep serving this long after the last round",
    )
    sp.add_argument(
        "--min-round-s",
        type=float,
        default=0.0,
        help="pace: each round lasts at least this long",
    )


def security_flags(n: argparse.ArgumentParser) -> None:
    """Mutual TLS, membership, identity key and the bounds on what peers send."""
    sec = n.add_argument_group(
        "security",
        "peers talk mutual TLS with certificates from one CA (`fedplat certs ca` "
        "and `fedplat certs peer`), admit only the members of --membership, and "
        "sign every message with the Ed25519 key in --state-dir (see `fedplat "
        "gossip identity`)",
    )
    sec.add_argument(
        "--membership",
        required=True,
        help="membership file: id, public key (and certificate fingerprint, "
        "address) of every peer and observer",
    )
    sec.add_argument(
        "--state-dir",
        help="folder of this peer's identity key (default .fedplat/peers/ID)",
    )
    sec.add_argument("--ca", help="CA certificate (PEM) of the deployment")
    sec.add_argument("--cert", help="this peer's certificate (`fedplat certs peer`)")
    sec.add_argument("--key", help="this peer's certificate key")
    sec.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext, no TLS (signatures still checked); test hosts only",
    )
    sec.add_argument(
        "--max-clock-skew",
        type=float,
        default=120.0,
        help="seconds a signed message's timestamp may differ from this clock",
    )
    lim = n.add_argument_group("limits")
    lim.add_argument(
        "--max-model-mb",
        type=float,
        default=64.0,
        help="largest model (MiB) accepted from a peer (the layout's own bound "
        "applies below it)",
    )
    lim.add_argument(
        "--stream-idle",
        type=float,
        default=10.0,
        help="cut a model stream silent for this many seconds",
    )
    lim.add_argument(
        "--stream-deadline",
        type=float,
        default=60.0,
        help="cut a model stream lasting longer than this many seconds",
    )
    lim.add_argument(
        "--max-calls-per-peer", type=int, default=8, help="calls in flight per caller"
    )
    lim.add_argument("--max-calls", type=int, default=128, help="calls in flight")


def training_flags(n: argparse.ArgumentParser) -> None:
    """Data, model, local training and mixing of a peer without a scenario."""
    t = n.add_argument_group("data and training (without --scenario)")
    t.add_argument("--dataset", default="digits", help="bundled dataset to train on")
    t.add_argument(
        "--partition",
        default="iid",
        choices=("iid", "dirichlet", "shards", "label_sorted"),
        help="how the dataset is split over the peers",
    )
    t.add_argument("--num-nodes", type=int, default=8, help="number of data shares")
    t.add_argument(
        "--partition-id", type=int, help="this peer's share (default: --id as a number)"
    )
    t.add_argument("--model", default="mlp", help="registered model")
    t.add_argument(
        "--model-params",
        type=json_arg,
        help="model keyword arguments as a JSON object (default for --model: "
        '{"hidden": [32]}; none for --model-factory)',
    )
    t.add_argument(
        "--model-factory",
        help="the app's model, 'package.module:fn' (instead of --model)",
    )
    t.add_argument(
        "--client-data",
        help="the app's per-node data, 'package.module:fn' called as "
        "fn(index, num_nodes) -> (x, y) (instead of --dataset; needs --eval-data)",
    )
    t.add_argument(
        "--eval-data",
        help="the app's held-out data, 'package.module:fn' called as fn() -> (x, y)",
    )
    t.add_argument("--rounds", type=int, default=20, help="gossip rounds")
    t.add_argument(
        "--rule",
        default="clipped_gossip",
        help="mixing rule: clipped_gossip (default: bounds what one neighbour can "
        "do), metropolis_hastings, decavg, uniform, push_sum or noloco "
        "(fedplat.gossip.mixing.MIXING_RULES)",
    )
    t.add_argument("--lr", type=float, default=0.1, help="local learning rate")
    t.add_argument("--epochs", type=int, default=1, help="local epochs per round")
    t.add_argument("--batch-size", type=int, default=16, help="local batch size")
    t.add_argument(
        "--compressor", default="identity", help="compressor of exchanged models"
    )
    t.add_argument(
        "--compressor-params",
        type=json_arg,
        default={},
        help="compressor parameters as a JSON object",
    )
    t.add_argument("--seed", type=int, default=0, help="data split and model seed")


def app_dir_flag(sp: argparse.ArgumentParser) -> None:
    """``--app-dir``: where the plug-ins are imported from (as ``fedplat sim``)."""
    sp.add_argument(
        "--app-dir",
        help="folder to import the app's plug-ins from (model.factory, "
        "data.clients, data.eval given as 'package.module:fn'); the working "
        "directory is always importable",
    )
