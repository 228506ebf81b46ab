"""What every ``fedplat`` subcommand shares: logging, argument types, errors.

A subcommand reports a user error by raising :class:`CliError` (or one of the
domain errors of :func:`user_errors`); :func:`fedplat.cli.main` prints it as one
line on standard error and exits with status 2, never with a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any


class CliError(Exception):
    """A user error: bad flag values, a missing file, an unknown name."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The errors every command reports as one line with exit status 2: its own
    :class:`CliError`, a bad run file, a store that cannot be opened or read, and
    a checkpoint that is missing or was tampered with, and a control API call
    refused or unreachable. (Imported here, not at
    module level, so ``fedplat --help`` does not load the server.)"""
    from fedplat.control.client import ControlError
    from fedplat.server.checkpoint import CheckpointError
    from fedplat.server.config import ConfigError
    from fedplat.store import StoreError

    return (CliError, ConfigError, StoreError, CheckpointError, ControlError)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Alembic logs every migration step at INFO; a command's output is not the
    # place for schema bookkeeping.
    logging.getLogger("alembic").setLevel(logging.DEBUG if verbose else logging.WARNING)


def json_arg(text: str) -> dict[str, Any]:
    """``--x '{"k": 1}'``: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


PARTITION_HELP = "iid | dirichlet:ALPHA | shards:K | label_sorted"


def partition_arg(text: str) -> tuple[str, dict[str, Any]]:
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
            f"unknown partition {name!r}; use {PARTITION_HELP}"
        )
    return name, params


def add_partition_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--partition",
        type=partition_arg,
        default=("iid", {}),
        help=f"how the dataset is split over clients: {PARTITION_HELP}",
    )


APP_DIR_HELP = (
    "folder to import the run's plug-ins from (model.factory, data.eval, metrics "
    "given as 'package.module:fn'); the working directory is always importable"
)


def add_import_paths(app_dir: str | None) -> None:
    """Make the working directory and ``app_dir`` importable, so a run file's
    ``"package.module:fn"`` resolves without ``PYTHONPATH`` (the ``fedplat`` entry
    point, unlike ``python -m``, does not put the working directory on the path)."""
    paths = [os.getcwd()]
    if app_dir is not None:
        p = Path(app_dir)
        if not p.is_dir():
            raise CliError(f"--app-dir {app_dir} is not a directory")
        paths.insert(0, str(p.resolve()))
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
