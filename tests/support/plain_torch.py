"""Run a snippet in a fresh Python that cannot import fedplat: what a user without
fedplat does with an exported model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_BLOCK = """
import importlib.abc, sys
class _NoFedplat(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "fedplat" or name.startswith("fedplat."):
            raise ImportError("fedplat is blocked in this snippet")
        return None
sys.meta_path.insert(0, _NoFedplat())
for _m in [m for m in sys.modules if m == "fedplat" or m.startswith("fedplat.")]:
    del sys.modules[_m]
"""


def run_without_fedplat(code: str, cwd: Path, timeout: float = 120.0) -> str:
    """Run ``code`` with every ``fedplat`` import failing; return its stdout.

    The snippet runs from ``cwd`` (not the repository), with ``-I`` (isolated mode:
    no user site, no PYTHONPATH), so only installed packages (torch, safetensors,
    onnxruntime) are reachable; a blocked import is an error, not a fallback.
    """
    res = subprocess.run(
        [sys.executable, "-I", "-c", _BLOCK + code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if res.returncode != 0:
        raise AssertionError(f"snippet failed:\n{res.stderr[-3000:]}")
    return res.stdout
