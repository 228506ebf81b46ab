"""``fedplat sim``: many reference clients through the real round engine, in this
process or on a Ray cluster (``--backend ray``, extra ``fedplat[ray]``).

The clients train on a bundled dataset, or on the app's data when the run file
names ``data.clients`` (``fedplat.sim.client_data``); a run they cannot train is
refused before it starts (one line, exit status 2). A simulation that crashes
marks its run ``failed`` in the store and exits with status 1 after one line
(``-v`` logs the traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from fedplat.cli.common import (
    APP_DIR_HELP,
    CliError,
    add_import_paths,
    add_partition_arg,
    user_errors,
)

log = logging.getLogger("fedplat.cli")


def cmd_sim(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fedplat.server.config import load_config
    from fedplat.sim.clients import ReferencePopulation
    from fedplat.store import Store

    add_import_paths(args.app_dir)
    if args.clients < 1:
        raise CliError("--clients must be at least 1")
    if args.hosts is not None and args.hosts < 1:
        raise CliError("--hosts must be at least 1")
    if args.backend != "ray" and (args.address or args.hosts):
        raise CliError("--address and --hosts go with --backend ray")
    cfg = load_config(args.config)
    partition, pparams = args.partition
    population = ReferencePopulation.of(
        cfg, args.clients, partition=partition, partition_params=pparams
    )
    population.check()
    # Opened before the progress bar, so a bad store is a clean one-line error.
    store = None if args.backend == "ray" else Store(cfg.store.url)
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

    extra: dict[str, Any] = {}
    try:
        if store is None:
            run = _on_ray(args, cfg, population, on_round, _import_paths(args))
            res = run.result
            extra = {
                "backend": "ray",
                "hosts": run.hosts,
                "enrol_seconds": round(run.enrol_seconds, 3),
                "rounds_seconds": round(run.rounds_seconds, 3),
            }
        else:
            from fedplat.sim import simulate

            res = simulate(
                cfg, population, args.clients, on_round=on_round, store=store
            )
    except Exception as exc:  # the run is marked failed; say why on one line
        return _crashed(cfg, exc)
    finally:
        bar.close()
        if store is not None:
            store.close()
    print(
        json.dumps(
            {
                "run_id": res.run_id,
                "rounds": len(res.rounds),
                "final_accuracy": res.final_accuracy,
                "store": cfg.store.url,
                **extra,
            }
        )
    )
    return 0


def _import_paths(args: argparse.Namespace) -> list[str]:
    """What every Ray actor puts on its ``sys.path``: the app's folder and the
    working directory, as the driver does (``add_import_paths``)."""
    app = [str(Path(args.app_dir).resolve())] if args.app_dir else []
    return [*app, os.getcwd()]


def _crashed(cfg: Any, exc: Exception) -> int:
    """One line for a simulation that stopped (a user error keeps exit status
    2 through ``fedplat.cli.main``); the traceback with ``-v``."""
    cause = getattr(exc, "cause", None)  # Ray wraps errors raised in its actors
    err = cause if isinstance(cause, Exception) else exc
    if isinstance(err, user_errors()):
        raise err from None
    log.debug("the simulation crashed", exc_info=exc)
    message = " ".join(str(err).split())
    print(
        f"fedplat: run {cfg.run.name!r} failed (marked failed in {cfg.store.url}): "
        f"{type(err).__name__}: {message}",
        file=sys.stderr,
    )
    return 1


def _on_ray(
    args: argparse.Namespace,
    cfg: Any,
    population: Any,
    on_round: Any,
    import_paths: list[str],
) -> Any:
    try:
        import ray
    except ImportError:
        raise CliError("--backend ray needs Ray: pip install 'fedplat[ray]'") from None
    from fedplat.sim.ray_backend import local_ray, simulate_ray

    if args.address:
        try:
            ray.init(address=args.address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise CliError(f"cannot connect to Ray at {args.address}: {exc}") from None
    else:
        local_ray(tempfile.mkdtemp(prefix="fedplat-ray-"))
    try:
        return simulate_ray(
            cfg,
            population,
            args.clients,
            hosts=args.hosts,
            on_round=on_round,
            import_paths=import_paths,
        )
    finally:
        ray.shutdown()


def register(sub: Any) -> None:
    """Add ``fedplat sim``."""
    s = sub.add_parser(
        "sim", help="simulate N reference clients through the round engine"
    )
    s.add_argument("--config", required=True, help="run file (.toml, .yaml)")
    s.add_argument("--clients", type=int, default=10, help="simulated clients")
    s.add_argument("--app-dir", help=APP_DIR_HELP)
    add_partition_arg(s)
    s.add_argument(
        "--backend",
        choices=("inprocess", "ray"),
        default="inprocess",
        help="inprocess: every client in this process; ray: clients spread over "
        "a Ray cluster (pip install 'fedplat[ray]')",
    )
    s.add_argument(
        "--address",
        help="Ray cluster to join: 'auto' (the cluster `ray start` made on this "
        "machine) or HOST:PORT of its head; default: a local Ray on 127.0.0.1",
    )
    s.add_argument(
        "--hosts",
        type=int,
        default=None,
        help="Ray actors holding the clients, one CPU each (default: one per CPU "
        "of the cluster)",
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sim)
