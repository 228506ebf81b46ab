"""What every benchmark writes the same way: the environment block and the JSON file."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["environment", "write_results"]


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
