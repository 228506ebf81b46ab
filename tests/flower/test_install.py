"""``pip install -e ".[flower]"`` gives one environment where fedplat and Flower
both import (issue 16): fedplat's generated protobuf code must run on the
protobuf that Flower accepts (< 7), and every pin must resolve together."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

# Both sides' protobuf code, and the simulation engine's Ray, in one interpreter.
_PROBE = """
import google.protobuf, grpc_health.v1.health_pb2
import fedplat, fedplat.proto.fedplat_pb2, fedplat.proto.peer_pb2
import fedplat.proto.fedplat_pb2_grpc, fedplat.aggregators, fedplat.flower
import flwr, flwr.serverapp.strategy, flwr.clientapp, ray
from flwr.common import Message
print(google.protobuf.__version__, flwr.__version__, ray.__version__)
"""


@pytest.mark.integration
def test_flower_extra_installs_beside_fedplat(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # torch pinned on the command line as in the project's own setup: pip takes
    # the local CPU wheel instead of resolving a CUDA build.
    install = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "-e",
            f"{REPO}[flower]",
            "torch==2.13.0",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert install.returncode == 0, install.stderr[-3000:]
    check = subprocess.run(
        [str(py), "-m", "pip", "check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout
    probe = subprocess.run(
        [str(py), "-c", _PROBE], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    protobuf, flwr, ray = probe.stdout.split()
    assert int(protobuf.split(".")[0]) < 7  # what Flower 1.41 allows
    assert flwr == "1.41.0"
    assert ray == "2.55.1"
