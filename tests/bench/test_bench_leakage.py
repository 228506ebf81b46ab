"""Smoke test of bench/leakage.py: ``--tiny`` (digits) writes the schema, and the
attack behaves as Song et al. (2023) describe: gradient matching recovers the image
from a dense or a d/4-sketched update of logistic regression, DP noise defeats it.

Everything is seeded (model, sketch, DP noise), so the numbers repeat exactly.
"""

from __future__ import annotations

import itertools
import math

import pytest

from tests.support import run_bench

pytestmark = pytest.mark.integration  # starts real processes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("leakage") / "leakage.json"
    return run_bench("bench.leakage", out)


def test_schema(tiny: dict) -> None:
    assert tiny["benchmark"] == "leakage"
    assert tiny["schema_version"] == 1 and tiny["tiny"] is True
    assert tiny["image"]["dataset"] == "digits"
    assert tiny["model"]["name"] == "logreg"
    # The attacker's closed-form update is the client's real SGD step.
    assert tiny["model"]["closed_form_max_abs_error"] < 1e-6
    scenarios = [r["scenario"] for r in tiny["results"]]
    assert scenarios == [
        "uncompressed",
        "countsketch",
        "countsketch",
        "gaussian_sketch",
        "countsketch_clipped",
    ]
    for r in tiny["results"]:
        for key in ("nmse", "nmse_raw", "psnr_db", "mse", "matching_loss", "b"):
            assert isinstance(r[key], int | float) and math.isfinite(r[key]), key
        assert isinstance(r["label_recovered"], bool)
    eps = [row["epsilon"] for row in tiny["dp"]]
    assert eps == sorted(eps) and eps == tiny["setup"]["epsilons"]
    sigmas = [row["noise_multiplier"] for row in tiny["dp"]]
    assert all(a > b > 0 for a, b in itertools.pairwise(sigmas))
    for row in tiny["dp"]:
        assert len(row["trials"]) == tiny["setup"]["trials"]
        assert row["delta"] == 1e-5
    assert tiny["reference"]["zero_guess"]["nmse"] == pytest.approx(1.0)


def test_dense_and_sketched_updates_leak_the_image(tiny: dict) -> None:
    res = {(r["scenario"], r.get("reduction")): r for r in tiny["results"]}
    for key in (
        ("uncompressed", None),
        ("countsketch", 4),
        ("gaussian_sketch", 4),
        ("countsketch_clipped", 4),
    ):
        assert res[key]["nmse"] < 1e-6, key
        assert res[key]["psnr_db"] > 60.0, key
        assert res[key]["label_recovered"], key


def test_dp_noise_defeats_the_attack(tiny: dict) -> None:
    clean = tiny["results"][0]["nmse"]
    strong = tiny["dp"][0]  # epsilon = 1, one release
    assert strong["epsilon"] == 1.0
    assert strong["nmse_mean"] > 0.5 > 1e6 * clean
    # No better than guessing the dataset's mean image.
    assert strong["nmse_mean"] > tiny["reference"]["mean_image_guess"]["nmse"]
    # Error falls as epsilon grows (less noise).
    assert tiny["dp"][-1]["nmse_mean"] < strong["nmse_mean"]
