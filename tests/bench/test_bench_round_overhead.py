"""Smoke test of bench/round_overhead.py: ``--quick`` runs and writes the JSON schema.

No timing assertions: the numbers depend on the (shared) machine.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO


def _positive(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_flat_model_has_the_requested_parameter_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.round_overhead import MODEL_SPEC, flat_model
    from fedplat.models import resolve_model_factory
    from fedplat.vectors import layout_of

    model = flat_model((1, 8, 8), 10, numel=5_000)
    assert layout_of(model).numel == 5_000
    assert resolve_model_factory(MODEL_SPEC) is flat_model
    with pytest.raises(ValueError, match="numel"):
        flat_model((1, 8, 8), 10, numel=100)


@pytest.mark.integration
def test_quick_run_writes_the_schema(tmp_path: Path) -> None:
    out = tmp_path / "round_overhead.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.round_overhead", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())

    assert data["schema_version"] == 1
    assert data["quick"] is True
    machine = data["machine"]
    for key in ("cpu_count", "loadavg_at_start", "loadavg_at_end", "torch", "grpcio"):
        assert key in machine
    assert len(machine["loadavg_at_start"]) == 3
    assert "transport" in data["setup"] and "processes" in data["setup"]

    ser = data["serialization"]
    for key in (
        "encode_gbps",
        "decode_gbps",
        "memcpy_gbps",
        "numpy_copy_gbps",
        "encode_ratio_to_memcpy",
        "decode_ratio_to_memcpy",
    ):
        assert _positive(ser[key]), key
    assert ser["bytes"] == 4 * ser["params"]
    assert set(ser["stages_gbps"]) >= {"encode_dense", "sha256", "codec_decode"}

    assert isinstance(data["skipped"], list)
    assert isinstance(data["variants"], list)
    assert len(data["rounds"]) == 1, data["skipped"]
    case = data["rounds"][0]
    assert case["skipped"] is False
    for key in ("median_round_s", "p90_round_s", "effective_gbps"):
        assert _positive(case[key]), key
    assert case["p90_round_s"] >= case["median_round_s"]
    assert case["rounds_measured"] == 2
    assert case["all_rounds_complete"] is True
    assert case["bytes_per_round"] == case["clients"] * 2 * 4 * case["params"]
    # The coordinator's own per-participation byte counts agree.
    assert case["bytes_per_round_stored"] == [case["bytes_per_round"]] * 2
    timed = case["rounds"]
    # warm-up + measured + the final (evaluating) round, each with its phases.
    assert [t["number"] for t in timed] == [1, 2, 3, 4]
    for t in timed:
        assert t["round_s"] >= t["collect_s"] >= 0
        assert "phase_seconds" in t["extra"]
