"""Tiny run of bench/scale.py in a real process: the directions of its headline
claims hold (a round steps only the sampled clients; the root's bytes in shrink
by about the fan-in and the hierarchical model equals the flat one; the Ray
backend finishes its rounds on 2 hosts), and the JSON has its schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import REPO, run_bench

SCHEMA = {
    "simulation_10k": {"clients", "rounds", "wall_s", "peak_rss_mb"},
    "ray": {"clients_per_round", "round_s", "driver_peak_rss_mb", "worker_peak_rss_mb"},
    "hierarchical": {"fan_in", "root_ingress_reduction", "round_s", "flat_round_s"},
}


def _check_schema(out: dict) -> None:
    assert {"setup", "goals"} <= set(out)
    for part, keys in SCHEMA.items():
        assert keys <= set(out[part]), part


@pytest.mark.integration
@pytest.mark.timeout(1500)  # starts Ray, and ~20 processes' worth of clients
def test_tiny_scale_bench(tmp_path: Path) -> None:
    out = run_bench("bench.scale", tmp_path / "scale.json", timeout=1400)
    _check_schema(out)
    sim = out["simulation_10k"]
    assert sim["rounds"] == 3 and sim["clients_per_round"] * 100 == sim["clients"]
    h = out["hierarchical"]
    assert 0.95 * h["fan_in"] < h["root_ingress_reduction"] <= h["fan_in"]
    assert h["max_abs_model_diff"] <= 1e-6
    assert h["edge_summary_at_root"]["client.edge.kept"] == h["clients"]
    # Enrolment is measured (until the last client's enroll returns), so it is
    # a positive part of the wall time, never a difference that can go negative.
    assert 0 < sim["enrol_s"] < sim["wall_s"]
    r = out["ray"]
    assert r["rounds"] == 2 and r["hosts"] == 2
    assert r["worker_peak_rss_mb"] > 0 and r["driver_peak_rss_mb"] > 0
    assert r["inprocess_enrol_s"] > 0 and r["inprocess_round_s"] > 0
    # The JSON rounds the ratio to 2 decimals and the times to 3.
    assert r["speedup_vs_inprocess"] == pytest.approx(
        r["inprocess_round_s"] / r["round_s"], rel=0.01, abs=0.006
    )


def test_committed_results_have_the_schema() -> None:
    out = json.loads((REPO / "bench/results/scale.json").read_text())
    _check_schema(out)
    assert out["setup"]["tiny"] is False
    assert out["simulation_10k"]["clients"] == 10_000
    assert out["ray"]["clients_per_round"] == 1_000
    assert out["hierarchical"]["fan_in"] == 50


def test_docs_quote_the_committed_results() -> None:
    from bench.scale import markdown, readme_line

    out = json.loads((REPO / "bench/results/scale.json").read_text())
    assert markdown(out) in (REPO / "docs/scale.md").read_text()
    assert readme_line(out) in (REPO / "README.md").read_text()
