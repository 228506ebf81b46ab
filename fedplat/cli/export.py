"""``fedplat export``: a run's model as safetensors, a torch state_dict or ONNX."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedplat.cli.common import APP_DIR_HELP, CliError, add_import_paths


def cmd_export(args: argparse.Namespace) -> int:
    """Write the final (or best, or given round's) model of a run to ``--out``."""
    from fedplat.export import ExportError, export_model
    from fedplat.store import Store, StoreError

    if (args.metric is not None or args.lowest) and not args.best:
        raise CliError("--metric and --lowest choose the best round: add --best")
    add_import_paths(args.app_dir)
    if "://" not in args.db and not Path(args.db).is_file():
        raise CliError(f"no store at {args.db}")
    try:
        with Store(args.db, migrate=False) as store:
            res = export_model(
                store,
                args.run,
                args.format,
                args.out,
                number=args.round,
                best=args.best,
                metric=args.metric,
                lowest=True if args.lowest else None,
            )
    except (ExportError, StoreError) as exc:
        raise CliError(str(exc)) from None
    acc = "" if res.accuracy is None else f", accuracy {res.accuracy:.4f}"
    print(
        f"run {res.run_name!r} round {res.round}{acc}: {res.num_tensors} tensors "
        f"written to {res.path} ({res.format}; checkpoint sha256 "
        f"{res.checkpoint_sha256[:16]}... verified)"
    )
    return 0


def register(sub: Any) -> None:
    """Add ``fedplat export``."""
    from fedplat.export import FORMATS

    e = sub.add_parser(
        "export",
        help="write a run's model as a file plain torch or onnxruntime loads",
        description="Export the final (default), best (--best) or a given round's "
        "model from the run's verified checkpoint.",
    )
    e.add_argument("--db", required=True, help="store URL or SQLite path")
    e.add_argument("--run", required=True, help="run name or id")
    which = e.add_mutually_exclusive_group()
    which.add_argument("--round", type=int, help="export this completed round")
    which.add_argument(
        "--best",
        action="store_true",
        help="export the best evaluated round (highest accuracy, else lowest "
        "loss; or by --metric)",
    )
    e.add_argument(
        "--metric",
        metavar="NAME",
        help="with --best: the metric that decides, e.g. eval.auc or "
        "eval.sensitivity (any the run recorded per round; the highest value "
        "wins, the lowest for names ending in loss, mae, mse or rmse)",
    )
    e.add_argument(
        "--lowest",
        action="store_true",
        help="with --best: the lowest value of the metric wins",
    )
    e.add_argument(
        "--format",
        choices=FORMATS,
        default="safetensors",
        help="safetensors (named tensors), torch (a state_dict for "
        "torch's load with weights_only=True) or onnx (needs fedplat[export])",
    )
    e.add_argument("--out", required=True, help="file to write")
    e.add_argument("--app-dir", help=APP_DIR_HELP + " (onnx rebuilds the model)")
    e.set_defaults(func=cmd_export)
