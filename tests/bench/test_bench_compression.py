"""Smoke test of bench/compression.py: ``--tiny`` (digits, 4 clients, 10 rounds)
runs every method through the simulator and writes the schema.

Checks the schema and what must hold whatever the accuracy: bytes come from the
store and add up, count every byte (dense sends 4 d bytes of payload plus its
header and framing per update), compressed methods send less, DP methods spend
(almost exactly) their epsilon. No accuracy or timing assertions: the tiny run is
far too short for those.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.support import REPO

pytestmark = pytest.mark.integration  # starts real processes

KEYS = {
    "method",
    "final_accuracy",
    "uplink_bytes",
    "dense_uplink_bytes",
    "compression_ratio",
    "run_compression_ratio",
    "epsilon",
}
METHODS = [
    "dense",
    "dense_fedavg",
    "dgc",
    "dgc_fp32",
    "dgc_no_momentum_correction",
    "topk_ef",
    "countsketch",
    "countsketch_dp_eps1",
    "countsketch_dp_eps4",
    "countsketch_dp_eps8",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("compression") / "compression.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compression", "--tiny", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_methods_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.compression import FULL, methods, model_layout

    layout = model_layout(FULL)
    assert layout.numel == 199_210  # MLP 784-200-200-10
    ms = {m.name: m for m in methods(FULL, layout)}
    assert list(ms) == METHODS
    dgc = ms["dgc"].compression
    assert dgc["name"] == "fp16" and dgc["params"]["inner"] == "dgc"
    inner = dgc["params"]["inner_params"]
    assert "layout" not in inner and inner["ratio"] == 0.001
    # Built as the client SDK and the coordinator build it, the DGC inside the
    # fp16 wrapper gets the model layout (so biases travel dense).
    from fedplat.compression import create_compressor

    comp = create_compressor("fp16", layout=layout, **dgc["params"])
    assert comp.inner.layout == layout
    assert ms["dgc"].warmup_rounds == 4 * FULL.warmup_rounds_per_stage
    assert (
        ms["dgc_no_momentum_correction"].compression["params"]["inner_params"][
            "momentum_correction"
        ]
        is False
    )
    assert ms["countsketch_dp_eps4"].privacy["epsilon"] == 4.0


def test_tiny_run_writes_the_schema(tiny: dict) -> None:
    assert tiny["benchmark"] == "compression"
    assert tiny["schema_version"] == 1
    assert tiny["tiny"] is True and tiny["complete"] is True
    assert [m["method"] for m in tiny["methods"]] == METHODS
    setup = tiny["setup"]
    d, rounds, clients = setup["d"], setup["rounds"], setup["clients"]
    dense_total = 4 * d * rounds * clients
    for m in tiny["methods"]:
        assert set(m) == KEYS, m["method"]
        assert 0.0 <= m["final_accuracy"] <= 1.0
        assert m["dense_uplink_bytes"] == dense_total
        assert m["uplink_bytes"] > 0
        assert m["run_compression_ratio"] == pytest.approx(
            dense_total / m["uplink_bytes"]
        )
        det = tiny["details"][m["method"]]
        assert det["rounds_completed"] == rounds
        assert det["steady_rounds"] == rounds - det["warmup_rounds"]
        codec = det["codec"]
        for key in ("encode_ms", "decode_ms", "encode_decode_MBps"):
            assert math.isfinite(codec[key]) and codec[key] > 0, key
        assert len(det["accuracy_curve"]) >= 2
    for key in ("dgc_within_1_point", "dgc_ratio_at_least_270x", "ablation_worse"):
        assert isinstance(tiny["goals"][key], bool)
    assert "load_average_at_start" in tiny["environment"]


def test_bytes_and_ratios(tiny: dict) -> None:
    rows = {m["method"]: m for m in tiny["methods"]}
    assert tiny["byte_count"] == "wire"
    d = tiny["setup"]["d"]
    for name in ("dense", "dense_fedavg"):  # 4 d bytes per update + the header
        per_upload = tiny["details"][name]["steady_bytes_per_upload"]
        assert 4 * d < per_upload < 4 * d + 4096
        assert rows[name]["uplink_bytes"] > rows[name]["dense_uplink_bytes"]
        assert 0.5 < rows[name]["compression_ratio"] < 1.0
    for name in METHODS[2:]:
        assert rows[name]["compression_ratio"] > 1.5, name
    # Warm-up rounds are denser than the steady state.
    for name in ("dgc", "dgc_fp32", "dgc_no_momentum_correction"):
        assert rows[name]["compression_ratio"] > rows[name]["run_compression_ratio"]
    # float16 values: fewer bytes than the same DGC with float32 values.
    assert rows["dgc"]["compression_ratio"] > rows["dgc_fp32"]["compression_ratio"]
    # Fixed-size payloads: the engine's own per-round metric agrees with the store.
    for name in ("dense", "countsketch", "countsketch_dp_eps1"):
        det = tiny["details"][name]
        assert det["engine_ratio_last_round"] == pytest.approx(
            rows[name]["compression_ratio"]
        )


def test_privacy(tiny: dict) -> None:
    for m in tiny["methods"]:
        det = tiny["details"][m["method"]]
        target = det["target_epsilon"]
        if target is None:
            assert m["epsilon"] is None and det["noise_multiplier"] is None
        else:
            # Calibrated by the accountant for the whole run: spent almost exactly.
            assert 0.95 * target < m["epsilon"] <= target + 1e-6
            assert det["noise_multiplier"] > 0
    sig = [
        tiny["details"][f"countsketch_dp_eps{e}"]["noise_multiplier"] for e in (1, 4, 8)
    ]
    assert sig[0] > sig[1] > sig[2]


def test_long_run(tiny: dict) -> None:
    long = tiny["long_run"]
    assert long["rounds"] == tiny["setup"]["long_rounds"]
    assert [m["method"] for m in long["methods"]] == ["dense", "dgc"]
    d = tiny["setup"]["d"]
    for m in long["methods"]:
        assert set(m) == KEYS
        assert (
            m["dense_uplink_bytes"] == 4 * d * long["rounds"] * tiny["setup"]["clients"]
        )
    assert long["seeds"] == [0, 1]
    for key, det in long["details"].items():
        assert key.split("/")[0] in ("dense", "dgc")
        assert det["rounds_completed"] == long["rounds"]
    assert len(long["details"]) == 4
    assert long["methods"][1]["compression_ratio"] > 1.5
    assert isinstance(long["goals"]["dgc_within_1_point"], bool)
    acc = long["final_accuracy_per_seed"]
    assert acc["dense"][0] == long["methods"][0]["final_accuracy"]
    gaps = long["dgc_gap_points_per_seed"]
    want = [100 * (a - b) for a, b in zip(acc["dense"], acc["dgc"], strict=True)]
    assert gaps == pytest.approx(want)
    assert long["goals"]["dgc_mean_gap_points"] == pytest.approx(sum(gaps) / 2)
    assert isinstance(long["goals"]["dgc_within_1_point_mean_over_seeds"], bool)
