"""What every benchmark writes the same way: the environment block and the JSON file."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["environment", "round_progress", "write_results"]


def environment(started: float, **versions: str) -> dict[str, Any]:
    """Library versions, machine and wall time since ``started`` (perf_counter)."""
    return {
        "torch": torch.__version__,
        **versions,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "wall_seconds": time.perf_counter() - started,
    }


def write_results(path: Path, results: dict[str, Any], started: float) -> None:
    """Write ``results`` as indented JSON and say where, with the run time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path} in {time.perf_counter() - started:.0f} s")


def round_progress(name: str, rounds: int) -> Callable[[Any], None]:
    """An ``on_round`` callback for ``fedplat.sim.simulate`` that prints each
    evaluated round's accuracy and the seconds since it was made to stderr."""
    t0 = time.perf_counter()

    def progress(outcome: Any) -> None:
        if outcome.accuracy is not None:
            print(
                f"[{name}] round {outcome.number}/{rounds} acc "
                f"{outcome.accuracy:.4f} ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    return progress
