"""The ``fedplat`` command: coordinator, client, sim, demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("fedplat.cli")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _json_arg(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _partition_arg(text: str) -> tuple[str, dict[str, Any]]:
    """``iid``, ``dirichlet:0.5``, ``shards:2`` or ``label_sorted``."""
    name, _, arg = text.partition(":")
    params: dict[str, Any] = {}
    try:
        if name == "dirichlet":
            params["alpha"] = float(arg or 0.5)
        elif name == "shards":
            params["shards_per_client"] = int(arg or 2)
        elif arg:
            raise argparse.ArgumentTypeError(f"partition {name!r} takes no argument")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad partition argument: {exc}") from exc
    if name not in ("iid", "dirichlet", "shards", "label_sorted"):
        raise argparse.ArgumentTypeError(
            f"unknown partition {name!r}; "
            "use iid, dirichlet:ALPHA, shards:K, label_sorted"
        )
    return name, params


# ---------------------------------------------------------------- gossip
def _gossip_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """PeerConfig fields set on the command line (timeouts, pacing, topology)."""
    return {
        "heartbeat_s": args.heartbeat,
        "dead_after_s": args.dead_after,
        "round_timeout_s": args.round_timeout,
        "bootstrap_timeout_s": args.bootstrap_timeout,
        "linger_s": args.linger,
        "min_round_s": args.min_round_s,
        "target_degree": args.target_degree,
        "max_model_bytes": int(args.max_model_mb * 1024 * 1024),
    }


def cmd_gossip_node(args: argparse.Namespace) -> int:
    """One real gossip peer, from a scenario file or from flags."""
    import torch

    from fedplat.gossip.node import PeerConfig, PeerNode, peer_from_scenario
    from fedplat.gossip.scenario import ScenarioError, load_scenario

    torch.set_num_threads(args.threads)
    seeds = tuple(x for x in (args.seeds or "").split(",") if x)
    try:
        if args.scenario:
            node = peer_from_scenario(
                load_scenario(args.scenario),
                int(args.id),
                listen=args.listen,
                seeds=seeds,
                relay=True if args.no_data else None,
                **_gossip_overrides(args),
            )
        else:
            from fedplat.gossip.scenario import DataSpec, ModelSpec
            from fedplat.gossip.setup import build_model, load_node_data

            index = args.partition_id if args.partition_id is not None else int(args.id)
            data = load_node_data(
                DataSpec(dataset=args.dataset, partition=args.partition),
                args.num_nodes,
                args.seed,
                {index} if args.no_data else set(),
            )
            model = build_model(
                ModelSpec(name=args.model, params=args.model_params),
                data.test.input_shape,
                data.test.num_classes,
                args.seed,
            )
            cfg = PeerConfig(
                node_id=args.id,
                listen=args.listen,
                seeds=seeds,
                rounds=args.rounds,
                rule=args.rule,
                lr=args.lr,
                epochs=args.epochs,
                batch_size=args.batch_size,
                compressor=args.compressor,
                compressor_params=args.compressor_params,
                seed=args.seed,
                **_gossip_overrides(args),
            )
            node = PeerNode(cfg, model, data.train[index], data.test)
    except (ScenarioError, ValueError) as exc:
        print(f"fedplat: {exc}", file=sys.stderr)
        return 2

    def _on_signal(signum: int, frame: Any) -> None:
        node.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    try:
        node.run()
    except KeyboardInterrupt:
        return 130
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name == "fedplat.cli":
        # A peer process (``python -m fedplat.cli gossip node``, as the launcher
        # starts them) has stopped its server and closed its channels: skip the
        # interpreter's teardown, 2-3 s of CPU per process after importing torch
        # (measured here), too much when dozens of peers stop at once.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def cmd_gossip_sim(args: argparse.Namespace) -> int:
    """Run a scenario in-process, with a progress bar (optionally into a store)."""
    import torch
    from tqdm import tqdm

    from fedplat.gossip.recorder import GossipRecorder
    from fedplat.gossip.scenario import ScenarioError, load_scenario
    from fedplat.gossip.sim import GossipSimulation, RoundMetrics, RoundObserver

    torch.set_num_threads(args.threads)
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"fedplat: {exc}", file=sys.stderr)
        return 2
    observers: list[RoundObserver] = []
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

    res = GossipSimulation(scenario, observers=observers).run(on_round)
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
    store = None
    recorder = None
    if args.store:
        from fedplat.store import Store

        store = Store(args.store)
        recorder = GossipRecorder(store, args.run_name)
    try:
        launcher = ProcessLauncher(
            args.scenario, args.workdir, peer_args=peer_args, recorder=recorder
        )
    except ScenarioError as exc:
        print(f"fedplat: {exc}", file=sys.stderr)
        return 2
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


def _add_gossip_parser(sub: Any) -> None:
    g = sub.add_parser("gossip", help="peer-to-peer gossip learning (no coordinator)")
    gsub = g.add_subparsers(dest="gossip_command", required=True)

    def timing(sp: argparse.ArgumentParser) -> None:
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

    n = gsub.add_parser("node", help="one real peer (gRPC Peer service + loop)")
    n.add_argument("--id", required=True, help="peer id (node index with --scenario)")
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
    n.add_argument("--bootstrap-timeout", type=float, default=60.0)
    n.add_argument("--max-model-mb", type=float, default=64.0)
    n.add_argument("--threads", type=int, default=1, help="torch threads")
    timing(n)
    n.add_argument("--dataset", default="digits")
    n.add_argument(
        "--partition",
        default="iid",
        choices=("iid", "dirichlet", "shards", "label_sorted"),
    )
    n.add_argument(
        "--num-nodes",
        type=int,
        default=8,
        help="number of data shares (without --scenario)",
    )
    n.add_argument(
        "--partition-id", type=int, help="this peer's share (default: --id as a number)"
    )
    n.add_argument("--model", default="mlp")
    n.add_argument("--model-params", type=_json_arg, default={"hidden": [32]})
    n.add_argument("--rounds", type=int, default=20)
    n.add_argument(
        "--rule",
        default="metropolis_hastings",
        choices=("metropolis_hastings", "decavg", "uniform", "push_sum", "noloco"),
    )
    n.add_argument("--lr", type=float, default=0.1)
    n.add_argument("--epochs", type=int, default=1)
    n.add_argument("--batch-size", type=int, default=16)
    n.add_argument("--compressor", default="identity")
    n.add_argument("--compressor-params", type=_json_arg, default={})
    n.add_argument("--seed", type=int, default=0)
    n.set_defaults(func=cmd_gossip_node)

    s = gsub.add_parser("sim", help="run a scenario with in-process peers")
    s.add_argument("--scenario", required=True, help="scenario file (.yaml, .toml)")
    s.add_argument("--store", help="record the run in this store (URL or path)")
    s.add_argument("--run-name", help="run name in the store (default: scenario)")
    s.add_argument("--output", help="write a JSON summary here")
    s.add_argument("--threads", type=int, default=1, help="torch threads")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_gossip_sim)

    r = gsub.add_parser("run", help="run a scenario as real peer processes")
    r.add_argument("--scenario", required=True)
    r.add_argument("--workdir", default="runs/gossip")
    r.add_argument("--store", help="record the run in this store (URL or path)")
    r.add_argument("--run-name")
    r.add_argument("--timeout", type=float, default=600.0)
    timing(r)
    r.set_defaults(func=cmd_gossip_run)


# ---------------------------------------------------------------- coordinator
def cmd_coordinator(args: argparse.Namespace) -> int:
    from fedplat.server.app import serve
    from fedplat.server.config import load_config

    overrides: dict[str, Any] = {}
    if args.address:
        overrides.setdefault("server", {})["address"] = args.address
    if args.db:
        overrides["store"] = {"url": args.db}
    cfg = load_config(args.config, overrides=overrides)
    return serve(cfg)


# ---------------------------------------------------------------- client
def cmd_client(args: argparse.Namespace) -> int:
    from fedplat.client import Client
    from fedplat.client.reference import ReferenceSpec, reference_parts

    partition, pparams = args.partition
    spec = ReferenceSpec(
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
    parts = reference_parts(spec)
    root = Path(args.root_cert).read_bytes() if args.root_cert else None
    middleware: list[Any] = []
    if args.attack:
        from fedplat.client.byzantine import AttackLayer

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
        state_dir=args.state_dir,
        give_up_after=args.give_up_after,
        middleware=middleware,
    )

    def _on_signal(signum: int, frame: Any) -> None:
        client._stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    try:
        client.run()
    except ConnectionError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


# ---------------------------------------------------------------- sim
def cmd_sim(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fedplat.client import Client
    from fedplat.client.reference import ReferenceSpec, reference_parts
    from fedplat.server.config import load_config
    from fedplat.sim import simulate

    cfg = load_config(args.config)
    partition, pparams = args.partition
    n = args.clients

    def build(i: int, factory: Any) -> Client:
        parts = reference_parts(
            ReferenceSpec(
                dataset=cfg.data.dataset,
                model=cfg.model.name,
                model_params=cfg.model.params,
                num_partitions=n,
                partition_id=i,
                partition=partition,
                partition_params=pparams,
                seed=cfg.run.seed,
            )
        )
        return Client(
            None,
            parts.model,
            parts.train,
            num_examples=parts.num_examples,
            name=f"sim-{i}",
            connection_factory=factory,
        )

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

    res = simulate(cfg, build, n, on_round=on_round)
    bar.close()
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


# ---------------------------------------------------------------- demo
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(address: str, timeout: float) -> None:
    """Block until the coordinator's gRPC health service reports SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    end = time.monotonic() + timeout
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > end:
                raise TimeoutError(
                    f"coordinator at {address} not healthy after {timeout}s"
                )
            time.sleep(0.2)


def demo_config(
    workdir: Path,
    *,
    address: str,
    rounds: int,
    clients: int,
    dataset: str,
    model: str,
    seed: int,
) -> dict[str, Any]:
    return {
        "run": {"name": f"demo-{int(time.time())}", "rounds": rounds, "seed": seed},
        "model": {"name": model},
        "data": {"dataset": dataset},
        "selection": {
            "clients_per_round": clients,
            "min_available": clients,
            "quorum": max(1, clients - 2),
        },
        "deadlines": {"round_seconds": 300},
        "client_training": {"epochs": 2, "batch_size": 32, "lr": 0.05},
        "aggregator": {"name": "fedavg"},
        "server_optimizer": {"name": "fedavg", "lr": 1.0},
        "store": {"url": str(workdir / "fedplat.db")},
        "checkpoints": {"dir": str(workdir / "checkpoints")},
        "server": {"address": address, "insecure": True},
    }


def cmd_demo(args: argparse.Namespace) -> int:
    import yaml

    from fedplat.store import Store

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{_free_port()}"
    cfg = demo_config(
        workdir,
        address=address,
        rounds=args.rounds,
        clients=args.clients,
        dataset=args.dataset,
        model=args.model,
        seed=args.seed,
    )
    cfg_path = workdir / "demo.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    exe = [sys.executable, "-m", "fedplat.cli"]
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    procs: list[subprocess.Popen[bytes]] = []
    with (logs / "coordinator.log").open("wb") as clog:
        coord = subprocess.Popen(
            [*exe, "coordinator", "--config", str(cfg_path)],
            stdout=clog,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_healthy(address, 120)
        print(f"coordinator up at {address}; starting {args.clients} clients")
        for i in range(args.clients):
            with (logs / f"client-{i}.log").open("wb") as f:
                procs.append(
                    subprocess.Popen(
                        [
                            *exe,
                            "client",
                            "--address",
                            address,
                            "--insecure",
                            "--dataset",
                            args.dataset,
                            "--model",
                            args.model,
                            "--partition",
                            f"dirichlet:{args.alpha}",
                            "--num-partitions",
                            str(args.clients),
                            "--partition-id",
                            str(i),
                            "--seed",
                            str(args.seed),
                            "--name",
                            f"demo-client-{i}",
                            "--give-up-after",
                            "60",
                        ],
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
        store = Store(cfg["store"]["url"], migrate=False)
        run = None
        last = 0
        while coord.poll() is None:
            time.sleep(1.0)
            run = run or store.get_run_by_name(cfg["run"]["name"])
            if run is None:
                continue
            for r in store.list_rounds(run.id):
                if r.status == "completed" and r.number > last:
                    last = r.number
                    print(
                        f"round {r.number:3d}/{args.rounds}: accuracy {r.accuracy:.4f} "
                        f"({time.perf_counter() - t0:.0f}s)",
                        flush=True,
                    )
        rc = coord.returncode
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if coord.poll() is None:
            coord.terminate()
            coord.wait(timeout=30)
    seconds = time.perf_counter() - t0
    run = store.get_run_by_name(cfg["run"]["name"])
    if run is None or rc != 0:
        print(f"demo failed (coordinator exit {rc}); see {logs}", file=sys.stderr)
        return 1
    rounds = [r for r in store.list_rounds(run.id) if r.status == "completed"]
    parts = store.list_participations(run.id)
    result = {
        "dataset": args.dataset,
        "model": args.model,
        "clients": args.clients,
        "partition": f"dirichlet({args.alpha})",
        "rounds": len(rounds),
        "final_accuracy": rounds[-1].accuracy if rounds else None,
        "accuracy_per_round": [r.accuracy for r in rounds],
        "seconds": round(seconds, 1),
        "bytes_up": sum(p.bytes_up for p in parts),
        "bytes_down": sum(p.bytes_down for p in parts),
        "run_id": run.id,
        "store": cfg["store"]["url"],
    }
    store.close()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"final accuracy {result['final_accuracy']:.4f} after {len(rounds)} rounds "
        f"in {seconds:.0f}s"
    )
    print(f"results: {out}\nstore:   {cfg['store']['url']}\nlogs:    {logs}")
    return 0


# ---------------------------------------------------------------- monitor
def _die_with_parent() -> None:
    """In the Streamlit child: get SIGTERM when ``fedplat monitor`` dies.

    A monitor killed outright (SIGKILL, the OOM killer, a test's teardown) cannot
    forward a signal; without this its Streamlit server lives on as an orphan,
    holding the port. Linux only (prctl); elsewhere nothing changes.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def cmd_monitor(args: argparse.Namespace) -> int:
    """Serve the Streamlit monitor (``fedplat.ui``) on a store, read-only."""
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        print(
            "fedplat: the monitor needs the ui extra: pip install 'fedplat[ui]'",
            file=sys.stderr,
        )
        return 2
    from fedplat.ui import APP_PATH, DB_ENV, REFRESH_ENV, display_url

    db = args.db or os.environ.get(DB_ENV)
    if not db:
        print(f"fedplat: give --db URL or set {DB_ENV}", file=sys.stderr)
        return 2
    # The URL travels in the environment, not argv: a PostgreSQL password would
    # otherwise be visible to every user through ps.
    env = {**os.environ, DB_ENV: db, REFRESH_ENV: str(args.refresh)}
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.headless",
        "true",
        "--server.address",
        args.address,
        "--server.port",
        str(args.port),
        "--browser.gatherUsageStats",
        "false",
    ]
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)

    def _forward(signum: int, frame: Any) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    print(
        f"monitor on http://{args.address}:{args.port} (store {display_url(db)})",
        flush=True,
    )
    return proc.wait()


# ---------------------------------------------------------------- ledger
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
    from fedplat.contribution.keys import LedgerKeyError, load_public_key
    from fedplat.contribution.ledger import verify_run_ledger

    try:
        key = load_public_key(args.public_key) if args.public_key else None
    except LedgerKeyError as exc:
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
    from fedplat.contribution.ledger import export_ledger, verify_ledger

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


# ---------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedplat", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    _add_gossip_parser(sub)

    c = sub.add_parser("coordinator", help="serve a run defined by a config file")
    c.add_argument("--config", required=True, help="run file (.toml, .yaml)")
    c.add_argument("--address", help="override server.address")
    c.add_argument("--db", help="override store.url")
    c.set_defaults(func=cmd_coordinator)

    def add_data_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--partition",
            type=_partition_arg,
            default=("iid", {}),
            help="iid | dirichlet:ALPHA | shards:K | label_sorted",
        )

    k = sub.add_parser(
        "client", help="a reference client training on one data partition"
    )
    k.add_argument("--address", required=True)
    k.add_argument("--insecure", action="store_true", help="plaintext gRPC (no TLS)")
    k.add_argument("--root-cert", help="PEM file of the CA that signed the server cert")
    k.add_argument("--dataset", default="fashion_mnist")
    k.add_argument("--model", default="mlp")
    k.add_argument("--model-params", type=_json_arg, default={})
    add_data_args(k)
    k.add_argument("--num-partitions", type=int, default=10)
    k.add_argument("--partition-id", type=int, required=True)
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--name")
    k.add_argument("--state-dir")
    k.add_argument(
        "--attack",
        help="evaluation only: send a Byzantine update "
        "(sign_flip, gaussian, random, alie, ipm, mimic)",
    )
    k.add_argument("--attack-params", type=_json_arg, default={})
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
    s.add_argument("--config", required=True)
    s.add_argument("--clients", type=int, default=10)
    add_data_args(s)
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_sim)

    d = sub.add_parser("demo", help="coordinator + client processes on Fashion-MNIST")
    d.add_argument("--clients", type=int, default=10)
    d.add_argument("--rounds", type=int, default=20)
    d.add_argument("--alpha", type=float, default=0.5)
    d.add_argument("--dataset", default="fashion_mnist")
    d.add_argument("--model", default="mlp")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--workdir", default="runs/demo")
    d.add_argument("--output", default="bench/results/demo.json")
    d.set_defaults(func=cmd_demo)

    m = sub.add_parser("monitor", help="web monitor of a store (Streamlit, read-only)")
    m.add_argument(
        "--db", help="store URL or SQLite path (default: $FEDPLAT_MONITOR_DB)"
    )
    m.add_argument("--port", type=int, default=8501)
    m.add_argument("--address", default="127.0.0.1", help="interface to bind")
    m.add_argument(
        "--refresh", type=float, default=3.0, help="seconds between live refreshes"
    )
    m.set_defaults(func=cmd_monitor)

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
    le.add_argument("--format", choices=("csv", "json"), default="json")
    le.add_argument("--output", help="file to write (default: standard output)")
    le.set_defaults(func=cmd_ledger_export)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    from fedplat.server.config import ConfigError

    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"fedplat: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
