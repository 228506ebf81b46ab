"""bench/round_overhead.py: the memory model and its checks on hand-made
measurements, and the tiny mode checking the direction of its claims (every
round completes, the coordinator's peak stays within its
memory model, the payload path is measured against a memory copy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, run_bench


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package


def test_flat_model_has_the_requested_parameter_count() -> None:
    from bench.fleet import MODEL_SPEC, flat_model
    from fedplat.models import resolve_model_factory
    from fedplat.vectors import layout_of

    model = flat_model((1, 8, 8), 10, numel=5_000)
    assert layout_of(model).numel == 5_000
    assert resolve_model_factory(MODEL_SPEC) is flat_model
    with pytest.raises(ValueError, match="numel"):
        flat_model((1, 8, 8), 10, numel=100)


def test_running_sum_rows_are_capped_and_row_stack_rows_are_not() -> None:
    from bench.round_overhead import FIXED_BUFFERS, predicted_mb, rows_held

    # The coordinator's default: 8 decoding slots, so 8 scratch rows at most.
    assert rows_held("fedavg", 100) == 8 and rows_held("fedavg", 4) == 4
    assert rows_held("fedavg", 100, uploads=16) == 16
    assert rows_held("krum", 100) == 100 and rows_held("krum", 100, uploads=4) == 100
    # 100 x 10M: base + 4 bytes x 10M x (F + rows) + 100 receive windows of
    # 1 MiB (1.048576 MB).
    windows = 100 * 1.048576
    fedavg = predicted_mb(400.0, "fedavg", 100, 10_000_000)
    assert fedavg == pytest.approx(400 + 40 * (FIXED_BUFFERS["fedavg"] + 8) + windows)
    wide = predicted_mb(400.0, "fedavg", 100, 10_000_000, uploads=16)
    assert wide == pytest.approx(400 + 40 * (FIXED_BUFFERS["fedavg"] + 16) + windows)
    krum = predicted_mb(400.0, "krum", 100, 10_000_000)
    assert krum == pytest.approx(400 + 40 * (FIXED_BUFFERS["krum"] + 100) + windows)


def _rep(peak: float, client_peak: float, rounds: list[float]) -> dict[str, Any]:
    return {
        "rounds_completed": len(rounds) + 1,
        "all_clients_succeeded": True,
        "round_s": rounds,
        "wire_bytes_per_round": [1],
        "base_rss_mb": 400.0,
        "peak_rss_mb": peak,
        "client_processes": [
            {"clients": 2, "baseline_rss_mb": 300.0, "peak_rss_mb": client_peak}
        ],
    }


def test_summary_checks_peaks_against_the_model() -> None:
    from bench.round_overhead import goals, summarize

    # 10 clients x 1M, FedAvg: model 400 + 4 x (6 + 10) = 464 MB.
    ok = summarize("fedavg", 10, 1_000_000, [_rep(460.0, 316.0, [1.0, 3.0, 2.0])])
    assert ok["median_round_s"] == 2.0 and ok["p90_round_s"] == 3.0
    assert ok["effective_gbps"] == pytest.approx(10 * 8e6 / 2.0 / 1e9)
    assert ok["server_model_sized_buffers"] == pytest.approx(15.0)
    assert ok["server_within_model"] and ok["all_rounds_complete"]
    assert ok["client_model_sized_buffers"] == pytest.approx(2.0)
    assert ok["client_within_3_buffers"]
    # A peak holding every row although FedAvg needs 8: outside the model.
    over = summarize("fedavg", 100, 10_000_000, [_rep(4640.0, 700.0, [9.0])])
    assert not over["server_within_model"]
    assert not over["client_within_3_buffers"]  # 200 MB a client > 120 MB
    g = goals([ok, over])
    assert g["fedavg_100x10M_peak_rss_mb"] == 4640.0
    assert g["fedavg_100x10M_under_1.5gb_met"] is False
    assert g["krum_100x10M_under_6gb_met"] is None  # not run: neither met nor missed
    assert g["server_peaks_within_model_met"] is False
    # The client goal is judged at 10M only (at 1M a 4 MiB message is a model).
    assert g["clients_within_3_buffers_judged_at"] == [10_000_000]
    assert g["clients_within_3_buffers_met"] is False


@pytest.mark.integration
def test_tiny_run_stays_within_its_memory_model(tmp_path: Path) -> None:
    data = run_bench("bench.round_overhead", tmp_path / "ro.json", timeout=900)
    assert data["tiny"] is True
    rows = {r["rule"]: r for r in data["rounds"]}
    assert set(rows) == {"fedavg", "krum"}
    for r in rows.values():
        assert r["all_rounds_complete"] and r["rounds_measured"] == 2
        assert r["effective_gbps"] > 0 and r["median_round_s"] > 0
        # Every payload byte is on the wire, plus framing (< 1 %).
        for wire in r["wire_bytes_per_round"]:
            assert r["bytes_per_round"] <= wire <= 1.01 * r["bytes_per_round"]
        # The claim: the coordinator's peak stays within its memory model.
        assert r["server_within_model"], r
        assert r["client_model_sized_buffers"] > 0
    p = data["payload"]
    for op in ("upload_encode", "upload_decode", "download_encode", "download_decode"):
        assert p[f"{op}_ratio_to_memcpy"] > 0
    assert data["memory_model"]["server_row_stack"]["bytes_per_client_per_parameter"]
    assert len(data["setup"]["loadavg_start"]) == 3


def test_replaced_rows_take_the_place_of_their_cases(tmp_path: Path) -> None:
    import json

    from bench.round_overhead import replace_rows, summarize

    old = summarize("fedavg", 10, 1_000_000, [{"skipped": "run failed: x"}])
    keep = summarize("krum", 10, 1_000_000, [_rep(460.0, 316.0, [1.0, 2.0])])
    path = tmp_path / "ro.json"
    setup = {"runs": [{"a": 1}], "deviations": []}
    path.write_text(json.dumps({"rounds": [old, keep], "setup": setup}))
    new = summarize("fedavg", 10, 1_000_000, [_rep(450.0, 316.0, [1.0, 3.0])])
    replace_rows(path, [new], [{"b": 2}], 0.0)
    data = json.loads(path.read_text())
    assert [r.get("median_round_s") for r in data["rounds"]] == [2.0, 1.5]
    assert data["setup"]["runs"] == [{"a": 1}, {"b": 2}]
    assert "run failed: x" in data["setup"]["deviations"][0]
    assert data["goals"]["server_peaks_within_model_met"]


def test_cases_fall_back_to_light_clients_then_are_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bench.round_overhead as ro

    # 100 x 10M FedAvg: SDK clients ~15 GB, light clients ~4.2 GB.
    for free_mb, kind in (
        (100_000.0, "sdk"),
        (10_000.0, "light"),
        (3_000.0, "skipped"),
    ):
        monkeypatch.setattr(ro, "_mem_available_mb", lambda f=free_mb: f)
        got, why = ro.client_kind("fedavg", 100, 10_000_000)
        assert got == kind, why


def test_server_settings_reach_the_run_config(tmp_path: Path) -> None:
    from bench import fleet
    from bench.round_overhead import SERVER_SETTINGS

    # The coordinator's defaults (fedplat/server/config.py ServerSection).
    assert SERVER_SETTINGS["coordinator"] == {
        "max_concurrent_uploads": 8,
        "chunk_bytes": 1024 * 1024,
        "max_message_bytes": 4 * 1024 * 1024,
    }
    assert SERVER_SETTINGS["fleet"]["chunk_bytes"] == fleet.SERVER["chunk_bytes"]
    for settings in SERVER_SETTINGS.values():
        cfg = fleet.run_config(
            tmp_path, clients=2, rounds=2, numel=5_000, server=settings
        )
        assert {k: cfg["server"][k] for k in settings} == settings
        assert cfg["server"]["insecure"] is True  # the rest of fleet.SERVER kept


def test_replace_rows_keeps_one_server_setting_per_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.round_overhead import main

    out = tmp_path / "ro.json"
    out.write_text(json.dumps({"setup": {"server_settings": "coordinator"}}))
    argv = ["--out", str(out), "--replace-rows", "fedavg:10:1000000"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--server-settings", "fleet"])
    assert exc.value.code == 2
    assert (
        "--replace-rows needs --server-settings coordinator" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "none.json"), "--replace-rows", "krum:10:1"])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a subset is one or the other
        main([*argv, "--cases", "krum:10:1000000"])
    assert exc.value.code == 2 and "not allowed with" in capsys.readouterr().err
