"""``fedplat gossip``: peer-to-peer learning without a coordinator."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fedplat.cli.common import CliError, add_import_paths
from fedplat.cli.gossip_flags import (
    app_dir_flag,
    security_flags,
    timing_flags,
    training_flags,
)


def _gossip_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """PeerConfig fields set on the command line (timeouts, pacing, limits)."""
    return {
        "heartbeat_s": args.heartbeat,
        "dead_after_s": args.dead_after,
        "round_timeout_s": args.round_timeout,
        "bootstrap_timeout_s": args.bootstrap_timeout,
        "linger_s": args.linger,
        "min_round_s": args.min_round_s,
        "target_degree": args.target_degree,
        "max_model_bytes": int(args.max_model_mb * 1024 * 1024),
        "stream_idle_s": args.stream_idle,
        "stream_deadline_s": args.stream_deadline,
        "max_calls_per_caller": args.max_calls_per_peer,
        "max_calls": args.max_calls,
    }


def _peer_security(args: argparse.Namespace, peers: set[str] | None) -> Any:
    from fedplat.gossip.security import load_peer_security

    state_dir = args.state_dir or Path(".fedplat") / "peers" / args.id
    return load_peer_security(
        args.id,
        membership=args.membership,
        state_dir=state_dir,
        ca=args.ca,
        cert=args.cert,
        key=args.key,
        insecure=args.insecure,
        replay_window_s=args.max_clock_skew,
        peers=peers,
    )


def _specs_from_flags(args: argparse.Namespace) -> tuple[Any, Any]:
    """The data and model of a peer without a scenario: bundled or the app's."""
    from fedplat.gossip.scenario import DataSpec, ModelSpec

    apps = [
        flag
        for flag, value in (
            ("--model-factory", args.model_factory),
            ("--eval-data", args.eval_data),
        )
        if value is not None
    ]
    if args.client_data is None and apps:
        raise CliError(
            f"{' and '.join(apps)} {'is' if len(apps) == 1 else 'are'} the app's, "
            "but no --client-data names this node's data (it would train on the "
            f"bundled {args.dataset!r}); add --client-data 'package.module:fn', "
            "called as fn(index, num_nodes) and returning node index's (x, y)"
        )
    if args.client_data is not None or args.eval_data is not None:
        data = DataSpec(clients=args.client_data, eval=args.eval_data)
    else:
        data = DataSpec(dataset=args.dataset, partition=args.partition)
    if args.model_factory is not None:
        model = ModelSpec(factory=args.model_factory, params=args.model_params or {})
    else:
        params = {"hidden": [32]} if args.model_params is None else args.model_params
        model = ModelSpec(name=args.model, params=params)
    return data, model


def _peer_from_flags(args: argparse.Namespace, seeds: tuple[str, ...]) -> Any:
    """A peer configured by flags (no scenario file)."""
    from fedplat.gossip.node import PeerConfig, PeerNode
    from fedplat.gossip.setup import load_node_data, model_for
    from fedplat.protocol.task import TrainingSettings

    index = args.partition_id if args.partition_id is not None else int(args.id)
    data_spec, model_spec = _specs_from_flags(args)
    data = load_node_data(
        data_spec,
        args.num_nodes,
        args.seed,
        {index} if args.no_data else set(),
        nodes={index},
    )
    model = model_for(model_spec, data.test, args.seed)
    cfg = PeerConfig(
        node_id=args.id,
        listen=args.listen,
        seeds=seeds,
        rounds=args.rounds,
        rule=args.rule,
        training=TrainingSettings(
            lr=args.lr, epochs=args.epochs, batch_size=args.batch_size
        ),
        compressor=args.compressor,
        compressor_params=args.compressor_params,
        seed=args.seed,
        **_gossip_overrides(args),
    )
    security = _peer_security(args, None)
    return PeerNode(cfg, model, data.train[index], data.test, security=security)


def cmd_gossip_node(args: argparse.Namespace) -> int:
    """One real gossip peer, from a scenario file or from flags."""
    # gRPC's C core logs every failed TLS handshake at INFO, one line each: a
    # stranger could fill the log. Refusals the peer decides are logged by it,
    # rate-limited. Must be set before grpc is first imported.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    import torch

    from fedplat.gossip.node import peer_from_scenario
    from fedplat.gossip.scenario import load_scenario

    torch.set_num_threads(args.threads)
    add_import_paths(args.app_dir)
    seeds = tuple(x for x in (args.seeds or "").split(",") if x)
    try:
        if args.scenario:
            scenario = load_scenario(args.scenario)
            node = peer_from_scenario(
                scenario,
                int(args.id),
                listen=args.listen,
                seeds=seeds,
                security=_peer_security(args, None),
                relay=True if args.no_data else None,
                **_gossip_overrides(args),
            )
        else:
            node = _peer_from_flags(args, seeds)
    except (ValueError, OSError) as exc:  # scenario, membership, TLS, bind errors
        raise CliError(str(exc)) from exc

    def _on_signal(signum: int, frame: Any) -> None:
        node.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    try:
        node.run()
    except KeyboardInterrupt:
        return 130
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name in (
        "fedplat.cli",
        "fedplat.cli.__main__",
    ):
        # A peer process (``python -m fedplat.cli gossip node``, as the launcher
        # starts them) has stopped its server and closed its channels: skip the
        # interpreter's teardown, 2-3 s of CPU per process after importing torch
        # (measured here), too much when dozens of peers stop at once.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def cmd_gossip_identity(args: argparse.Namespace) -> int:
    """Create (or read) a peer's identity key; print its membership entry."""
    import yaml

    from fedplat.gossip.membership import MembershipError, check_node_id
    from fedplat.gossip.security import identity_path
    from fedplat.security.certs import CertError, fingerprint
    from fedplat.security.identity import Identity
    from fedplat.security.keys import KeyFileError

    try:
        entry: dict[str, Any] = {"id": check_node_id(args.id)}
        key = Identity.load_or_create(identity_path(args.state_dir))
        entry["public_key"] = key.public_key.hex()
        if args.cert:
            entry["cert_sha256"] = fingerprint(Path(args.cert).read_bytes())
    except (MembershipError, KeyFileError, CertError, OSError) as exc:
        raise CliError(str(exc)) from exc
    if args.address:
        entry["address"] = args.address
    section = "observers" if args.observer else "members"
    print(yaml.safe_dump({section: [entry]}, sort_keys=False), end="")
    return 0


def cmd_gossip_sim(args: argparse.Namespace) -> int:
    """Run a scenario in-process, with a progress bar (optionally into a store)."""
    import torch
    from tqdm import tqdm

    from fedplat.gossip.recorder import GossipRecorder
    from fedplat.gossip.scenario import ScenarioError, load_scenario
    from fedplat.gossip.sim import GossipSimulation, RoundMetrics, RoundObserver

    torch.set_num_threads(args.threads)
    add_import_paths(args.app_dir)
    try:
        scenario = load_scenario(args.scenario)
        # Loads the data and builds the model: the app's plug-ins fail here.
        sim = GossipSimulation(scenario)
    except ScenarioError as exc:
        print(f"fedplat: {exc}", file=sys.stderr)
        return 2
    observers: list[RoundObserver] = sim.observers
    store = None
    if args.store:
        from fedplat.store import Store

        store = Store(args.store)
        observers.append(GossipRecorder(store, args.run_name))
    bar = tqdm(
        total=scenario.rounds,
        desc=f"gossip {scenario.name}",
        unit="round",
        disable=args.no_progress,
    )

    def on_round(m: RoundMetrics) -> None:
        bar.update(1)
        post = {
            "alive": m.alive,
            "comp": m.components,
            "cd": f"{m.consensus_distance:.3f}",
        }
        if m.mean_accuracy is not None:
            post["acc"] = f"{m.mean_accuracy:.4f}"
        bar.set_postfix(post)

    res = sim.run(on_round)
    bar.close()
    summary = {
        "scenario": scenario.name,
        "rounds": len(res.rounds),
        "seconds": round(res.seconds, 1),
        "final_mean_accuracy": res.final_mean_accuracy,
        "final_min_accuracy": res.final_min_accuracy,
        "components": res.final.components,
        "alive": res.final.alive,
        "consensus_distance": res.final.consensus_distance,
        "changes": [
            {"round": c.round, "kind": c.kind, **c.to_details()} for c in res.changes
        ],
        "accuracy_per_round": [m.mean_accuracy for m in res.rounds],
        "consensus_per_round": [m.consensus_distance for m in res.rounds],
    }
    if store is not None:
        summary["run_id"] = observers[0].run_id  # type: ignore[attr-defined]
        store.close()
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(summary, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: v
                for k, v in summary.items()
                if not k.endswith("_per_round") and k != "changes"
            }
        )
    )
    return 0


def cmd_gossip_run(args: argparse.Namespace) -> int:
    """Run a scenario as real peer processes on 127.0.0.1 (removal kills them)."""
    from fedplat.gossip.launcher import ProcessLauncher
    from fedplat.gossip.recorder import GossipRecorder
    from fedplat.gossip.scenario import ScenarioError

    peer_args = [
        "--heartbeat",
        str(args.heartbeat),
        "--dead-after",
        str(args.dead_after),
        "--round-timeout",
        str(args.round_timeout),
        "--linger",
        str(args.linger),
        "--min-round-s",
        str(args.min_round_s),
    ]
    add_import_paths(args.app_dir)
    store = None
    recorder = None
    if args.store:
        from fedplat.store import Store

        store = Store(args.store)
        recorder = GossipRecorder(store, args.run_name)
    try:
        launcher = ProcessLauncher(
            args.scenario,
            args.workdir,
            peer_args=peer_args,
            recorder=recorder,
            insecure=args.insecure,
            app_dir=args.app_dir,
        )
    except (ScenarioError, ValueError, OSError) as exc:  # scenario, certificates
        raise CliError(str(exc)) from exc
    print(f"starting {launcher.network.n} peers; logs in {args.workdir}")
    res = launcher.run(timeout=args.timeout)
    for m in res.rounds:
        acc = "-" if m.mean_accuracy is None else f"{m.mean_accuracy:.4f}"
        print(
            f"round {m.round:3d}: alive {m.alive}, components {m.components}, "
            f"mean accuracy {acc}, consensus {m.consensus_distance:.3f}"
        )
    print(
        json.dumps(
            {
                "seconds": round(res.seconds, 1),
                "killed": res.killed,
                "restarted": res.restarted,
                "crashed": res.crashed,
                "exit_codes": res.exit_codes,
            }
        )
    )
    if store is not None:
        store.close()
    return 1 if res.crashed else 0


def _node_parser(gsub: Any) -> None:
    n = gsub.add_parser(
        "node",
        help="one real peer (gRPC Peer service + loop), mutual TLS by default",
    )
    n.add_argument(
        "--id",
        required=True,
        help="peer id: letters, digits, '-' (node index with "
        "--scenario); the common name of its certificate",
    )
    n.add_argument("--listen", default="127.0.0.1:0", help="host:port to serve on")
    n.add_argument(
        "--seeds", help="bootstrap peers: host:port or id@host:port, comma-separated"
    )
    n.add_argument(
        "--scenario",
        help="take data, model, training, mixing and link cuts from this scenario file",
    )
    n.add_argument("--no-data", action="store_true", help="relay-only peer")
    n.add_argument(
        "--target-degree",
        type=int,
        default=0,
        help="link to peers learned from the seeds up to this many",
    )
    n.add_argument(
        "--bootstrap-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the seed peers before starting anyway",
    )
    n.add_argument("--threads", type=int, default=1, help="torch threads")
    timing_flags(n)
    security_flags(n)
    training_flags(n)
    app_dir_flag(n)
    n.set_defaults(func=cmd_gossip_node)


def register(sub: Any) -> None:
    """Add ``fedplat gossip node|identity|sim|run``."""
    g = sub.add_parser("gossip", help="peer-to-peer gossip learning (no coordinator)")
    gsub = g.add_subparsers(dest="gossip_command", required=True)
    _node_parser(gsub)

    i = gsub.add_parser(
        "identity",
        help="make (or read) a peer's Ed25519 identity key and print its "
        "membership entry",
    )
    i.add_argument("--id", required=True, help="node id")
    i.add_argument("--state-dir", required=True, help="the peer's state folder")
    i.add_argument("--cert", help="pin this certificate's fingerprint")
    i.add_argument("--address", help="pin this host:port")
    i.add_argument("--observer", action="store_true", help="an observer entry")
    i.set_defaults(func=cmd_gossip_identity)

    s = gsub.add_parser("sim", help="run a scenario with in-process peers")
    s.add_argument("--scenario", required=True, help="scenario file (.yaml, .toml)")
    s.add_argument("--store", help="record the run in this store (URL or path)")
    s.add_argument("--run-name", help="run name in the store (default: scenario)")
    s.add_argument("--output", help="write a JSON summary here")
    s.add_argument("--threads", type=int, default=1, help="torch threads")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    app_dir_flag(s)
    s.set_defaults(func=cmd_gossip_sim)

    r = gsub.add_parser(
        "run",
        help="run a scenario as real peer processes over mutual TLS (CA, "
        "certificates, identity keys and membership made in --workdir)",
    )
    r.add_argument("--scenario", required=True, help="scenario file (.yaml, .toml)")
    r.add_argument(
        "--workdir",
        default="runs/gossip",
        help="folder for peer logs, certificates, identity keys and the membership",
    )
    r.add_argument("--store", help="record the run in this store (URL or path)")
    r.add_argument("--run-name", help="run name in the store (default: scenario)")
    r.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="wall-clock limit (s) of the whole run; then every peer is stopped",
    )
    r.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext peers, no TLS (signatures still checked); test hosts only",
    )
    timing_flags(r)
    app_dir_flag(r)
    r.set_defaults(func=cmd_gossip_run)
