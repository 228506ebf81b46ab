"""Run a benchmark's tiny mode in a real process and read its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.configs import REPO


def run_bench(module: str, out: Path, *args: str, timeout: float = 600) -> Any:
    """``python -m module --tiny --out out *args`` from the repository root;
    the test fails with the end of stderr if it exits non-zero."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "--tiny", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())
